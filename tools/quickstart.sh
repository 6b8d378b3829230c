#!/usr/bin/env bash
# Sets up the machine, builds, and runs the main job: train_mlp on Fashion-MNIST under ddprun, one rank per
# GPU (2 CPU ranks where there is none). Checkpoints go to runs/quickstart/<date>-<time>/, a directory of each
# run's own (a fresh run refuses a directory holding another run's checkpoints; PyTorch loads them:
# docs/checkpoints.md).
# Extra arguments go to train_mlp, e.g. `tools/quickstart.sh --epochs 2`.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
bazel build //examples:train_mlp //launcher:ddprun
run_dir="runs/quickstart/$(date +%Y%m%d-%H%M%S)"
mkdir -p runs/quickstart
echo "quickstart: checkpoints go to $run_dir"
exec bazel-bin/launcher/ddprun -- bazel-bin/examples/train_mlp --checkpoint-dir "$run_dir" "$@"
