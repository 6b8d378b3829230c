#!/usr/bin/env bash
# tests/capi/partial_distribute.c at 2 ranks with DDP_COLLECTIVE_TIMEOUT_S=3: rank 0 distributes its model, rank 1
# does not. The job must end (bounded here by `timeout 40`) with one hang report naming the collective rank 0 waits
# in and rank 1 as the one behind, and a non-zero status.
set -uo pipefail
binary="$1"
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/test_harness.sh"
export DDP_COLLECTIVE_TIMEOUT_S=3
start=$SECONDS
out=$(timeout 40 mpirun -np 2 --oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none \
  -x DDP_COLLECTIVE_TIMEOUT_S "$binary" 2>&1)
status=$?
echo "$out"
echo "exit status $status after $((SECONDS - start)) s"
[ "$status" -ne 124 ] || fail "the job hung (killed after 40 s)"
[ "$status" -ne 0 ] || fail "the job exited 0"
grep -q "past the barrier" <<<"$out" && fail "a rank went past the barrier"
[ "$(grep -c "did not complete within 3 s (DDP_COLLECTIVE_TIMEOUT_S)" <<<"$out")" -eq 1 ] ||
  fail "not exactly one message of the collective that timed out"
grep -q "rank 0's MPI_Comm_idup (making the MPI process group) #[0-9]* (host) did not complete" <<<"$out" ||
  fail "the report does not name the collective rank 0 waits in"
grep -qE "rank 1 is behind: last collective #[0-9]+ .*; rank 0 waits in #[0-9]+ \(MPI_Comm_idup" <<<"$out" ||
  fail "the report does not name rank 1 as behind"
finish partial_distribute
