#!/usr/bin/env bash
# //examples:in_situ_surrogate on 2 and 4 CPU ranks in both layouts: the surrogate's error on solver states it
# has not seen falls below the bound of docs/embedding.md (0.35 relative RMS, the program's default --max-error),
# and a bad layout ends with one message.
set -uo pipefail
binary="$1"
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/test_harness.sh"
for ranks in 2 4; do
  for layout in all split; do
    out=$(mpirun_shared "$ranks" "$binary" --layout "$layout" --steps 600 2>&1) ||
      fail "$layout on $ranks ranks: $out"
    grep -q "^in_situ_surrogate: layout=$layout ranks=$ranks " <<<"$out" || fail "$layout on $ranks ranks: $out"
    error=$(sed -n 's/^final_rel_error=\([0-9.]*\) .*/\1/p' <<<"$out")
    first=$(sed -n 's/^step 100 surrogate_rel_error //p' <<<"$out")
    [ -n "$error" ] && [ -n "$first" ] || fail "$layout on $ranks ranks: no errors printed: $out"
    echo "$layout on $ranks ranks: relative error $first at step 100, $error at the end"
  done
done
if out=$(mpirun -np 2 --oversubscribe "$binary" --layout diagonal 2>&1); then fail "a bad layout exited 0"; fi
grep -q "diagonal" <<<"$out" || fail "no message for a bad layout: $out"
finish in_situ_surrogate
