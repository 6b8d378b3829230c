#!/usr/bin/env bash
# //examples:residual_regression, a residual LayerNorm GELU network on .npy data through the Trainer, on 1 and 2
# CPU ranks under ddprun: it reaches the test loss the README states (below 0.02 after 40 epochs; a linear model
# stays near 0.2) at both world sizes, and the program stays at most 80 lines.
set -uo pipefail
ddprun="$1"
program="$2"
source_file="$3"
generator="$4"
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/test_harness.sh"
work="$session/residual"
/usr/bin/python3 "$generator" "$work" 8 2 4096 1024 || fail "could not write the data"

lines=$(wc -l <"$source_file")
[ "$lines" -le 80 ] || fail "examples/residual_regression.cc has $lines lines; the README promises at most 80"
for ranks in 1 2; do
  out=$("$ddprun" -np "$ranks" -- "$program" "$work/train" "$work/test" 40 64 2 64 2>&1 | tr '\r' '\n')
  echo "$out" | grep -E "residual_regression:|test_loss" | tail -3
  loss=$(sed -n 's/^\[rank 0\] final step=[0-9]* test_loss=\([0-9.]*\).*/\1/p' <<<"$out")
  awk -v l="${loss:-9}" 'BEGIN { exit !(l < 0.02) }' || fail "$ranks rank(s): final test loss '${loss:-none}' not below 0.02"
  grep -q "ResidualBlock\|Sequential ([0-9]* parameters)" <<<"$out" || fail "$ranks rank(s): the run's first line does not name the model"
done
finish residual_regression
