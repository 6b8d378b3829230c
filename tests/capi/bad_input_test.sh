#!/usr/bin/env bash
# tests/capi/bad_input.c at 2 ranks (and at 1 with MPI_Init's thread level): every bad call gets its code and a
# message naming the problem, and the program runs to its end (under --config=asan too).
set -uo pipefail
binary="$1"
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/test_harness.sh"
out=$(mpirun_shared 2 "$binary" 2>&1) || fail "2 ranks: $out"
grep -q '^bad_input: OK$' <<<"$out" || fail "2 ranks: $out"
echo "$out" | grep -c '^ok ' | sed 's/^/checks passed on rank 0: /'
out=$(mpirun -np 1 --bind-to none "$binary" single 2>&1) || fail "single: $out"
grep -q '^bad_input single: OK$' <<<"$out" || fail "single: $out"
grep '^ok session at a low' <<<"$out" || echo "(this MPI gave MPI_THREAD_MULTIPLE to MPI_Init: nothing to refuse)"
finish bad_input
