#!/usr/bin/env bash
# The step shapes of bench/RESULTS.md under several settings of the environment, paired in one run: each round times every
# arm on every shape one after the other, so that the machine's drift from minute to minute falls on all arms
# alike, and the table gives each arm's median and its ratio to the first arm's. For the GPU Linear's switches
# and the runtime's settings (DDP_*): one binary, no rebuild between arms.
#   bash bench/step_ab.sh 'DDP_BACKEND=mpi' ''             (arms: space-separated VAR=value lists; '' = defaults)
# Environment: ROUNDS (3), B (the binaries, .gpu/bin), OUT (where step_ab.jsonl goes, /tmp), SHAPES (a subset of
# the names below), DEVICE (cuda; cpu runs the eager shapes, for trying the script without a GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
  echo "usage: bench/step_ab.sh ARM [ARM ...]   (an ARM is 'VAR=value ...', '' for the defaults)" >&2
  exit 2
fi
B=${B:-$PWD/.gpu/bin}
[ -x "$B/step_bench" ] || { echo "step_ab: no $B/step_bench (build with tools/gpu_bundle.sh, or set B)" >&2; exit 2; }
[ -d /tmp/ddp-gpu-lib/lib ] && export LD_LIBRARY_PATH="/tmp/ddp-gpu-lib/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
DEVICE=${DEVICE:-cuda}
ROUNDS=${ROUNDS:-3}
out="${OUT:-/tmp}/step_ab.jsonl"
: >"$out"
graph=--graph
[ "$DEVICE" = cuda ] || graph=
# The two step shapes of bench/RESULTS.md (small: the main job's model; big) and others beside them.
declare -A shape_args=(
  [small]="--sizes 784,512,512,10 --batch 128 --optimizer adamw --ddp"
  [big]="--sizes 784,1024,1024,10 --batch 256 --optimizer sgd"
  [b16]="--sizes 784,512,512,10 --batch 16 --optimizer adamw --ddp"
  [small_tf32]="--sizes 784,512,512,10 --batch 128 --optimizer adamw --ddp --precision tf32"
)
SHAPES=${SHAPES:-small big b16 small_tf32}
for round in $(seq "$ROUNDS"); do
  for shape in $SHAPES; do
    for arm in "$@"; do
      # shellcheck disable=SC2086 # the arm's assignments and the shape's arguments are word lists
      line=$(env $arm mpirun -np 1 --bind-to none "$B/step_bench" --device "$DEVICE" --warmup 50 --iters 200 \
               --repeats 15 $graph ${shape_args[$shape]} 2>/dev/null | grep '^{' | tail -1)
      if [ -z "$line" ]; then
        echo "FAILED: round $round, $shape, arm '$arm'" >&2
        continue
      fi
      python3 -c 'import json, sys
r = json.loads(sys.argv[1])
r.update(ab_shape=sys.argv[2], ab_arm=sys.argv[3], ab_round=int(sys.argv[4]))
print(json.dumps(r))' "$line" "$shape" "$arm" "$round" >>"$out"
    done
  done
done
python3 - "$out" "$@" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
arms = sys.argv[2:]
shapes = list(dict.fromkeys(r["ab_shape"] for r in rows))
name = lambda a: a if a else "(defaults)"
print("| shape | " + " | ".join(name(a) for a in arms) + " |")
print("| --- |" + " --- |" * len(arms))
for shape in shapes:
    cells, base = [], None
    for a in arms:
        us = [r["step_us"] for r in rows if r["ab_shape"] == shape and r["ab_arm"] == a]
        if not us:
            cells.append("-")
            continue
        m = statistics.median(us)
        base = m if base is None else base
        spread = f" ({min(us):.1f}-{max(us):.1f})" if len(us) > 1 else ""
        cells.append(f"{m:.1f} us{spread}" + ("" if a == arms[0] else f", {m / base:.3f}x"))
    print(f"| {shape} | " + " | ".join(cells) + " |")
rounds = max((r["ab_round"] for r in rows), default=0)
print(f"(medians of {rounds} rounds; ratios against the first arm; raw lines in {sys.argv[1]})")
PY
