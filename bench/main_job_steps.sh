#!/usr/bin/env bash
# The main job's step in isolation, on the GPU machine: bench/step_bench on train_mlp's model (784-512-512-10,
# batch 128) with SGD and with AdamW, each eager and as a CUDA graph, with and without DDP (NCCL, world size
# 1), in one run, then a table. It answers two questions in the same run: what DDP's host work
# adds to an eager step (eager DDP against eager without, alternating in one run), and how close train_mlp's steady-state step (its
# "time:" line: steps / training seconds) comes to the graphed step here.
#   bash bench/main_job_steps.sh        (from the repository root; binaries from .gpu/bin)
set -uo pipefail
cd "$(dirname "$0")/.."
B=${B:-$PWD/.gpu/bin}
[ -d /tmp/ddp-gpu-lib/lib ] && export LD_LIBRARY_PATH="/tmp/ddp-gpu-lib/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
out="${OUT:-/tmp}/main_job_steps.jsonl"
: >"$out"
common=(--sizes 784,512,512,10 --batch 128 --device cuda --warmup 50 --iters 200 --repeats 15)
for opt in sgd adamw; do
  # Eager: one run timing the step with DDP and without in alternating repeats (--ddp-ab), so that the host's
  # drift from run to run, larger than DDP's cost, falls on both alike. Graphs: one run each.
  for mode in --ddp-ab --graph "--ddp --graph"; do
    line=$(mpirun -np 1 --bind-to none "$B/step_bench" "${common[@]}" --optimizer "$opt" $mode 2>/dev/null | grep '^{' | tail -1)
    [ -n "$line" ] && echo "$line" >>"$out" || echo "FAILED: step_bench --optimizer $opt $mode" >&2
  done
done
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def row(opt, **want):
    for r in rows:
        if r.get("optimizer") == opt and all(k in r if v is None else bool(r.get(k)) == v for k, v in want.items()):
            return r
    return {}
print("| optimizer | eager | eager + DDP | DDP's host cost (paired median) | graph | graph + DDP |")
print("| --- | --- | --- | --- | --- | --- |")
for opt in ("sgd", "adamw"):
    ab = row(opt, ddp_overhead=None)
    e, ed = ab.get("step_us_no_ddp"), ab.get("step_us")
    g, gd = row(opt, ddp=False, graph=True).get("step_us"), row(opt, ddp=True, graph=True).get("step_us")
    cost = f"{ab['ddp_overhead_paired'] * 100:+.1f}%" if ab else "-"
    f = lambda v: f"{v:.1f} us" if v else "-"
    print(f"| {opt} | {f(e)} | {f(ed)} | {cost} | {f(g)} | {f(gd)} |")
PY
