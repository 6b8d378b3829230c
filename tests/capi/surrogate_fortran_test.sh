#!/usr/bin/env bash
# The Fortran program of examples/embedded, compiled by mpifort with the module (capi/ddp.f90) against the
# runtime's shared library, at 1, 2 and 3 ranks: trains on a split communicator while its own messages on that
# communicator and on the world arrive intact, the held-out error falls below 0.01 and a tenth of its start,
# and the checkpoint reloads to the same predictions.
set -uo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
source "$root/bazel/mpi_env.sh"
fail() { echo "FAIL: $*"; exit 1; }
work="$TEST_TMPDIR/fortran"
mkdir -p "$work/lib"
cp "$root/libddp.so" "$work/lib/"
(cd "$work" && mpifort -O2 -o surrogate_f "$root/capi/ddp.f90" "$root/examples/embedded/surrogate.f90" \
  -L"$work/lib" -Wl,-rpath,"$work/lib" -lddp) >"$work/build.log" 2>&1 || { cat "$work/build.log"; fail "mpifort"; }
for ranks in 1 2 3; do
  trainers=$ranks
  [ "$ranks" -ge 3 ] && trainers=$((ranks - 1))
  out=$(mpirun -np "$ranks" --oversubscribe --bind-to none "$work/surrogate_f" "$TEST_TMPDIR/ckpt-$ranks" 2>&1) ||
    fail "$ranks rank(s) exited non-zero: $out"
  grep -q "^surrogate_f: ranks=$ranks trainers=$trainers steps=300 mse .* checkpoint step 300$" <<<"$out" ||
    fail "$ranks rank(s): no summary: $out"
  grep -q '^surrogate_f: OK$' <<<"$out" || fail "$ranks rank(s): $out"
  echo "$ranks rank(s): $(grep 'mse' <<<"$out")"
done
echo "surrogate_fortran: all checks passed"
