#!/usr/bin/env bash
# Sets up the machine, builds, and runs the main job on this machine's GPUs (CPU ranks where there is none).
# For now the main job is the global-sum example on 4 ranks; the training example replaces it.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
bazel build //examples:allreduce_sum
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec mpirun -np 4 --oversubscribe --bind-to none bazel-bin/examples/allreduce_sum "$@"
