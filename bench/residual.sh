#!/usr/bin/env bash
# A model of one's own as its user waits for it: examples/residual_regression (64-[512 LayerNorm GELU]x4 residual-8,
# batch 512, AdamW, cosine, the Trainer's CUDA graph) against PyTorch on the same GPU in the same run, twice: eager
# with the data resident, and with its whole step captured by hand as a CUDA graph (bench/pytorch_residual.py).
# Whole processes, from start to exit, alternating ROUNDS times; each arm's median wall time and final test loss,
# and our speed-up over each PyTorch arm.
#   bash bench/residual.sh         the GPU machine: .gpu/bin, 1 rank
# Environment: EPOCHS (20), ROWS (131072 training rows), ROUNDS (2).
set -uo pipefail
cd "$(dirname "$0")/.."
B=${B:-$PWD/.gpu/bin}
EPOCHS=${EPOCHS:-20}
ROWS=${ROWS:-131072}
ROUNDS=${ROUNDS:-2}
[ -d /tmp/ddp-gpu-lib/lib ] && export LD_LIBRARY_PATH="/tmp/ddp-gpu-lib/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
data=$(mktemp -d)
runs=$(mktemp)
trap 'rm -rf "$data" "$runs"' EXIT
python3 tests/examples/make_regression.py "$data" 64 8 "$ROWS" 16384 || exit 1
arm() {  # name, command...: one whole run, its wall time and final test loss into $runs
  local name="$1"
  shift
  local start end out
  start=$(date +%s.%N)
  out=$("$@" 2>&1) || { echo "$name failed: $out" >&2; exit 1; }
  end=$(date +%s.%N)
  echo "$out" | grep -E "^(residual_regression:|time:)" | cut -c1-200 >&2
  local loss
  loss=$(sed -n 's/^final step=[0-9]* test_loss=\([0-9.]*\).*/\1/p' <<<"$out" | tail -1)
  echo "$name $(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }') $loss" >>"$runs"
}
for ((r = 0; r < ROUNDS; r++)); do
  arm ours mpirun -np 1 --bind-to none "$B/residual_regression" "$data/train" "$data/test" "$EPOCHS" 512 4 512
  arm pytorch_eager python3 bench/pytorch_residual.py --data "$data" --mode eager --epochs "$EPOCHS"
  arm pytorch_graph python3 bench/pytorch_residual.py --data "$data" --mode graph --epochs "$EPOCHS"
done
python3 - "$runs" "$EPOCHS" "$ROWS" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
arms = ("ours", "pytorch_eager", "pytorch_graph")
wall = {a: statistics.median(float(r[1]) for r in rows if r[0] == a) for a in arms}
loss = {a: [r[2] for r in rows if r[0] == a] for a in wall}
print(f"| arm | wall (median, s) | final test loss | ours faster by |  ({sys.argv[2]} epochs of {sys.argv[3]} rows)")
print("| --- | --- | --- | --- |")
for a in wall:
    print(f"| {a} | {wall[a]:.2f} | {', '.join(loss[a])} | {wall[a] / wall['ours']:.2f}x |")
PY
