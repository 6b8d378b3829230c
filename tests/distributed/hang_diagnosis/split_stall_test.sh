#!/usr/bin/env bash
# split_stall.cc on 4 ranks with DDP_COLLECTIVE_TIMEOUT_S=2: the report of the session on world ranks 1 and 3 names
# the rank behind and the rank waiting by both numbers, "session rank 1 (world rank 3)". Bounded by `timeout 60`.
set -uo pipefail
binary="$1"
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/test_harness.sh"
export DDP_COLLECTIVE_TIMEOUT_S=2
out=$(timeout 60 mpirun -np 4 --oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none \
  -x DDP_COLLECTIVE_TIMEOUT_S "$binary" 2>&1)
status=$?
echo "$out"
[ "$status" -ne 124 ] || fail "the job hung (killed after 60 s)"
[ "$status" -ne 0 ] || fail "the job exited 0"
waiting="session rank 0 \(world rank 1\)"
grep -qE "^error: $waiting's World::sum #[0-9]+ of 1 float64 elements \(host\) did not complete within 2 s" <<<"$out" ||
  fail "the report's first line does not name the waiting rank by both numbers"
grep -qE "^  session rank 1 \(world rank 3\) is behind: .*; $waiting waits in #[0-9]+ \(World::sum" <<<"$out" ||
  fail "the report does not name the ranks by both numbers"
finish split_stall
