#!/usr/bin/env bash
# The main job's whole run (train_mlp's default recipe, 30 epochs of Fashion-MNIST, one GPU) under several
# settings or binaries, paired in one run: each round runs every arm one after the other, so that the machine's
# drift falls on all arms alike. Prints each arm's median time to the final accuracy line, its wall time to exit,
# its training step and its accuracy, and the ratios to the first arm. What a switch or a fast path buys is the
# ratio of the arm without it.
#
#   bash bench/main_job_ab.sh 'new' 'old@/tmp/old'          (LABEL[@BINARY_DIR][=VAR=value ...])
#   bash bench/main_job_ab.sh 'nccl' 'mpi=DDP_BACKEND=mpi'
#
# Environment: ROUNDS (3), B (the default binaries, .gpu/bin), DDP_GPU_DATA (.gpu/data), ARGS (more train_mlp
# arguments for every arm, e.g. "--precision bf16"), OUT (where main_job_ab.jsonl goes, /tmp).
# DEVICE=cpu NP=2 runs the arms on 2 CPU ranks of this machine (B then bazel-bin/examples, the installed data).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
  echo "usage: bench/main_job_ab.sh ARM [ARM ...]   (an ARM is LABEL[@BINARY_DIR][=VAR=value ...])" >&2
  exit 2
fi
DEVICE=${DEVICE:-cuda}
NP=${NP:-1}
if [ "$DEVICE" = cuda ]; then
  B=${B:-$PWD/.gpu/bin}
  data=${DDP_GPU_DATA:-$PWD/.gpu/data}
  bind=none
else
  B=${B:-$PWD/bazel-bin/examples}
  data=${DDP_GPU_DATA:-/usr/share/datasets/fashion-mnist}
  bind=core  # as ddprun binds ranks on a machine with a core for each
fi
ROUNDS=${ROUNDS:-3}
out="${OUT:-/tmp}/main_job_ab.jsonl"
: >"$out"
[ -d /tmp/ddp-gpu-lib/lib ] && export LD_LIBRARY_PATH="/tmp/ddp-gpu-lib/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for round in $(seq "$ROUNDS"); do
  for arm in "$@"; do
    head=${arm%%=*}
    settings=""
    [ "$head" != "$arm" ] && settings=${arm#*=}
    label=${head%%@*}
    bin=$B
    [ "$label" != "$head" ] && bin=${head#*@}
    t0=$EPOCHREALTIME
    # shellcheck disable=SC2086 # the arm's assignments and ARGS are word lists
    log=$(env $settings mpirun -np "$NP" --bind-to "$bind" "$bin/train_mlp" --device "$DEVICE" --data "$data" ${ARGS:-} 2>&1 |
          tr '\r' '\n' | while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done)
    t1=$EPOCHREALTIME
    final=$(grep -E 'final step=[0-9]+ test_loss=[0-9.]+ test_accuracy=[0-9.]+' <<<"$log" | tail -1)
    if [ -z "$final" ]; then
      echo "FAILED: round $round, arm '$arm':" >&2
      tail -5 <<<"$log" >&2
      continue
    fi
    step_us=$(grep -o '([0-9.]* us each)' <<<"$log" | tail -1 | tr -dc '0-9.')
    python3 -c 'import json, sys
a = sys.argv
print(json.dumps({"arm": a[1], "round": int(a[2]), "to_final_s": float(a[4]) - float(a[3]),
                  "to_exit_s": float(a[5]) - float(a[3]), "step_us": float(a[6] or "nan"),
                  "test_accuracy": float(a[7])}))' "$label" "$round" "$t0" "${final%% *}" "$t1" "$step_us" \
      "$(grep -o 'test_accuracy=[0-9.]*' <<<"$final" | cut -d= -f2)" >>"$out"
  done
done
python3 - "$out" "$@" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
labels = [a.split("=", 1)[0].split("@", 1)[0] for a in sys.argv[2:]]
print("| arm | to the final accuracy line | to exit | step | test accuracy |")
print("| --- | --- | --- | --- | --- |")
base = {}
for label in labels:
    mine = [r for r in rows if r["arm"] == label]
    if not mine:
        print(f"| {label} | failed | | | |")
        continue
    cells = []
    for key, unit, fmt in (("to_final_s", "s", "{:.2f}"), ("to_exit_s", "s", "{:.2f}"), ("step_us", "us", "{:.1f}")):
        m = statistics.median(r[key] for r in mine)
        base.setdefault(key, m)
        ratio = "" if label == labels[0] else f", {m / base[key]:.3f}x"
        cells.append(f"{fmt.format(m)} {unit}{ratio}")
    accs = sorted(r["test_accuracy"] for r in mine)
    print(f"| {label} | " + " | ".join(cells) + f" | {accs[0]:.4f}-{accs[-1]:.4f} |")
print(f"(medians of {max(r['round'] for r in rows)} rounds; ratios against the first arm; raw lines in {sys.argv[1]})")
PY
