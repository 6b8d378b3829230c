#!/usr/bin/env bash
# Is the GPU main job repeatable? Runs train_mlp's first epoch (469 steps, the loss read at every step) several
# times under different GPU schedules and prints, per configuration, how many distinct loss sequences came out.
# One sequence per row is the contract (same seed, same ranks: the same bits); more than one is a race or a
# non-deterministic kernel, and the rows that stay at one say where to look. With SANITIZE=1 it then runs
# compute-sanitizer's initcheck, racecheck and synccheck over a few eager steps.
#   bash bench/repeatability.sh        (on the GPU machine, from the repository root; binaries from .gpu/bin)
set -uo pipefail
cd "$(dirname "$0")/.."
B=${B:-$PWD/.gpu/bin}
data=${DDP_GPU_DATA:-$PWD/.gpu/data}
[ -d /tmp/ddp-gpu-lib/lib ] && export LD_LIBRARY_PATH="/tmp/ddp-gpu-lib/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
out="${OUT:-/tmp}/repeatability"
mkdir -p "$out"
repeats=${REPEATS:-3}

# One run: the losses of every step and the epoch's test line, hashed.
run_once() {  # name, then env assignments and train_mlp flags
  local name=$1; shift
  local envs=() flags=()
  for a in "$@"; do
    if [[ "$a" == *=* && "$a" != --* ]]; then envs+=("$a"); else flags+=("$a"); fi
  done
  env "${envs[@]}" mpirun -np 1 --bind-to none "$B/train_mlp" --device cuda --data "$data" --epochs 1 \
    --log-every 1 "${flags[@]}" >"$out/$name.log" 2>&1
  grep -oE "step=[0-9]+/[0-9]+ loss=[0-9.]+|test_loss=[0-9.]+ test_accuracy=[0-9.]+" "$out/$name.log" | md5sum | cut -c1-8
}

row() {  # label, then what run_once takes after its name
  local label=$1; shift
  local sums=()
  for r in $(seq 1 "$repeats"); do sums+=("$(run_once "${label// /_}-$r" "$@")"); done
  local distinct
  distinct=$(printf '%s\n' "${sums[@]}" | sort -u | wc -l)
  local last
  last=$(grep -oE "test_accuracy=[0-9.]+" "$out/${label// /_}-$repeats.log" | tail -1)
  printf '| %s | %d of %d | %s | %s |\n' "$label" "$distinct" "$repeats" "${sums[*]}" "$last"
}

echo "| configuration | distinct loss sequences | hashes | last run |"
echo "| --- | --- | --- | --- |"
row "eager" --no-cuda-graph
row "eager launch blocking" CUDA_LAUNCH_BLOCKING=1 --no-cuda-graph
row "eager mpi backend" --no-cuda-graph --backend mpi
row "graph" 

if [ "${SANITIZE:-0}" = 1 ]; then
  cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for tool in initcheck racecheck synccheck memcheck; do
    timeout "${SANITIZE_TIMEOUT:-90}" "$cs" --tool "$tool" --print-limit 20 "$B/train_mlp" --device cuda --data "$data" --max-steps 3 \
      --log-every 1 --no-cuda-graph >"$out/sanitize-$tool.log" 2>&1
    echo "compute-sanitizer $tool: exit $?, $(grep -cE '^=+ +(Uninitialized|Race|Barrier|Invalid|Error)' "$out/sanitize-$tool.log") report(s); $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitize-$tool.log" | head -1)"
    grep -E '^=+ +(Uninitialized|Race|Barrier|Invalid)' -A6 "$out/sanitize-$tool.log" | head -30
  done
fi
