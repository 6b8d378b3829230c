#!/usr/bin/env bash
# The CPU benchmark, on the 2-core build machine: our step (bench/step_bench) against
# PyTorch 1.13 (Debian's /usr/bin/python3) measured in the same run, and our step with and without DDP.
# Rows (784-1024-1024-10, batch 128 per rank):
#   2 ranks DDP: mpirun -np 2 step_bench --ddp  vs  pytorch_step.py --ranks 2 (DDP over gloo)
#   1 rank:      step_bench                    vs  pytorch_step.py (one process)
#   1 rank DDP:  step_bench --ddp              vs  step_bench (no DDP): the cost of DDP at world size 1
# Each pair runs ROUNDS times, alternating, because other work on the machine makes single runs noisy; the
# table takes the median. Raw lines go to ${OUT:-/tmp}/bench_cpu.jsonl.
# Launch: one OpenBLAS thread per rank (step_bench's default, cores / local ranks), ranks bound to cores, and
# Open MPI told to yield while it waits (mpi_yield_when_idle): the MPI backend's communication thread shares its
# rank's core with the compute thread, and a busy-polling wait for a slower peer (other load on the machine)
# would take that core from the rank's own backward. MPIRUN_OPTS overrides.
#   bash bench/run_cpu.sh            (builds //bench:step_bench first)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:-10}
REPEATS=${REPEATS:-5}
SIZES=784,1024,1024,10
BATCH=128
PY=/usr/bin/python3
out="${OUT:-/tmp}/bench_cpu.jsonl"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bazel build //bench:step_bench >/dev/null 2>&1 || bazel build //bench:step_bench
BIN=bazel-bin/bench/step_bench
read -r -a mpi_opts <<<"${MPIRUN_OPTS:---bind-to core --mca mpi_yield_when_idle 1}"
: >"$out"

record() {  # label side command...
  local label=$1 side=$2
  shift 2
  local line
  line=$("$@" 2>/dev/null | grep '^{' | tail -1) || true
  if [ -z "$line" ]; then
    echo "run failed: $*" >&2
    "$@" >&2 || true
    return 1
  fi
  echo "{\"label\": \"$label\", \"side\": \"$side\", \"result\": $line}" >>"$out"
}

common=(--sizes "$SIZES" --batch "$BATCH" --device cpu --iters "$ITERS" --repeats "$REPEATS")
for round in $(seq "$ROUNDS"); do
  echo "round $round of $ROUNDS" >&2
  record "2 ranks DDP vs PyTorch DDP/gloo" ours mpirun -np 2 "${mpi_opts[@]}" "$BIN" "${common[@]}" --ddp
  record "2 ranks DDP vs PyTorch DDP/gloo" ref $PY bench/pytorch_step.py "${common[@]}" --ranks 2
  record "1 rank vs PyTorch" ours mpirun -np 1 "${mpi_opts[@]}" "$BIN" "${common[@]}"
  record "1 rank vs PyTorch" ref $PY bench/pytorch_step.py "${common[@]}"
  record "1 rank: DDP vs no DDP (ours)" ours mpirun -np 1 "${mpi_opts[@]}" "$BIN" "${common[@]}" --ddp
  record "1 rank: DDP vs no DDP (ours)" ref mpirun -np 1 "${mpi_opts[@]}" "$BIN" "${common[@]}"
done
echo "CPU: $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD), rounds $ROUNDS, mpirun ${mpi_opts[*]}, load $(cut -d' ' -f1-3 /proc/loadavg)"
python3 bench/table.py "$out" "$@"
