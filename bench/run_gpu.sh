#!/usr/bin/env bash
# The H200 benchmark: bench/step_bench (from the bundle, .gpu/bin) against PyTorch 2.11
# (python3 there) running bench/pytorch_step.py on the same GPU in the same run, then one table with the
# ratios (ours/PyTorch step time; below 1 is faster) and peak memory. The DDP rows compare our step with and
# without DDP (NCCL at world size 1; with 2+ GPUs also NCCL across them; 2 ranks sharing this GPU over the
# MPI backend). Raw lines go to ${OUT:-/tmp}/bench_gpu.jsonl. Takes about 2-4 minutes.
#   bash tools/gpu_bundle.sh            (on the build machine)
#   bash bench/run_gpu.sh               (on the GPU machine, from the repository root; tools/gpu_jobs.txt: bench_gpu)
set -uo pipefail
cd "$(dirname "$0")/.."
B=${B:-$PWD/.gpu/bin}
PY=${PY:-python3}
out="${OUT:-/tmp}/bench_gpu.jsonl"
export LD_LIBRARY_PATH="$PWD/.gpu/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export NCCL_NVLS_ENABLE=0
: >"$out"
failed=0
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "${gpus:-0}" -ge 1 ] 2>/dev/null || gpus=1

record() {  # labels side command...   (labels: one or several separated by '|', each gets the result line)
  local labels=$1 side=$2
  shift 2
  local log line label
  log=$(timeout 150 "$@" 2>&1)
  line=$(grep '^{' <<<"$log" | tail -1)
  grep -h '^step_bench:\|^ddp gemm:' <<<"$log" >&2 || true
  if [ -z "$line" ]; then
    echo "FAILED ($labels, $side): $*" >&2
    tail -15 <<<"$log" >&2
    failed=$((failed + 1))
    return 0
  fi
  IFS='|' read -ra label_list <<<"$labels"
  for label in "${label_list[@]}"; do
    echo "{\"label\": \"$label\", \"side\": \"$side\", \"result\": $line}" >>"$out"
  done
}

ours() { record "$1" "$2" mpirun -np 1 --bind-to none "$B/step_bench" "${@:3}"; }
torch() { record "$1" "$2" "$PY" bench/pytorch_step.py "${@:3}"; }

S1=784,1024,1024,10
S2=1024,2048,2048,2048,2048,1024
S3=4096,4096,4096,4096
small=(--sizes $S1 --batch 256 --device cuda --warmup 20 --iters 100 --repeats 7)
mid=(--sizes $S2 --batch 4096 --device cuda --warmup 5 --iters 10 --repeats 5)
big=(--sizes $S3 --batch 8192 --device cuda --warmup 5 --iters 10 --repeats 5)

# Ours vs PyTorch, each PyTorch configuration measured once and shared by the rows that compare with it.
# --gemm-floor adds the step's GEMMs alone (column "GEMMs alone").
A="784-1024-1024-10 b256 fp32 eager"
torch "$A" ref "${small[@]}" --precision fp32
ours "$A" ours "${small[@]}" --precision fp32
A="784-1024-1024-10 b256 fp32 graph"
torch "$A" ref "${small[@]}" --precision fp32 --graph
ours "$A" ours "${small[@]}" --precision fp32 --graph --gemm-floor
for p in fp32 tf32; do
  A="1024-2048x4-1024 b4096 $p"
  torch "$A" ref "${mid[@]}" --precision $p
  DDP_GEMM_LOG=1 ours "$A" ours "${mid[@]}" --precision $p --gemm-floor
done
A="4096x4 b8192 bf16 (master fp32)"
torch "$A" ref "${big[@]}" --precision bf16
DDP_GEMM_LOG=1 ours "$A" ours "${big[@]}" --precision bf16 --gemm-floor

# The step with and without DDP (reference: our own step without DDP, same configuration).
L="DDP 1 rank NCCL 784 b256 fp32"; ours "$L" ours "${small[@]}" --ddp; ours "$L" ref "${small[@]}"
L="DDP 1 rank NCCL 784 b256 graph"; ours "$L" ours "${small[@]}" --ddp --graph; ours "$L" ref "${small[@]}" --graph
L="DDP 1 rank NCCL 1024-2048x4 b4096 tf32"; ours "$L" ours "${mid[@]}" --precision tf32 --ddp --bucket-mb 25
ours "$L" ref "${mid[@]}" --precision tf32
L="DDP 2 ranks MPI one GPU 784 b256"
record "$L" ours mpirun -np 2 --bind-to none -x DDP_BACKEND=mpi "$B/step_bench" "${small[@]}" --ddp --iters 20
ours "$L" ref "${small[@]}" --iters 20
if [ "$gpus" -ge 2 ]; then
  L="DDP $gpus ranks NCCL 1024-2048x4 b4096 tf32"
  record "$L" ours mpirun -np "$gpus" --bind-to none "$B/step_bench" "${mid[@]}" --precision tf32 --ddp
  ours "$L" ref "${mid[@]}" --precision tf32
  L="DDP $gpus ranks NCCL 784 b256 graph"
  record "$L" ours mpirun -np "$gpus" --bind-to none "$B/step_bench" "${small[@]}" --ddp --graph
  ours "$L" ref "${small[@]}" --graph
fi

echo "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) x$gpus; $(date -u +%Y-%m-%dT%H:%MZ); torch $($PY -c 'import torch; print(torch.__version__)' 2>/dev/null)"
python3 bench/table.py "$out" --markdown
echo "raw: $out; failed runs: $failed"
[ "$failed" -eq 0 ]
