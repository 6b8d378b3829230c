#!/usr/bin/env bash
# The exported models in ONNX Runtime (npm's onnxruntime-node, CPU), against the runtime's own outputs.
# tools/setup.sh installs onnxruntime-node into third_party/onnxruntime-node/node_modules; the test finds that
# folder through the real path of its package.json (a runfile), since Bazel's sandbox has no copy of it.
#
#   onnx_runtime_test.sh PATH/TO/onnx_reference PATH/TO/onnx_runtime_check.js PATH/TO/package.json
set -euo pipefail

reference=$1
check=$2
folder=$(dirname "$(readlink -f "$3")")

if [ ! -d "$folder/node_modules/onnxruntime-node" ]; then
  if [ -f "$folder/npm-unreachable" ]; then
    echo "onnx_runtime_test: SKIPPED: tools/setup.sh could not reach the npm registry to install onnxruntime-node" \
         "($(cat "$folder/npm-unreachable")); rerun tools/setup.sh where npm is reachable."
    exit 0
  fi
  echo "onnx_runtime_test: onnxruntime-node is not installed in $folder/node_modules: run tools/setup.sh" >&2
  exit 1
fi
if ! command -v node >/dev/null; then
  echo "onnx_runtime_test: node is not on PATH: install Node.js 18 or newer (onnxruntime-node runs on it)" >&2
  exit 1
fi

out="${TEST_TMPDIR:-$(mktemp -d)}/onnx_runtime"
rm -rf "$out" && mkdir -p "$out"
"$reference" "$out" >/dev/null
# ORT_DISABLE_TELEMETRY: ONNX Runtime's usage telemetry has nothing to report from a test.
ORT_DISABLE_TELEMETRY=1 NODE_PATH="$folder/node_modules" node "$check" "$out"
