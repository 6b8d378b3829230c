#!/usr/bin/env bash
# The in-situ example as its user waits for it, 1 rank (layout all), at the example's plate and at a large one,
# alternating ROUNDS times:
# - on the GPU, the solver's pace (the steps per second the example prints, its loop from first step to last
#   training step done) with the surrogate training beside it (12 steps of batch 256 every 5 solver steps) and
#   with no surrogate at all (no samples drawn): what training costs the simulation;
# - whole runs from `mpirun` (startup included) with training on, on the CPU (one core) and on the GPU.
# Prints each arm's median and the medians of the paired ratios.
#   bash bench/in_situ.sh          the GPU machine: .gpu/bin
# Environment: PLATES ("64 1024"), STEPS (3000), ROUNDS (3), DEVICES ("cpu cuda").
set -uo pipefail
cd "$(dirname "$0")/.."
B=${B:-$PWD/.gpu/bin}
PLATES=${PLATES:-64 1024}
STEPS=${STEPS:-3000}
ROUNDS=${ROUNDS:-3}
DEVICES=${DEVICES:-cpu cuda}
[ -d /tmp/ddp-gpu-lib/lib ] && export LD_LIBRARY_PATH="/tmp/ddp-gpu-lib/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
runs=$(mktemp)
trap 'rm -f "$runs"' EXIT
run() {  # PLATE DEVICE ARM ARGS...: one run, a line "plate device arm steps_per_s wall error" into $runs
  local start end out
  start=$(date +%s.%N)
  out=$(mpirun -np 1 --bind-to none "$B/in_situ_surrogate" --device "$2" --rows "$1" --cols "$1" --steps "$STEPS" \
    --max-error 10 "${@:4}" 2>&1) || { echo "$2 at $1 ($3): $out" >&2; exit 1; }
  end=$(date +%s.%N)
  echo "$1 $2 $3 $(sed -n 's/^solver_steps_per_s=\([0-9.]*\) .*/\1/p' <<<"$out")" \
    "$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }') $(sed -n 's/^final_rel_error=\([0-9.]*\) .*/\1/p' <<<"$out")" >>"$runs"
}
for ((r = 0; r < ROUNDS; r++)); do
  for plate in $PLATES; do
    for device in $DEVICES; do
      run "$plate" "$device" on
      # No surrogate: nothing sampled in the run's steps, nothing trained.
      [ "$device" = cuda ] && run "$plate" "$device" off --sample-every 1048576 --train-steps 0
    done
  done
done
python3 - "$runs" "$STEPS" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
STEPS_PER_S, WALL, ERROR = 3, 4, 5
def arm(plate, device, name, column):
    return [float(r[column]) for r in rows if r[0] == plate and r[1] == device and r[2] == name]
def table(columns, a, b, column, ratio, unit):
    """A row per plate: arm a, arm b (each (device, name)), the median of the paired ratios, the final errors."""
    print("| plate | " + " | ".join(columns) + " |")
    print("| --- |" + " --- |" * len(columns))
    for p in sorted({r[0] for r in rows}, key=int):
        x, y = arm(p, *a, column), arm(p, *b, column)
        errors = ", ".join(f"{arm(p, d, 'on', ERROR)[0]:.4f}" for d in dict.fromkeys((a[0], b[0])))
        print(f"| {p}x{p} | {unit(statistics.median(x))} | {unit(statistics.median(y))} "
              f"| **{statistics.median(ratio(u, v) for u, v in zip(x, y)):.3f}** | {errors} |")
print(f"{sys.argv[2]} solver steps; medians, and the medians of the paired ratios")
devices = {r[1] for r in rows}
if "cuda" in devices:
    table(["GPU solver steps/s, no surrogate", "with training", "with / without", "final error"],
          ("cuda", "off"), ("cuda", "on"), STEPS_PER_S, lambda u, v: v / u, lambda v: f"{v:.0f}")
if devices >= {"cpu", "cuda"}:
    table(["CPU run", "GPU run", "CPU / GPU", "final error, CPU and GPU"],
          ("cpu", "on"), ("cuda", "on"), WALL, lambda u, v: u / v, lambda v: f"{v:.2f} s")
PY
