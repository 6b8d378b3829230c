#!/usr/bin/env bash
# The in-situ example on the GPU (solver, samples, replay buffer and training in device memory): at 1 rank over
# NCCL, at 2 ranks sharing the GPU over MPI in both layouts (the two-stream halo exchange between the ranks'
# device arrays), each below the error bound; and the plate each GPU run computed is the CPU run's, to the
# last printed digit (the kernels share the host's cell code and do not fuse multiply-adds). The GPU runs train
# on a thread of their own (--training-thread auto); one run without it prints the same errors. --device auto
# takes the GPU for one rank and the CPU for two ranks that would have to share it. Prints each run's wall time
# beside the CPU's. Run by tools/gpu_run.sh.
set -uo pipefail
B=${B:?B: the folder of the bundled binaries}
source "$(dirname "${BASH_SOURCE[0]}")/../test_harness.sh"
run() {  # run NAME RANKS ARGS...: the run's output in $work/NAME, its plate and error reported
  local name=$1 ranks=$2 start end
  start=$(date +%s.%N)
  mpirun_shared "$ranks" "$B/in_situ_surrogate" "${@:3}" >"$work/$name" 2>&1 ||
    fail "$name exited non-zero: $(tail -5 "$work/$name")"
  end=$(date +%s.%N)
  grep -E "^(in_situ_surrogate:|step|plate_heat|final)" "$work/$name" | sed "s/^/$name: /"
  echo "$name: wall $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }') s"
}
heat() { sed -n 's/^plate_heat=//p' "$work/$1"; }
run cpu_all_1rank 1 --device cpu --layout all
run cuda_all_1rank_nccl 1 --device cuda --backend nccl --layout all
run cuda_all_1rank_inline 1 --device cuda --backend nccl --layout all --training-thread off
run cpu_all_2ranks 2 --device cpu --layout all
run cuda_all_2ranks_mpi 2 --device cuda --backend mpi --layout all
run cuda_split_2ranks_mpi 2 --device cuda --backend mpi --layout split
run auto_all_1rank 1 --device auto --layout all
run auto_split_2ranks 2 --device auto --layout split
grep -q "device=cuda" "$work/auto_all_1rank" || fail "--device auto did not take the GPU for one rank"
grep -q "device=cpu" "$work/auto_split_2ranks" || fail "--device auto did not keep two ranks sharing a GPU on the CPU"
for name in cuda_all_1rank_nccl cuda_all_2ranks_mpi cuda_split_2ranks_mpi; do
  grep -q "device=cuda" "$work/$name" || fail "$name did not run on the GPU"
  [ -n "$(heat "$name")" ] && [ "$(heat "$name")" = "$(heat cpu_all_1rank)" ] ||
    fail "$name's plate $(heat "$name") is not the CPU's $(heat cpu_all_1rank)"
done
[ "$(heat cpu_all_2ranks)" = "$(heat cpu_all_1rank)" ] || fail "the CPU plate differs between 1 and 2 ranks"
errors() { grep -E '^(step|final)' "$work/$1"; }
[ "$(errors cuda_all_1rank_nccl)" = "$(errors cuda_all_1rank_inline)" ] ||
  fail "the training thread changed the GPU run's errors"
finish in_situ_gpu
