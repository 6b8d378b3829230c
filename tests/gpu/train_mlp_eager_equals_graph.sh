#!/usr/bin/env bash
# The main job's CUDA graph against its eager run: 600 steps of train_mlp with --no-cuda-graph and with the graph
# (the default) must log the same losses, digit for digit. Extra arguments go to both runs; the environment (the
# GPU Linear's switches) applies to both. Run by tools/gpu_run.sh.
set -uo pipefail
B=${B:?B: the folder of the bundled binaries}
data=${DDP_GPU_DATA:?DDP_GPU_DATA: the Fashion-MNIST files}
losses() {
  mpirun -np 1 --bind-to none "$B/train_mlp" --device cuda --max-steps 600 --log-every 50 --data "$data" "$@" 2>&1 |
    grep -o "loss=[0-9.]*"
}
eager=$(losses --no-cuda-graph "$@")
graph=$(losses "$@")
echo "eager: $eager"
echo "graph: $graph"
[ -n "$eager" ] && [ "$eager" == "$graph" ]
