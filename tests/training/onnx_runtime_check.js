// Runs every DIR/NAME.onnx that onnx_reference wrote in ONNX Runtime (npm's onnxruntime-node, CPU) on the inputs
// of DIR/NAME.json and compares with the runtime's own outputs there, as numpy's allclose would with
// rtol = 1e-5 and atol = 1e-5 * the case's largest |output|: |ort - ours| <= 1e-5 * (|ours| + largest). The
// absolute part is for outputs near zero, where the two GEMMs' different summation orders leave a difference
// proportional to the terms summed (the outputs' scale), not to their cancelled sum.
//
//   NODE_PATH=third_party/onnxruntime-node/node_modules node onnx_runtime_check.js DIR
'use strict';
const fs = require('fs');
const path = require('path');
const ort = require('onnxruntime-node');

const kRelative = 1e-5;

async function check(dir, name) {
  const ref = JSON.parse(fs.readFileSync(path.join(dir, name + '.json'), 'utf8'));
  const session = await ort.InferenceSession.create(path.join(dir, name + '.onnx'));
  const input = new ort.Tensor('float32', Float32Array.from(ref.input), ref.input_shape);
  const result = await session.run({input});
  const out = result.output;
  if (JSON.stringify(Array.from(out.dims)) !== JSON.stringify(ref.output_shape)) {
    throw new Error(`${name}: ONNX Runtime gives shape ${out.dims}, the runtime ${ref.output_shape}`);
  }
  const largest = ref.output.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
  let worst = 0;
  for (let i = 0; i < ref.output.length; ++i) {
    const ours = ref.output[i];
    const error = Math.abs(out.data[i] - ours) / (Math.abs(ours) + largest);
    worst = Math.max(worst, error);
    if (!(error <= kRelative)) {
      throw new Error(`${name}: output ${i} is ${out.data[i]} in ONNX Runtime and ${ours} in the runtime ` +
                      `(difference ${error.toExponential(2)} of |ours| + largest > ${kRelative})`);
    }
  }
  console.log(`onnx_runtime_check: ${name}: ${ref.output.length} outputs agree, worst difference ` +
              `${worst.toExponential(2)} of |ours| + largest`);
}

async function main() {
  const dir = process.argv[2];
  const names = fs.readdirSync(dir).filter((f) => f.endsWith('.onnx')).map((f) => f.slice(0, -5)).sort();
  if (names.length === 0) throw new Error(`no .onnx file in ${dir}: onnx_reference wrote nothing`);
  for (const name of names) await check(dir, name);
}

main().catch((e) => {
  console.error(`onnx_runtime_check: ${e.message}`);
  process.exit(1);
});
