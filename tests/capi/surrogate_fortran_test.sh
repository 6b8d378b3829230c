#!/usr/bin/env bash
# The Fortran program of examples/embedded, compiled by mpifort with the module (capi/ddp.f90) against the
# runtime's shared library, at 1, 2 and 3 ranks: trains on a split communicator while its own messages on that
# communicator and on the world arrive intact, the held-out error falls below 0.01 and a tenth of its start,
# and the checkpoint reloads to the same predictions.
set -uo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
source "$root/tests/test_harness.sh"
source "$root/tests/capi/surrogate_checks.sh"
work="$TEST_TMPDIR/fortran"
mkdir -p "$work/lib"
cp "$root/libddp.so" "$work/lib/"
(cd "$work" && mpifort -O2 -o surrogate_f "$root/capi/ddp.f90" "$root/examples/embedded/surrogate.f90" \
  -L"$work/lib" -Wl,-rpath,"$work/lib" -lddp) >"$work/build.log" 2>&1 || { cat "$work/build.log"; fail "mpifort"; finish surrogate_f; }
check_surrogate surrogate_f "$work/surrogate_f"
