#!/usr/bin/env bash
# Device time of each kernel of our training step, from Nsight Compute with the clocks and the caches left as
# they are (ncu's default flushes L2 before every kernel, which inflates the small step's kernels, whose weights
# and activations stay in L2 from one kernel to the next): where the time of a step goes, kernel by kernel (GEMMs
# by cuBLASLt kernel name, with tile shapes). Kernels run serialised under ncu, so the sum does not count the gaps
# between them; against the step's own time it tells how much of a step is kernels and how much is between them.
#   bash bench/profile_gpu.sh [sizes] [batch] [precision] [extra step_bench flags...]
# On the GPU machine, from the repository root, after tools/gpu_bundle.sh; prints one line per kernel of one
# step (after warm-up) and the total. Raw CSV: ${OUT:-/tmp}/profile_gpu.csv.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${B:-$PWD/.gpu/bin}
if [ -f .gpu/lib.tar.xz ] && [ ! -d /tmp/ddp-gpu-lib ]; then mkdir -p /tmp/ddp-gpu-lib && tar -C /tmp/ddp-gpu-lib -xJf .gpu/lib.tar.xz; fi
export LD_LIBRARY_PATH="/tmp/ddp-gpu-lib/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "profile_gpu: ncu not found" >&2; exit 1; }
sizes=${1:-784,1024,1024,10}
batch=${2:-256}
precision=${3:-fp32}
shift $(($# < 3 ? $# : 3))
csv="${OUT:-/tmp}/profile_gpu.csv"
# 6 warm-up steps, then the profiled window: the kernels of the last step are those after the 6th SGD kernel.
"$ncu" --clock-control none --cache-control none --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second --csv --print-units base \
  mpirun -np 1 --bind-to none "$B/step_bench" --sizes "$sizes" --batch "$batch" --device cuda \
  --precision "$precision" --warmup 6 --iters 1 --repeats 1 --stats-iters 0 "$@" >"$csv" 2>"$csv.err"
rc=$?
python3 - "$csv" <<'PY'
import csv, io, sys
text = open(sys.argv[1]).read()
rows = list(csv.DictReader(io.StringIO(text[text.find('"ID"'):])))
kernels = [(r["Kernel Name"], float(r["Metric Value"].replace(",", "")) / 1000.0) for r in rows
           if r.get("Metric Name") == "gpu__time_duration.sum"]
# The step is the span after the second-to-last optimizer kernel up to the last one.
ends = [i for i, (n, _) in enumerate(kernels) if "sgd_kernel" in n or "adamw_kernel" in n]
first = ends[-2] + 1 if len(ends) >= 2 else 0
last = ends[-1] + 1 if ends else len(kernels)
total = 0.0
for name, us in kernels[first:last]:
    total += us
    print(f"{us:9.1f} us  {name[:150]}")
print(f"{total:9.1f} us  total of {last - first} kernels (serialised)")
PY
exit $rc
