#!/usr/bin/env python3
"""The models onnx_reference wrote from the GPU (onnx_reference DIR cuda) in the GPU machine's Python ONNX Runtime,
against the runtime's own outputs on the GPU, with tests/training/onnx_runtime_check.js's tolerance:
|ort - ours| <= 1e-5 * (|ours| + the case's largest |output|).

  python3 tests/gpu/onnx_runtime_check.py DIR
"""
import glob
import json
import os
import sys

import numpy as np
import onnxruntime as ort

RELATIVE = 1e-5


def check(path):
    name = os.path.basename(path)[: -len(".onnx")]
    ref = json.load(open(path[: -len(".onnx")] + ".json"))
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    x = np.asarray(ref["input"], dtype=np.float32).reshape(ref["input_shape"])
    (out,) = session.run(["output"], {"input": x})
    if list(out.shape) != ref["output_shape"]:
        sys.exit(f"{name}: ONNX Runtime gives shape {list(out.shape)}, the runtime {ref['output_shape']}")
    ours = np.asarray(ref["output"], dtype=np.float64).reshape(out.shape)
    error = np.abs(out - ours) / (np.abs(ours) + np.abs(ours).max())
    if not np.all(error <= RELATIVE):
        i = int(np.argmax(error))
        sys.exit(f"{name}: output {i} is {out.flat[i]} in ONNX Runtime and {ours.flat[i]} on the GPU "
                 f"(difference {error.flat[i]:.2e} of |ours| + largest > {RELATIVE})")
    print(f"onnx_runtime_check: {name}: {out.size} outputs agree, worst {error.max():.2e} (onnxruntime {ort.__version__})")


paths = sorted(glob.glob(os.path.join(sys.argv[1], "*.onnx")))
if not paths:
    sys.exit(f"no .onnx file in {sys.argv[1]}: onnx_reference wrote nothing")
for p in paths:
    check(p)
