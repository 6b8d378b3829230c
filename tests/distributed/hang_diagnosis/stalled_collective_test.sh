#!/usr/bin/env bash
# A stalled collective ends every rank, within seconds of the deadline, with a message naming the rank, the
# collective, the bucket and the step, and the rank that is behind, and a non-zero exit. (hang_report_test.sh
# covers a stall in each phase.)
set -uo pipefail
binary="$1"
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/bazel/mpi_env.sh"
start=$(date +%s)
out=$(DDP_COLLECTIVE_TIMEOUT_S=2 mpirun -np 3 --oversubscribe --bind-to none -x DDP_COLLECTIVE_TIMEOUT_S "$binary" 2>&1)
status=$?
elapsed=$(( $(date +%s) - start ))
echo "$out"
echo "exit status $status after ${elapsed}s"
[ "$status" -ne 0 ] || { echo "FAIL: the job exited 0"; exit 1; }
grep -qE "^error: rank [01]'s MPI_Allreduce #4 of 4160 float32 elements \(mpi\) for bucket 0 of 1 \(16 KiB\) in backward 1 did not complete within 2 s \(DDP_COLLECTIVE_TIMEOUT_S\); the job is ended. Where the ranks are:$" <<<"$out" \
  || { echo "FAIL: no watchdog message naming rank, collective, bucket and step"; exit 1; }
grep -qE "^  rank 2 is behind: last collective #3 \(MPI_Comm_idup \(making the MPI process group\), step 0\), in user code for [0-9.]+ s; ranks 0,1 wait in #4 \(MPI_Allreduce of 4160 float32, bucket 0 of 1, step 1\)$" <<<"$out" \
  || { echo "FAIL: the report does not say that rank 2 is behind and where"; exit 1; }
[ "$elapsed" -lt 30 ] || { echo "FAIL: the job took ${elapsed}s to end after a 2 s deadline"; exit 1; }
echo "stalled collective: job ended in ${elapsed}s"
