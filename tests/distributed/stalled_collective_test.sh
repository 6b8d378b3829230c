#!/usr/bin/env bash
# A stalled collective ends every rank, within seconds of the deadline, with a message naming the rank, the
# collective, the bucket and the step, and a non-zero exit.
set -uo pipefail
binary="$1"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Under --config=asan, Open MPI's own allocations are not leaks of ours (see .bazelrc).
[ -n "${DDP_SANITIZER_MPI_NO_LEAKS:-}" ] && export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
TMPDIR=$(mktemp -d /tmp/ddp-mpi.XXXXXX)
export TMPDIR OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_backing_directory="$TMPDIR"
trap 'rm -rf "$TMPDIR"' EXIT
start=$(date +%s)
out=$(DDP_COLLECTIVE_TIMEOUT_S=2 mpirun -np 3 --oversubscribe --bind-to none -x DDP_COLLECTIVE_TIMEOUT_S "$binary" 2>&1)
status=$?
elapsed=$(( $(date +%s) - start ))
echo "$out"
echo "exit status $status after ${elapsed}s"
[ "$status" -ne 0 ] || { echo "FAIL: the job exited 0"; exit 1; }
grep -qE "rank [01]: fatal: rank [01]'s MPI_Allreduce of 4160 float32 elements \(mpi\) for bucket 0 of 1 \(16 KiB\) in backward 1 did not complete within 2 s" <<<"$out" \
  || { echo "FAIL: no watchdog message naming rank, collective, bucket and step"; exit 1; }
[ "$elapsed" -lt 30 ] || { echo "FAIL: the job took ${elapsed}s to end after a 2 s deadline"; exit 1; }
echo "stalled collective: job ended in ${elapsed}s"
