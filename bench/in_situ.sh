#!/usr/bin/env bash
# The in-situ example as its user waits for it: whole runs (solver, sampling, training, scoring) with the solver
# and the surrogate on the CPU and on the GPU, at the example's plate and at a large one, alternating ROUNDS
# times; each configuration's median wall time and final error, and the CPU / GPU ratio of the medians.
#   bash bench/in_situ.sh          the GPU machine: .gpu/bin, 1 rank (layout all), CPU run on one core
# Environment: PLATES ("64 1024"), STEPS (600), ROUNDS (3).
set -uo pipefail
cd "$(dirname "$0")/.."
B=${B:-$PWD/.gpu/bin}
PLATES=${PLATES:-64 1024}
STEPS=${STEPS:-600}
ROUNDS=${ROUNDS:-3}
[ -d /tmp/ddp-gpu-lib/lib ] && export LD_LIBRARY_PATH="/tmp/ddp-gpu-lib/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
runs=$(mktemp)
trap 'rm -f "$runs"' EXIT
for ((r = 0; r < ROUNDS; r++)); do
  for plate in $PLATES; do
    for device in cpu cuda; do
      start=$(date +%s.%N)
      out=$(mpirun -np 1 --bind-to none "$B/in_situ_surrogate" --device "$device" --rows "$plate" --cols "$plate" \
        --steps "$STEPS" --max-error 10 2>&1) || { echo "$device at $plate: $out" >&2; exit 1; }
      end=$(date +%s.%N)
      error=$(sed -n 's/^final_rel_error=\([0-9.]*\) .*/\1/p' <<<"$out")
      echo "$plate $device $(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }') $error" >>"$runs"
    done
  done
done
python3 - "$runs" "$STEPS" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
print(f"| plate | CPU wall | GPU wall | CPU / GPU | final error CPU, GPU |  ({sys.argv[2]} solver steps, medians)")
print("| --- | --- | --- | --- | --- |")
for plate in sorted({r[0] for r in rows}, key=int):
    wall = {d: statistics.median(float(r[2]) for r in rows if r[0] == plate and r[1] == d) for d in ("cpu", "cuda")}
    err = {d: next(r[3] for r in rows if r[0] == plate and r[1] == d) for d in ("cpu", "cuda")}
    print(f"| {plate}x{plate} | {wall['cpu']:.2f} s | {wall['cuda']:.2f} s | {wall['cpu'] / wall['cuda']:.2f}x "
          f"| {err['cpu']}, {err['cuda']} |")
PY
