#!/usr/bin/env bash
# //examples:minimal, docs/api.md's first loop, on 2 CPU ranks under ddprun: one epoch of Fashion-MNIST reaches
# a test accuracy above 0.8 (0.849 measured) and exits 0; the program stays at most 45 lines, and docs/api.md
# shows it as it is.
set -uo pipefail
ddprun="$1"
minimal="$2"
source_file="$3"
api_page="$4"
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/test_harness.sh"
fail() { echo "FAIL: $*"; exit 1; }

shown_as_is "$api_page" "$source_file"

lines=$(wc -l <"$source_file")
[ "$lines" -le 45 ] || fail "examples/minimal.cc has $lines lines; docs/api.md promises at most 45"
out=$("$ddprun" -np 2 -- "$minimal" 2>&1) || fail "exited non-zero: $out"
echo "$out"
grep -q '^\[rank 0\] step 400 loss [0-9.]*$' <<<"$out" || fail "no loss line at step 400"
acc=$(sed -n 's/^\[rank 0\] test accuracy //p' <<<"$out")
awk -v a="${acc:-0}" 'BEGIN { exit !(a > 0.8) }' || fail "test accuracy '$acc' not above 0.8"
[ "$(grep -c 'test accuracy' <<<"$out")" = 1 ] || fail "the accuracy should be printed by rank 0 only"
echo "minimal: $lines lines, test accuracy $acc"
