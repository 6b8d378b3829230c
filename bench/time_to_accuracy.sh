#!/usr/bin/env bash
# Time to accuracy: the whole main job (process start to its final accuracy line), ours against PyTorch running
# the same recipe (bench/pytorch_train.py), in one run on one machine, then one table with the ratios.
#
#   bash bench/time_to_accuracy.sh            # GPU machine: binaries from .gpu/bin, data from .gpu/data
#   TTA_DEVICE=cpu bash bench/time_to_accuracy.sh   # this machine: 2 CPU ranks, bazel-bin, the installed data
#
# On the GPU: train_mlp fp32 (CUDA graph), fp32 eager (--no-cuda-graph), tf32, bf16; PyTorch with a DataLoader,
# with the data resident on the GPU, and resident + torch.compile(mode="reduce-overhead"). On the CPU: train_mlp
# and PyTorch DDP over gloo, 2 ranks each. Raw lines go to ${OUT:-/tmp}/time_to_accuracy.jsonl.
# TTA_EPOCHS shortens every run alike (default 30, the recipe's); TTA_ONLY=ours or =torch runs one side;
# TTA_TORCH_MODES="resident" runs only PyTorch's fastest GPU variant. TTA_RANKS=N on the GPU runs both sides on
# N GPUs, one rank each: ours through ddprun -np N, PyTorch DDP over NCCL through torchrun.
set -uo pipefail
cd "$(dirname "$0")/.."
device=${TTA_DEVICE:-cuda}
epochs=${TTA_EPOCHS:-30}
out="${OUT:-/tmp}/time_to_accuracy.jsonl"
: >"$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
if [ "$device" = cuda ]; then
  B=${B:-$PWD/.gpu/bin}
  ddprun=${DDPRUN:-$B/ddprun}
  data=${DDP_GPU_DATA:-$PWD/.gpu/data}
  PY=${PY:-python3}
  ranks=${TTA_RANKS:-1}
  [ -d /tmp/ddp-gpu-lib/lib ] && export LD_LIBRARY_PATH="/tmp/ddp-gpu-lib/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
else
  B=${B:-$PWD/bazel-bin/examples}
  ddprun=${DDPRUN:-$PWD/bazel-bin/launcher/ddprun}
  data=${DDP_DATA:-/usr/share/datasets/fashion-mnist}
  PY=${PY:-/usr/bin/python3}
  ranks=2
fi

rows=()
run() {  # label command...: times the process to its final accuracy line and to its exit
  local label=$1
  shift
  local t0 log acc seconds final_line status
  t0=$EPOCHREALTIME
  # Each line stamped as it arrives: the final accuracy line's time is the issue's measure, the exit's (after
  # MPI_Finalize, the CUDA context's teardown, mpirun's) what a script waiting for the job sees.
  log=$("$@" 2>&1 | while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "${line//$'\r'/ }"; done;
        exit "${PIPESTATUS[0]}")
  status=$?
  seconds=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
  final_line=$(grep 'final step=[0-9]* test_loss=[0-9.na-]* test_accuracy=[0-9.]*' <<<"$log" | tail -1)
  acc=$(grep -o 'test_accuracy=[0-9.]*' <<<"$final_line" | sed 's/.*=//')
  if [ "$status" -ne 0 ] || [ -z "$acc" ]; then
    echo "FAILED $label (exit $status):" >&2
    tail -15 <<<"$log" >&2
    acc=failed
  fi
  local to_final
  to_final=$(awk -v a="$t0" -v b="${final_line%% *}" 'BEGIN { if (b == "") print "-"; else printf "%.2f", b - a }')
  grep -h 'CUDA graph off\|train_mlp:\|time:' <<<"$log" | cut -d' ' -f2- | head -3 >&2
  echo "{\"label\": \"$label\", \"seconds\": $seconds, \"seconds_to_final_line\": \"$to_final\", \"test_accuracy\": \"$acc\", \"epochs\": $epochs}" >>"$out"
  rows+=("$label|$seconds|$to_final|$acc")
  echo "$label: $to_final s to the final accuracy line, $seconds s to exit, test accuracy $acc" >&2
}

# Ours as a user starts it: through ddprun (its rank binding, its MPI settings, its rank wrapper).
ours=("$ddprun" -np "$ranks" -- "$B/train_mlp" --device "$device" --data "$data" --epochs "$epochs"
      --log-every 1000000)
torch=("$PY" bench/pytorch_train.py --device "$device" --data "$data" --epochs "$epochs")
if [ "$device" = cuda ] && [ "$ranks" -gt 1 ]; then
  torch=("$PY" -m torch.distributed.run --standalone --nproc-per-node "$ranks" bench/pytorch_train.py
         --device "$device" --data "$data" --epochs "$epochs")
fi
# One untimed start of each side first: the first start after the machine came up (libraries read from disk,
# the GPU's clocks and driver state) would otherwise be charged to whichever run comes first.
[ "${TTA_ONLY:-}" != torch ] && "${ours[@]}" --max-steps 100 >/dev/null 2>&1
[ "${TTA_ONLY:-}" != ours ] && "$PY" -c "import torch; torch.zeros(1, device='$device')" >/dev/null 2>&1
if [ "${TTA_ONLY:-}" != torch ]; then
  if [ "$device" = cuda ]; then
    run "ours fp32 (CUDA graph)" "${ours[@]}"
    run "ours fp32 eager (--no-cuda-graph)" "${ours[@]}" --no-cuda-graph
    run "ours tf32 (CUDA graph)" "${ours[@]}" --precision tf32
    run "ours bf16 (CUDA graph)" "${ours[@]}" --precision bf16
  else
    run "ours, 2 CPU ranks" "${ours[@]}"
  fi
fi
if [ "${TTA_ONLY:-}" != ours ]; then
  if [ "$device" = cuda ]; then
    # TTA_TORCH_MODES picks PyTorch's runs (default all three; "resident" alone is its fastest, the ratio's base).
    for mode in ${TTA_TORCH_MODES:-dataloader resident compiled}; do
      case "$mode" in
        dataloader) run "pytorch DataLoader, pinned" "${torch[@]}" --mode dataloader ;;
        resident) run "pytorch resident on the GPU" "${torch[@]}" --mode resident ;;
        compiled) run "pytorch resident + torch.compile" "${torch[@]}" --mode compiled ;;
      esac
    done
  else
    run "pytorch DDP gloo, 2 CPU ranks" "${torch[@]}" --ranks 2
  fi
fi

# The table: each row's time and its speed-up over PyTorch's fastest run of the same run.
best_torch=$(printf '%s\n' "${rows[@]}" | awk -F'|' '$1 ~ /^pytorch/ && $3 != "failed" { if (b == "" || $2 < b) b = $2 } END { print b }')
echo
echo "| run ($device, $ranks rank(s), $epochs epochs) | s, process start to the final accuracy line | s, to exit | test accuracy | PyTorch's fastest / this (to exit) |"
echo "| --- | --- | --- | --- | --- |"
for r in "${rows[@]}"; do
  IFS='|' read -r label seconds to_final acc <<<"$r"
  ratio=$(awk -v b="$best_torch" -v s="$seconds" 'BEGIN { if (b == "" || s == 0) print "-"; else printf "%.2fx", b / s }')
  echo "| $label | $to_final | $seconds | $acc | $ratio |"
done
