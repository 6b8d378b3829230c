#!/usr/bin/env bash
# Data-parallel scaling on one node's GPUs (NCCL, one rank per GPU), ours against PyTorch DDP in the same run:
#   - the 4096x4 bf16 step (batch 8192 per rank) and the 1024-2048x4-1024 TF32 step (batch 4096 per rank) at 1, 2,
#     4 and 8 ranks (those the node has): samples/s, scaling efficiency (samples/s at N over N times those at 1),
#     the share of the step our communication leaves exposed, and our samples/s over PyTorch DDP's; from 2 ranks
#     also with DdpOptions::overlap_optimizer (step_bench --overlap-optimizer), against the same 1-rank base;
#   - all-reduce bus bandwidth of our process group against NCCL's own ncclAllReduce loop (bench/allreduce_bench).
# Goals (issue 19): efficiency >= 95% at 8, exposed communication <= 5% of the step, >= 1.1x PyTorch's samples/s,
# bus bandwidth >= 0.9x NCCL's. Raw lines go to ${OUT:-/tmp}/scaling_gpu.jsonl, then one table.
#   bash bench/scaling_gpu.sh           (on the GPU machine, from the repository root; binaries from .gpu/bin)
set -uo pipefail
cd "$(dirname "$0")/.."
B=${B:-$PWD/.gpu/bin}
PY=${PY:-python3}
out="${OUT:-/tmp}/scaling_gpu.jsonl"
: >"$out"
[ -d /tmp/ddp-gpu-lib/lib ] && export LD_LIBRARY_PATH="/tmp/ddp-gpu-lib/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "${gpus:-0}" -ge 1 ] || { echo "scaling_gpu: no GPU" >&2; exit 1; }

models=(
  "bf16 4096,4096,4096,4096,4096 8192"
  "tf32 1024,2048,2048,2048,2048,1024 4096"
)
keep() {  # tag, then the command: its last JSON line goes to $out with the tag
  local tag=$1
  shift
  local line
  line=$(timeout 300 "$@" 2>/dev/null | grep '^{' | tail -1)
  if [ -n "$line" ]; then echo "{\"tag\": \"$tag\", \"result\": $line}" >>"$out"; else echo "FAILED: $*" >&2; fi
}
for n in 1 2 4 8; do
  [ "$n" -le "$gpus" ] || continue
  for m in "${models[@]}"; do
    read -r precision sizes batch <<<"$m"
    common=(--sizes "$sizes" --batch "$batch" --precision "$precision" --device cuda)
    keep "ours $precision $n" mpirun -np "$n" --bind-to none -x NCCL_NVLS_ENABLE=0 "$B/step_bench" "${common[@]}" \
      --ddp --warmup 5 --iters 20 --repeats 5 --stats-iters 5
    [ "$n" -ge 2 ] && keep "overlap $precision $n" mpirun -np "$n" --bind-to none -x NCCL_NVLS_ENABLE=0 \
      "$B/step_bench" "${common[@]}" --ddp --overlap-optimizer --warmup 5 --iters 20 --repeats 5 --stats-iters 5
    keep "pytorch $precision $n" "$PY" bench/pytorch_step.py "${common[@]}" --ranks "$n" --warmup 5 --iters 20 \
      --repeats 5 --port $((29600 + n))
  done
  [ "$n" -ge 2 ] && timeout 300 mpirun -np "$n" --bind-to none -x NCCL_NVLS_ENABLE=0 "$B/allreduce_bench" \
    --min-mib 1 --max-mib 256 2>/dev/null | grep '^{' | sed "s/^/{\"tag\": \"allreduce $n\", \"result\": /; s/\$/}/" >>"$out"
done

python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
get = {r["tag"]: r["result"] for r in rows}
print("| model | ranks | ours samples/s | efficiency | exposed comm | overlapped optimizer: samples/s | efficiency "
      "| exposed comm | PyTorch DDP samples/s | ours (best) / PyTorch |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for precision in ("bf16", "tf32"):
    base = get.get(f"ours {precision} 1")
    for n in (1, 2, 4, 8):
        ours, over, torch = (get.get(f"{side} {precision} {n}") for side in ("ours", "overlap", "pytorch"))
        if not ours:
            continue
        def figures(r):
            if not r:
                return ["-", "-", "-"]
            eff = f"{r['samples_per_s'] / (n * base['samples_per_s']) * 100:.1f}%" if base else "-"
            exposed = r.get("exposed_comm_ms")
            share = f"{exposed * 1000 / r['step_us'] * 100:.1f}%" if exposed is not None else "-"
            return [f"{r['samples_per_s']:.0f}", eff, share]
        best = max(r["samples_per_s"] for r in (ours, over) if r)
        ratio = f"{best / torch['samples_per_s']:.2f}x" if torch else "-"
        tps = f"{torch['samples_per_s']:.0f}" if torch else "-"
        cells = [f"{precision} {ours['sizes']} b{ours['batch']}", str(n)] + figures(ours) + figures(over) + [tps, ratio]
        print("| " + " | ".join(cells) + " |")
ar = [r["result"] for r in rows if r["tag"].startswith("allreduce")]
if ar:
    print()
    print("| ranks | MiB | ours bus GB/s | NCCL bus GB/s | ours / NCCL |")
    print("| --- | --- | --- | --- | --- |")
    for r in ar:
        print(f"| {r['ranks']} | {r['mib']:g} | {r['ours_busbw_gbps']:.1f} | {r['nccl_busbw_gbps']:.1f} | {r['ours_over_nccl']:.3f} |")
PY
