#!/usr/bin/env bash
# examples/residual_regression on the GPU, as tests/examples/residual_regression_test.sh on the CPU: 1 rank over
# NCCL (the step a CUDA graph) and 2 ranks sharing the GPU over MPI (eager) each reach the README's test loss
# (below 0.02 after 40 epochs). Run by tools/gpu_run.sh.
set -uo pipefail
B=${B:?B: the folder of the bundled binaries}
work=$(mktemp -d)
python3 "$(dirname "$0")/../examples/make_regression.py" "$work" 8 2 4096 1024 || exit 1
status=0
for ranks in 1 2; do
  backend=()
  [ "$ranks" -gt 1 ] && backend=(-x DDP_BACKEND=mpi --oversubscribe)
  out=$(mpirun -np "$ranks" --bind-to none "${backend[@]}" "$B/residual_regression" "$work/train" "$work/test" \
    40 64 2 64 2>&1 | tr '\r' '\n')
  echo "$out" | grep -E "^(residual_regression:|final )"
  loss=$(sed -n 's/^final step=[0-9]* test_loss=\([0-9.]*\).*/\1/p' <<<"$out")
  awk -v l="${loss:-9}" 'BEGIN { exit !(l < 0.02) }' || { echo "FAIL: $ranks rank(s): test loss ${loss:-none}"; status=1; }
done
[ "$(grep -c "CUDA graph on" <<<"$(mpirun -np 1 --bind-to none "$B/residual_regression" "$work/train" "" 1 64 2 64 2>&1)")" = 1 ] ||
  { echo "FAIL: the 1-rank run did not capture its step"; status=1; }
exit $status
