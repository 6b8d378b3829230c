#!/usr/bin/env bash
# train_mlp's results, bit for bit, against a record: the losses, evaluations and checkpoints of a few short
# runs on 2 ranks that cover its paths (AdamW with a cosine schedule and periodic checkpoints; SGD with GELU,
# clipping and sharded optimizer state; whole epochs with a short last batch; bf16; a resume). The CPU record
# (train_mlp_outputs.cpu.txt) was made by the train_mlp the trainer replaced, so a refactoring of the training
# engine that changes any bit of what a user gets fails here. The CPU record's GEMMs ran on OpenBLAS's Haswell
# kernel, which ddprun gives its ranks wherever OPENBLAS_CORETYPE is unset (docs/settings.md). On the GPU that
# train_mlp and the trainer's first version gave the same bits; the GPU records (train_mlp_outputs.cuda_*.txt,
# jobs in tools/gpu_jobs.txt) were made after the plain Linear path changed the GPU's order of summation.
#
#   train_mlp_outputs_test.sh DDPRUN TRAIN_MLP DIGEST RECORD [EXTRA TRAIN_MLP ARGS...]
#
# RANKS (default 2) sets the world size: on one GPU, 1 rank runs NCCL and the CUDA graph, 2 ranks the MPI backend.
#
# With DDP_RECORD=1 it writes RECORD instead of comparing (how a record is made: at the commit it describes).
set -uo pipefail
ddprun="$1"
train="$2"
digest="$3"
record="$4"
shift 4
extra=("$@")
ranks=${RANKS:-2}
if [ -n "${TEST_SRCDIR:-}" ]; then
  source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/test_harness.sh"
else  # the GPU machine (tools/gpu_jobs.txt), which runs it from the tree without Bazel
  source "$(cd "$(dirname "$0")" && pwd)/../test_harness.sh"
fi
work="$session/outputs"
python=/usr/bin/python3
[ -x "$python" ] || python=python3
mkdir -p "$work"
small=(--hidden 64 --layers 2 --batch-size 32 --log-every 10 --seed 7 "${extra[@]}")

# run NAME ARGS...: one run on $ranks ranks, its digest appended to $work/digest.
run() {
  local name="$1"
  shift
  "$ddprun" -np "$ranks" -- "$train" --metrics-file "$work/$name.jsonl" "$@" >"$work/$name.out" 2>&1
  local status=$?
  [ "$status" -eq 0 ] || { fail "$name exited $status"; tail -20 "$work/$name.out"; }
  {
    echo "run $name"
    "$python" "$digest" "$work/$name.jsonl" "$work/$name.out" $(ls "$work/$name"/ckpt-*.safetensors 2>/dev/null)
  } >>"$work/digest"
}
: >"$work/digest"
run adamw "${small[@]}" --max-steps 60 --checkpoint-dir "$work/adamw" --checkpoint-every 20 --keep-checkpoints 5
run sgd "${small[@]}" --optimizer sgd --activation gelu --schedule constant --clip-grad-norm 0.05 \
  --shard-optimizer --max-steps 40 --checkpoint-dir "$work/sgd"
run epochs --hidden 32 --layers 1 --global-batch-size 512 --epochs 2 --seed 3 --log-every 50 \
  --checkpoint-dir "$work/epochs" "${extra[@]}"
run bf16 "${small[@]}" --precision bf16 --max-steps 30 --checkpoint-dir "$work/bf16"
run first_half "${small[@]}" --max-steps 30 --checkpoint-dir "$work/resumed" --checkpoint-every 10
run second_half "${small[@]}" --max-steps 60 --checkpoint-dir "$work/resumed" --resume "$work/resumed"

if [ "${DDP_RECORD:-0}" = 1 ]; then
  cp "$work/digest" "$record"
  echo "recorded $(wc -l <"$record") lines into $record"
elif ! diff "$record" "$work/digest" >"$work/diff"; then
  fail "the runs' results differ from the record $(basename "$record") (< record, > now):"
  head -40 "$work/diff"
fi
[ "$(grep -c '^checkpoint .* tensor ' "$work/digest")" -gt 0 ] || fail "no checkpoint tensors in the digest"
echo "$(wc -l <"$work/digest") digest lines compared"
finish train_mlp_outputs
