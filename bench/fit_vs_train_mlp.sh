#!/usr/bin/env bash
# A user's program on the Trainer (examples/fit) and a loop of one's own on TrainStep (bench/own_loop) against the
# main job (train_mlp) with the same recipe, in one run: their steady-state step (each program's time line:
# training seconds / steps) and their wall time to exit, alternating ROUNDS times so that drift falls on all alike;
# then the ratios to train_mlp (goals: fit within 1.10, the loop of one's own within 1.15 of the Trainer's step).
#   bash bench/fit_vs_train_mlp.sh                 GPU machine: binaries from .gpu/bin, 1 rank, 30 epochs
#   DEVICE=cpu NP=2 STEPS=400 bash bench/fit_vs_train_mlp.sh     this machine: bazel-bin, 2 CPU ranks
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cuda}
NP=${NP:-1}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-0}  # 0: the whole recipe (30 epochs)
DATA=${DDP_GPU_DATA:-/usr/share/datasets/fashion-mnist}
if [ "$DEVICE" = cuda ]; then
  B=${B:-$PWD/.gpu/bin}
  launch=(mpirun -np "$NP" --bind-to none)
  [ -d /tmp/ddp-gpu-lib/lib ] && export LD_LIBRARY_PATH="/tmp/ddp-gpu-lib/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
else
  B=${B:-$PWD/bazel-bin/examples}
  launch=("$PWD/bazel-bin/launcher/ddprun" -np "$NP" --)
fi
own_loop="$B/own_loop"
[ -x "$own_loop" ] || own_loop="$PWD/bazel-bin/bench/own_loop"  # this machine: bench/'s own folder
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# "PROGRAM STEP_US WALL_S" for one run.
run() {
  local name="$1" start end out
  shift
  rm -rf "$work/ckpt"
  start=$(date +%s.%N)
  out=$("${launch[@]}" "$@" 2>&1) || { echo "FAILED: $name: $(tail -3 <<<"$out")" >&2; return; }
  end=$(date +%s.%N)
  local us
  us=$(grep -o '([0-9.]* us each)' <<<"$out" | tail -1 | tr -dc '0-9.')
  echo "$name $us $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }')"
}
for ((r = 0; r < ROUNDS; r++)); do
  run train_mlp "$B/train_mlp" --device "$DEVICE" --data "$DATA" --checkpoint-dir "$work/ckpt" --max-steps "$STEPS"
  run fit "$B/fit" "$work/ckpt" "$STEPS" "$DATA"
  run own_loop "$own_loop" "$DATA" "$STEPS"
done | tee "$work/runs"
awk '{ n[$1]++; us[$1] += $2; wall[$1] += $3 }
     END {
       printf "| program | step | wall time to exit |\n| --- | --- | --- |\n"
       for (p in n) printf "| %s | %.1f us | %.2f s |\n", p, us[p] / n[p], wall[p] / n[p]
       if (n["fit"] && n["train_mlp"])
         printf "fit / train_mlp: step %.3f, wall %.3f (goal: step within 1.10)\n",
                (us["fit"] / n["fit"]) / (us["train_mlp"] / n["train_mlp"]),
                (wall["fit"] / n["fit"]) / (wall["train_mlp"] / n["train_mlp"])
       if (n["own_loop"] && n["fit"])
         printf "own_loop / fit (the Trainer): step %.3f (goal: within 1.15)\n",
                (us["own_loop"] / n["own_loop"]) / (us["fit"] / n["fit"])
     }' "$work/runs"
