#!/usr/bin/env bash
# Runs a test binary as N MPI ranks on this machine: `mpi_run.sh N BINARY [ARGS...]`; N = "singleton" starts
# the binary without mpirun (Open MPI's singleton mode, a world of one).
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
mpirun -np "$ranks" --oversubscribe --bind-to none --tag-output \
  --mca btl_vader_single_copy_mechanism none \
  "$binary" "$@"
