#!/usr/bin/env bash
# Runs a test binary as N MPI ranks on this machine: `mpi_run.sh N BINARY [ARGS...]`; N = "singleton" starts
# the binary without mpirun (Open MPI's singleton mode, a world of one).
# Used by the mpi_test macro so multi-rank tests are ordinary `bazel test` targets. More ranks than cores are
# allowed (CI has 2 cores and runs 4 ranks), and so is root (CI runs as root).
set -euo pipefail
ranks="$1"
binary="$2"
shift 2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI puts its session directory (Unix sockets, shared-memory segments) under TMPDIR, named after
# mpirun's pid. Bazel's test TMPDIR can exceed the 108-byte socket path limit, and tests run side by side in
# PID namespaces where every mpirun may have the same pid: each run gets its own short directory.
session=$(mktemp -d /tmp/ddp-mpi.XXXXXX)
trap 'rm -rf "$session"' EXIT
export TMPDIR="$session"
# Each rank writing the same gtest XML file would corrupt it; Bazel writes its own report from the exit code.
unset XML_OUTPUT_FILE GTEST_OUTPUT
if [ -n "${DDP_SANITIZER_MPI_NO_LEAKS:-}" ]; then
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
fi
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_backing_directory="$session"
if [ "$ranks" = singleton ]; then
  "$binary" "$@"
  exit
fi
mpirun -np "$ranks" --oversubscribe --bind-to none --tag-output \
  --mca btl_vader_single_copy_mechanism none \
  "$binary" "$@"
