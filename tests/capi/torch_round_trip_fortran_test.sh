#!/usr/bin/env bash
# The Fortran side of the PyTorch round trip: torch_round_trip.f90, compiled by mpifort with the module
# (capi/ddp.f90) against the runtime's shared library, builds each model of torch_round_trip_test.sh from its
# JSON on 2 ranks, loads PyTorch's weights and gives PyTorch's outputs to 1e-5.
set -uo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
work_f="$TEST_TMPDIR/fortran"
mkdir -p "$work_f/lib"
cp "$root/libddp.so" "$work_f/lib/"
if ! (cd "$work_f" && mpifort -O2 -o torch_round_trip_f "$root/capi/ddp.f90" "$root/tests/capi/torch_round_trip.f90" \
  -L"$work_f/lib" -Wl,-rpath,"$work_f/lib" -lddp) >"$work_f/build.log" 2>&1; then
  cat "$work_f/build.log"
  echo "FAIL: mpifort"
  exit 1
fi
exec "$root/tests/capi/torch_round_trip_test.sh" none "$work_f/torch_round_trip_f"
