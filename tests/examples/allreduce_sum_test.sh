#!/usr/bin/env bash
# //examples:allreduce_sum end to end: 4 ranks print the closed-form global sum; a bad flag and a CUDA request
# on a machine without a GPU end every rank with one clear message and a non-zero exit.
set -uo pipefail
binary="$1"
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/test_harness.sh"

out=$(mpirun_shared 4 "$binary" 2>&1) || fail "4 ranks exited non-zero: $out"
echo "$out"
grep -qx "Global sum = 17592181850112.00" <<<"$out" || fail "wrong sum on 4 ranks"

out=$(mpirun_shared 2 "$binary" --n-local 1000 2>&1) || fail "2 ranks exited non-zero: $out"
grep -qx "Global sum = 3998000.00" <<<"$out" || fail "wrong sum on 2 ranks: $out"

out=$("$binary" 2>&1) || fail "singleton exited non-zero: $out"
grep -qx "Global sum = 1099510579200.00" <<<"$out" || fail "wrong sum for a world of one: $out"

if out=$(mpirun_shared 2 "$binary" --bogus 2>&1); then fail "a bad flag exited 0"; fi
grep -q "unknown argument '--bogus'" <<<"$out" || fail "no clear message for a bad flag: $out"
[ "$(grep -c "unknown argument" <<<"$out")" = 1 ] || fail "the bad-flag message should be printed once: $out"

if [ -z "$(ls /dev/nvidia0 2>/dev/null)" ]; then
  if out=$(mpirun_shared 2 "$binary" --device cuda 2>&1); then fail "--device cuda without a GPU exited 0"; fi
  grep -q "CUDA was asked for" <<<"$out" || fail "no clear message for --device cuda: $out"
fi
finish allreduce_sum
