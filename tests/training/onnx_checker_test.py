#!/usr/bin/python3
"""ONNX's own Python checker (Debian's python3-onnx, tools/setup.sh) with full shape inference on every model
onnx_reference exports, and the inferred output shape against the runtime's output.

  onnx_checker_test.py PATH/TO/onnx_reference
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

try:
    import onnx
except ImportError:
    sys.exit("onnx_checker_test: the onnx module is missing: run tools/setup.sh (it installs python3-onnx)")


def main():
    reference = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as tmp:
        subprocess.run([reference, tmp], check=True, capture_output=True)
        paths = sorted(glob.glob(os.path.join(tmp, "*.onnx")))
        assert len(paths) >= 6, f"onnx_reference wrote {paths}"
        for path in paths:
            name = os.path.basename(path)
            model = onnx.load(path)
            onnx.checker.check_model(model, full_check=True)  # raises ValidationError naming the node
            onnx.checker.check_model(path)
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
            assert [i.name for i in model.graph.input] == ["input"], name
            assert [o.name for o in model.graph.output] == ["output"], name
            with open(path[:-len(".onnx")] + ".json") as f:
                ref = json.load(f)
            dims = inferred.graph.output[0].type.tensor_type.shape.dim
            assert dims[0].dim_param == "N", (name, dims)
            assert dims[1].dim_value == ref["output_shape"][1], (name, dims, ref["output_shape"])
            in_dims = model.graph.input[0].type.tensor_type.shape.dim
            assert in_dims[1].dim_value == ref["input_shape"][1], (name, in_dims, ref["input_shape"])
            print(f"onnx_checker_test: {name}: valid (opset {model.opset_import[0].version}, "
                  f"{len(model.graph.node)} nodes)")


if __name__ == "__main__":
    main()
