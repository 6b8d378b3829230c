#!/usr/bin/env bash
# Where the main job's graphed step loses time against step_bench's (issue 12), by train_mlp's default recipe
# under variations that each test one explanation, in one run, then a table of the time line's steps:
#   - the host's lead: with no loss read the host queues up to an epoch of replays; reading the loss every 10 or
#     50 steps keeps it near the device;
#   - the batch's shape: 120 and 125 rows (no short last batch) against 128.
# The time line's average over step_bench's step holds the first step's kernel loading and the epoch boundaries,
# not only the steady state: read that from --metrics-file windows.
#   bash bench/main_job_gap.sh                      (GPU machine: binaries from .gpu/bin, data from .gpu/data)
#   GAP_DEVICE=cpu GAP_EPOCHS=1 bash bench/main_job_gap.sh   (this machine: checks the script, not the GPU)
set -uo pipefail
cd "$(dirname "$0")/.."
device=${GAP_DEVICE:-cuda}
epochs=${GAP_EPOCHS:-30}
if [ "$device" = cuda ]; then
  B=${B:-$PWD/.gpu/bin}
  data=${DDP_GPU_DATA:-$PWD/.gpu/data}
  [ -d /tmp/ddp-gpu-lib/lib ] && export LD_LIBRARY_PATH="/tmp/ddp-gpu-lib/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
else
  B=${B:-$PWD/bazel-bin/examples}
  data=${DDP_DATA:-/usr/share/datasets/fashion-mnist}
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
job=(mpirun -np 1 --bind-to none --mca pml ob1 "$B/train_mlp" --device "$device" --data "$data" --epochs "$epochs")
"${job[@]}" --max-steps 50 >/dev/null 2>&1  # one untimed start: libraries read, the device warmed

echo "| run | steps | s | us a step | test accuracy |"
echo "| --- | --- | --- | --- | --- |"
row() {  # label env... -- args...
  local label=$1
  shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local out time_line steps seconds per_step accuracy
  out=$(env "${envs[@]}" "${job[@]}" "$@" 2>&1)
  time_line=$(grep -h '^time:' <<<"$out" | tail -1)
  read -r steps seconds per_step < <(sed -nE 's/.* ([0-9]+) steps ([0-9.]+) s \(([0-9]+) us each\).*/\1 \2 \3/p' <<<"$time_line")
  accuracy=$(grep -oE 'final step=[0-9]+ .*test_accuracy=[0-9.]+' <<<"$out" | grep -oE '[0-9.]+$')
  if [ -z "$time_line" ]; then
    echo "FAILED: $label" >&2
    tail -5 <<<"$out" >&2
  fi
  echo "| $label | ${steps:--} | ${seconds:--} | ${per_step:--} | ${accuracy:--} |"
}
row "default (no loss read until the end of an epoch)" -- --log-every 1000000
row "loss read every 50 steps" -- --log-every 50
row "loss read every 10 steps" -- --log-every 10
row "batch 125 (no short last batch)" -- --log-every 1000000 --batch-size 125
row "batch 120" -- --log-every 1000000 --batch-size 120
