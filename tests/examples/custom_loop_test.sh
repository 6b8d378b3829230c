#!/usr/bin/env bash
# //examples:custom_loop end to end: on 2 ranks and on 1 it trains its own residual regressor and ends with a
# final_mse below its stated bound (exit 0); an unreachable bound makes it exit non-zero, and a bad flag ends
# every rank with one clear message.
set -uo pipefail
binary="$1"
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/test_harness.sh"
# The value of `final_mse=` in the output, which must be a number below the initial mse.
check_final() {
  local out="$1" what="$2" initial final
  initial=$(sed -n 's/^initial_mse=//p' <<<"$out")
  final=$(sed -n 's/^final_mse=//p' <<<"$out")
  [ -n "$initial" ] && [ -n "$final" ] || fail "$what: no initial_mse/final_mse line: $out"
  awk -v i="$initial" -v f="$final" 'BEGIN { exit !(f < 0.2 * i) }' || fail "$what: final_mse $final not < 0.2 x $initial"
  echo "$what: initial_mse=$initial final_mse=$final"
}

out=$(mpirun_shared 2 "$binary" --device cpu 2>&1) || fail "2 ranks exited non-zero: $out"
echo "$out"
check_final "$out" "2 ranks"
[ "$(grep -c '^final_mse=' <<<"$out")" = 1 ] || fail "final_mse should be printed by rank 0 only: $out"
grep -q '^step 50/400 loss ' <<<"$out" || fail "no loss line every 50 steps: $out"

out=$(mpirun_shared 1 "$binary" --device cpu --steps 200 2>&1) || fail "1 rank exited non-zero: $out"
check_final "$out" "1 rank"

# An unreachable bound: the run completes but the status says it did not converge enough.
if out=$(mpirun_shared 2 "$binary" --device cpu --steps 5 --max-final-ratio 0.0001 2>&1); then
  fail "a missed bound exited 0: $out"
fi
grep -q "is not below" <<<"$out" || fail "no message for a missed bound: $out"

if out=$(mpirun_shared 2 "$binary" --bogus 2>&1); then fail "a bad flag exited 0"; fi
grep -q "unknown argument '--bogus'" <<<"$out" || fail "no clear message for a bad flag: $out"
[ "$(grep -c "unknown argument" <<<"$out")" = 1 ] || fail "the bad-flag message should be printed once: $out"

if out=$(mpirun_shared 2 "$binary" --steps 0 2>&1); then fail "--steps 0 exited 0"; fi
grep -q -- "--steps: Value 0 not in range 1 to 1000000" <<<"$out" || fail "no clear message for --steps 0: $out"
if out=$(mpirun_shared 2 "$binary" --steps 10 --warmup 50 2>&1); then fail "--warmup beyond --steps exited 0"; fi
grep -q -- "--warmup 50 exceeds --steps 10" <<<"$out" || fail "no clear message for --warmup > --steps: $out"
finish custom_loop
