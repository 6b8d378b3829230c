#!/usr/bin/env bash
# //examples:halo_exchange on 1, 2 and 4 CPU ranks: the plate split across ranks, its boundary rows exchanged
# every step, ends bitwise equal to the one-rank result (max_abs_diff=0), with the same total heat whatever the
# number of ranks; a bad flag and too many ranks for the rows end every rank with one message.
set -uo pipefail
binary="$1"
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/test_harness.sh"

heat=""
for ranks in 1 2 4; do
  # 61 rows: an uneven split (16, 15, 15, 15 on 4 ranks).
  out=$(mpirun_shared "$ranks" "$binary" --device cpu --rows 61 --cols 40 --steps 120 --log-every 40 2>&1) ||
    fail "$ranks rank(s) exited non-zero: $out"
  grep -q "^halo_exchange: ranks=$ranks device=cpu backend=mpi plate=63x42 steps=120$" <<<"$out" ||
    fail "$ranks rank(s): no first line: $out"
  grep -q '^max_abs_diff=0 (against the one-rank result)$' <<<"$out" || fail "$ranks rank(s) differ from one rank: $out"
  this=$(sed -n 's/^step 120 total_heat //p' <<<"$out")
  [ -n "$this" ] || fail "$ranks rank(s): no total heat at step 120: $out"
  # The same plate, summed in another order (per rank, then over ranks).
  [ -z "$heat" ] || awk -v a="$this" -v b="$heat" 'BEGIN { d = a - b; exit !(d < 1e-6 && d > -1e-6) }' ||
    fail "$ranks rank(s): total heat $this, but $heat on 1 rank"
  heat="$this"
  echo "$ranks rank(s): total heat $this at step 120, max_abs_diff=0"
done

if out=$(mpirun_shared 2 "$binary" --bogus 2>&1); then fail "a bad flag exited 0"; fi
[ "$(grep -c -- "--bogus" <<<"$out")" = 1 ] || fail "no single message for a bad flag: $out"
if out=$(mpirun_shared 4 "$binary" --device cpu --rows 3 2>&1); then fail "3 rows on 4 ranks exited 0"; fi
grep -q "gives some of the 4 ranks no row" <<<"$out" || fail "no message for more ranks than rows: $out"
finish halo_exchange
