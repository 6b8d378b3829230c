#!/usr/bin/env bash
# The in-situ surrogate's training step from the application's arrays (bench/surrogate_step.c over the C API:
# synchronous and asynchronous) against PyTorch's step on the same model (5-64-64-1, tanh, AdamW, MSE) and batch:
# eager, and on the GPU with the whole step captured by hand as a CUDA graph (waiting for each step, and reading
# its loss each step); on the GPU ours also without its fused pass (DDP_FUSED_MLP=0: layer by layer), paired
# against it. In one run, alternating ROUNDS times; then each arm's median step and the median of the paired
# ratios arm / ours.
#   DEVICE=cpu bash bench/surrogate_step.sh      this machine: bazel-bin, Debian's PyTorch (/usr/bin/python3)
#   bash bench/surrogate_step.sh                 the GPU machine: .gpu/bin, the machine's PyTorch, device arrays
# Environment: BATCHES ("256 1024"), STEPS (2000), ROUNDS (3), OMP/OpenBLAS threads 1 (one rank, one core).
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cuda}
STEPS=${STEPS:-2000}
ROUNDS=${ROUNDS:-3}
BATCHES=${BATCHES:-256 1024}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
if [ "$DEVICE" = cuda ]; then
  ours=${B:-$PWD/.gpu/bin}/surrogate_step_cuda
  PY=${PY:-python3}
  [ -d /tmp/ddp-gpu-lib/lib ] && export LD_LIBRARY_PATH="/tmp/ddp-gpu-lib/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
else
  ours=$PWD/bazel-bin/bench/surrogate_step
  PY=${PY:-/usr/bin/python3}
fi
torch_step() {  # BATCH
  "$PY" - "$DEVICE" "$1" "$STEPS" <<'PY'
import json, sys, time
import numpy as np
import torch
device, batch, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(1)
torch.manual_seed(3)
model = torch.nn.Sequential(torch.nn.Linear(5, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                            torch.nn.Linear(64, 1)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
i = np.arange(batch * 5)
x_np = (((i * 7919) % 2000) / 1000.0 - 1.0).astype(np.float32).reshape(batch, 5)
y_np = (0.1 * x_np[:, 0] - 0.05 * x_np[:, 2]).astype(np.float32).reshape(batch, 1)
# The application's arrays as tensors without a copy (from_numpy), on the GPU once (its own device arrays).
x, y = torch.from_numpy(x_np).to(device), torch.from_numpy(y_np).to(device)
def step():
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
for _ in range(50):
    step()
sync()
start = time.perf_counter()
for _ in range(steps):
    step()
    sync()  # as ddp_train_step: complete when the call returns
seconds = time.perf_counter() - start
print(json.dumps({"program": "PyTorch eager", "version": torch.__version__, "device": device, "batch": batch,
                  "step_us": round(1e6 * seconds / steps, 2), "loss": float(step().detach())}))
if device == "cuda":
    # The expert's version: the whole step (forward, backward, capturable AdamW) captured by hand as one CUDA
    # graph, replayed; timed waiting for each step, and reading the loss each step as TorchFort's train call does.
    model_g = torch.nn.Sequential(torch.nn.Linear(5, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                  torch.nn.Linear(64, 1)).to(device)
    opt_g = torch.optim.AdamW(model_g.parameters(), lr=1e-3, weight_decay=0.0, capturable=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt_g.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model_g(x), y).backward()
            opt_g.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt_g.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = torch.nn.functional.mse_loss(model_g(x), y)
        static_loss.backward()
        opt_g.step()
    for _ in range(50):
        graph.replay()
    sync()
    for name, read in (("PyTorch graphed", False), ("PyTorch graphed, loss read", True)):
        start = time.perf_counter()
        for _ in range(steps):
            graph.replay()
            if read:
                float(static_loss)
            else:
                sync()
        seconds = time.perf_counter() - start
        print(json.dumps({"program": name, "version": torch.__version__, "device": device, "batch": batch,
                          "step_us": round(1e6 * seconds / steps, 2)}))
PY
}
runs=$(mktemp)
trap 'rm -f "$runs"' EXIT
for ((r = 0; r < ROUNDS; r++)); do
  for batch in $BATCHES; do
    mpirun -np 1 --bind-to none "$ours" "$DEVICE" "$batch" "$STEPS" | grep '^{' >>"$runs"
    if [ "$DEVICE" = cuda ]; then  # the fused pass paired against its removal
      DDP_FUSED_MLP=0 mpirun -np 1 --bind-to none -x DDP_FUSED_MLP "$ours" "$DEVICE" "$batch" "$STEPS" | grep '^{' |
        sed 's/"ddp C API\( async\)*"/"ddp C API\1, layer by layer"/' >>"$runs"
    fi
    torch_step "$batch" | grep '^{' >>"$runs"
  done
done
# Each round's PyTorch step over ours at the same batch, taken next to each other: on a shared machine whose speed
# drifts, the median of these paired ratios is steadier than the ratio of the two medians.
python3 - "$runs" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
arms = ["ddp C API", "ddp C API async", "ddp C API, layer by layer", "ddp C API async, layer by layer",
        "PyTorch eager", "PyTorch graphed", "PyTorch graphed, loss read"]
arms = [a for a in arms if any(r["program"] == a for r in rows)]
versions = sorted({r["version"] for r in rows if "version" in r})
print(f"PyTorch {', '.join(versions)}; each cell: median step, then the median over rounds of that arm / ours (synchronous)")
print("| batch | " + " | ".join(arms) + " |")
print("| --- |" + " --- |" * len(arms))
for batch in sorted({r["batch"] for r in rows}):
    ours = [r["step_us"] for r in rows if r["batch"] == batch and r["program"] == "ddp C API"]
    cells = []
    for arm in arms:
        times = [r["step_us"] for r in rows if r["batch"] == batch and r["program"] == arm]
        ratios = [t / o for o, t in zip(ours, times)]
        cells.append(f"{statistics.median(times):.1f} us" + ("" if arm == "ddp C API" else f", **{statistics.median(ratios):.2f}x**"))
    print(f"| {batch} | " + " | ".join(cells) + " |")
PY
