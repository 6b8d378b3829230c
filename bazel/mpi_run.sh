#!/usr/bin/env bash
# Runs a test binary as N MPI ranks on this machine: `mpi_run.sh N BINARY [ARGS...]`; N = "singleton" starts
# the binary without mpirun (Open MPI's singleton mode, a world of one); N = "gpus" starts one rank per GPU of
# this node over NCCL (the multigpu tests), and skips, saying so, where the node has fewer than two: NCCL cannot
# put two ranks on one GPU, and one rank would test nothing the one-GPU jobs do not.
# Used by the mpi_test macro so multi-rank tests are ordinary `bazel test` targets. More ranks than cores are
# allowed (CI has 2 cores and runs 4 ranks), and so is root (CI runs as root).
set -euo pipefail
ranks="$1"
binary="$2"
shift 2
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/bazel/mpi_env.sh"
# Each rank writing the same gtest XML file would corrupt it; Bazel writes its own report from the exit code.
unset XML_OUTPUT_FILE GTEST_OUTPUT
if [ "$ranks" = singleton ]; then
  "$binary" "$@"
  exit
fi
if [ "$ranks" = gpus ]; then
  ranks=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  if [ "${ranks:-0}" -lt 2 ]; then
    echo "SKIPPED: $(basename "$binary") over NCCL needs a node with two or more GPUs; this one has ${ranks:-0}"
    exit 0
  fi
  export DDP_BACKEND=nccl NCCL_NVLS_ENABLE=0  # NVLink multicast stays off on shared hosts
  echo "one rank per GPU: $ranks ranks over NCCL"
fi
mpirun -np "$ranks" --oversubscribe --bind-to none --tag-output \
  --mca btl_vader_single_copy_mechanism none \
  "$binary" "$@"
