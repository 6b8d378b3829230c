# Sourced (not run) by the tests of examples/embedded's surrogate programs (C and Fortran), which print the same
# lines, after tests/test_harness.sh. check_surrogate LABEL PROGRAM [ARGS...]: the program at 1, 2 and 3 ranks
# (at 3, all but the last rank train) with a checkpoint path of its own for each, then its summary and verdict
# lines; `finish LABEL` with the tally.
check_surrogate() {
  local label="$1" program="$2" ranks trainers out
  shift 2
  for ranks in 1 2 3; do
    trainers=$ranks
    [ "$ranks" -ge 3 ] && trainers=$((ranks - 1))
    out=$(mpirun_shared "$ranks" "$program" "$TEST_TMPDIR/ckpt-$ranks" "$@" 2>&1) ||
      fail "$ranks rank(s) exited non-zero: $out"
    grep -q "^$label: ranks=$ranks trainers=$trainers steps=300 mse .* checkpoint step 300$" <<<"$out" ||
      fail "$ranks rank(s): no summary: $out"
    grep -q "^$label: OK$" <<<"$out" || fail "$ranks rank(s): $out"
    echo "$ranks rank(s): $(grep 'mse' <<<"$out")"
  done
  finish "$label"
}
