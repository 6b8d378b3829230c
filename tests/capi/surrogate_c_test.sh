#!/usr/bin/env bash
# The C program of examples/embedded at 1, 2 and 3 ranks: trains on a split communicator (all ranks, or all but
# the last), its own messages on that communicator and on the world arrive intact between steps, the surrogate's
# held-out error falls below 0.01 and a tenth of its start, and its checkpoint reloads to the same predictions.
set -uo pipefail
binary="$1"
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/bazel/mpi_env.sh"
fail() { echo "FAIL: $*"; exit 1; }
for ranks in 1 2 3; do
  trainers=$ranks
  [ "$ranks" -ge 3 ] && trainers=$((ranks - 1))
  out=$(mpirun -np "$ranks" --oversubscribe --bind-to none "$binary" "$TEST_TMPDIR/ckpt-$ranks" 300 2>&1) ||
    fail "$ranks rank(s) exited non-zero: $out"
  grep -q "^surrogate: ranks=$ranks trainers=$trainers steps=300 mse .* checkpoint step 300$" <<<"$out" ||
    fail "$ranks rank(s): no summary: $out"
  grep -q '^surrogate: OK$' <<<"$out" || fail "$ranks rank(s): $out"
  echo "$ranks rank(s): $(grep 'mse' <<<"$out")"
done
echo "surrogate_c: all checks passed"
