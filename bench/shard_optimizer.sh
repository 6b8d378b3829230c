#!/usr/bin/env bash
# The sharded optimizer (DdpOptions::shard_optimizer, ZeRO stage 1) against the unsharded one, measured in the
# same run: bench/step_bench --ddp with and without --shard-optimizer, alternating, ROUNDS times, for SGD with
# momentum and for AdamW. Prints the step-time ratio (sharded over unsharded; the CPU target at 2 ranks is at
# most 1.05), peak memory, each rank's optimizer state, and how much of the parameter all-gathers the optimizer
# hid. Raw lines go to ${OUT:-/tmp}/bench_shard.jsonl.
#   bash bench/shard_optimizer.sh                    CPU, 2 ranks (builds //bench:step_bench first)
#   bash bench/shard_optimizer.sh --device cuda      on the GPU machine (binaries from the bundle, $B or .gpu/bin):
#                                                    one rank per GPU over NCCL where the node has RANKS GPUs,
#                                                    else (or with DDP_BACKEND=mpi) RANKS ranks sharing one GPU
#                                                    through the MPI backend
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE=cpu
[ "${1:-}" = "--device" ] && DEVICE="${2:-cpu}"
RANKS=${RANKS:-2}
ROUNDS=${ROUNDS:-3}
out="${OUT:-/tmp}/bench_shard.jsonl"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [ "$DEVICE" = cpu ]; then
  bazel build //bench:step_bench >/dev/null 2>&1 || bazel build //bench:step_bench
  BIN=bazel-bin/bench/step_bench
  # As bench/run_cpu.sh: ranks bound to cores, MPI yielding while it waits (the communication thread shares the
  # rank's core).
  read -r -a mpi_opts <<<"${MPIRUN_OPTS:---bind-to core --mca mpi_yield_when_idle 1}"
  common=(--sizes 784,1024,1024,10 --batch 128 --device cpu --iters 10 --repeats 5)
else
  BIN="${B:-$PWD/.gpu/bin}/step_bench"
  if [ "${DDP_BACKEND:-}" != mpi ] && [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -ge "$RANKS" ]; then
    export NCCL_NVLS_ENABLE=0
    read -r -a mpi_opts <<<"${MPIRUN_OPTS:---bind-to none}"
  else
    export DDP_BACKEND=mpi  # several ranks on one GPU: NCCL refuses that
    read -r -a mpi_opts <<<"${MPIRUN_OPTS:---oversubscribe --bind-to none}"
  fi
  common=(--sizes 1024,2048,2048,2048,2048,1024 --batch 1024 --device cuda --warmup 5 --iters 10 --repeats 5)
fi
: >"$out"

record() {  # label side args...
  local label=$1 side=$2 line
  shift 2
  line=$(mpirun -np "$RANKS" "${mpi_opts[@]}" "$BIN" "${common[@]}" --ddp "$@" 2>/dev/null | grep '^{' | tail -1) || true
  if [ -z "$line" ]; then
    echo "run failed: $BIN ${common[*]} --ddp $*" >&2
    return 1
  fi
  echo "{\"label\": \"$label\", \"side\": \"$side\", \"result\": $line}" >>"$out"
}

for round in $(seq "$ROUNDS"); do
  echo "round $round of $ROUNDS" >&2
  for opt in sgd adamw; do
    label="$RANKS ranks $DEVICE${DDP_BACKEND:+ ($DDP_BACKEND)} $opt: sharded vs unsharded"
    record "$label" ours --optimizer "$opt" --shard-optimizer
    record "$label" ref --optimizer "$opt"
  done
done
echo "$DEVICE: $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), rounds $ROUNDS, mpirun ${mpi_opts[*]}, load $(cut -d' ' -f1-3 /proc/loadavg)"
python3 bench/table.py "$out" --markdown
python3 - "$out" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    rows.setdefault(r["label"], {"ours": [], "ref": []})[r["side"]].append(r["result"])
print()
# Each round runs the two back to back: the median of the per-round ratios resists load that comes and goes.
print("| configuration | per-round sharded/unsharded, median | state per rank, sharded / unsharded | peak MiB, sharded / unsharded | all-gather ms | exposed all-gather ms | hidden |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for label, sides in rows.items():
    s, u = sides["ours"], sides["ref"]
    med = lambda rs, k: statistics.median(r[k] for r in rs)
    pairs = statistics.median(a["step_us"] / b["step_us"] for a, b in zip(s, u))
    ag, ex = med(s, "allgather_ms"), med(s, "exposed_allgather_ms")
    print(f"| {label} | {pairs:.3f} | {med(s, 'optimizer_state_bytes') / 2**20:.2f} / {med(u, 'optimizer_state_bytes') / 2**20:.2f} MiB "
          f"| {med(s, 'peak_bytes') / 2**20:.1f} / {med(u, 'peak_bytes') / 2**20:.1f} | {ag:.2f} | {ex:.2f} "
          f"| {max(0.0, 1 - ex / ag) if ag > 0 else 0:.2f} |")
PY
