#!/usr/bin/env bash
# The main job on a user's own data, under ddprun with 2 CPU ranks:
#   - a regression (2 float targets per row) from .npy files trains with tanh and mse to a stated test loss;
#   - stopped at step 30 and resumed, it gives bitwise the losses of a run never stopped; a checkpoint of 2 ranks
#     resumes on 3 with the same global batch;
#   - classification from a .safetensors file of integer labels trains with cross-entropy, writing TensorBoard
#     events and an ONNX model that ONNX's checker takes;
#   - a damaged data file, mismatched arrays, a loss that does not fit the targets, a fresh run into another
#     run's checkpoint directory and a resume of another model are each refused with a message that says what
#     to do, and a non-zero exit.
set -uo pipefail
ddprun="$1"
train="$2"
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/test_harness.sh"
expect_error() {  # NAME EXPECTED NP ARGS...
  local name="$1" expected="$2" np="$3"
  shift 3
  local out
  if out=$("$ddprun" -np "$np" -- "$train" "$@" 2>&1); then fail "$name: exited 0"; fi
  grep -qF -- "$expected" <<<"$out" || { fail "$name: expected '$expected' in:"; echo "$out" | head -20; }
}

/usr/bin/python3 - "$work" <<'PY' || fail "could not write the data files"
import sys, numpy as np
work = sys.argv[1]
rng = np.random.default_rng(0)
def regression(n, path):
    import os
    os.makedirs(path, exist_ok=True)
    x = rng.uniform(-2, 2, size=(n, 3)).astype(np.float32)
    y = np.stack([np.sin(x[:, 0]) + 0.5 * x[:, 1] ** 2, x[:, 2] * x[:, 0]], 1)  # float64: converted on read
    np.save(path + "/features.npy", x)
    np.save(path + "/targets.npy", y)
regression(4096, work + "/train")
regression(1024, work + "/test")
# Classes from a safetensors file (written by hand: the format is a length, a JSON header and the bytes).
import json, struct
x = rng.normal(size=(2000, 4)).astype(np.float32)
labels = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + 2 * (x[:, 2] > 0.5)
def save(path, tensors):
    header, data = {}, b""
    for name, a in tensors.items():
        header[name] = {"dtype": {"float32": "F32", "int64": "I64"}[str(a.dtype)], "shape": list(a.shape),
                        "data_offsets": [len(data), len(data) + a.nbytes]}
        data += a.tobytes()
    h = json.dumps(header).encode()
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + data)
save(work + "/classes.safetensors", {"features": x, "targets": labels})
save(work + "/classes_test.safetensors", {"features": x[:500], "targets": labels[:500]})
# Damaged files.
import os, shutil
os.makedirs(work + "/truncated", exist_ok=True)
raw = open(work + "/train/features.npy", "rb").read()
open(work + "/truncated/features.npy", "wb").write(raw[:-100])
shutil.copy(work + "/train/targets.npy", work + "/truncated/targets.npy")
os.makedirs(work + "/mismatched", exist_ok=True)
shutil.copy(work + "/train/features.npy", work + "/mismatched/features.npy")
np.save(work + "/mismatched/targets.npy", np.zeros((100, 2), np.float32))
PY

reg=(--data "$work/train" --test-data "$work/test" --hidden 64 --layers 2 --activation tanh --batch-size 32
  --lr 3e-3 --schedule constant --log-every 10 --seed 5)

# 1. Regression to a test loss below 0.05 (the targets' variance is about 1.2).
out=$("$ddprun" -np 2 -- "$train" "${reg[@]}" --epochs 4 2>&1) || fail "regression run failed: $out"
echo "$out" | tail -3
loss=$(sed -n 's/.*final step=[0-9]* test_loss=\([0-9.]*\).*/\1/p' <<<"$out")
[ -n "$loss" ] || fail "no final test_loss line"
awk -v l="${loss:-9}" 'BEGIN { exit !(l < 0.05) }' || fail "regression test loss $loss is not below 0.05"
grep -q "test_accuracy" <<<"$out" && fail "a regression reports an accuracy"
grep -q "MLP 3-64-64-2" <<<"$out" || fail "the model's sizes do not come from the data (3 features, 2 targets)"

# 2. Resume: 60 steps at once, or 30 then a resume to 60, bitwise the same losses; then on 3 ranks.
losses() { grep -o '"loss":[^,]*' "$1"; }
"$ddprun" -np 2 -- "$train" "${reg[@]}" --max-steps 60 --metrics-file "$work/full.jsonl" >/dev/null 2>&1 \
  || fail "uninterrupted run failed"
"$ddprun" -np 2 -- "$train" "${reg[@]}" --max-steps 30 --checkpoint-dir "$work/ckpt" --checkpoint-every 10 \
  --metrics-file "$work/part.jsonl" >/dev/null 2>&1 || fail "first half failed"
out=$("$ddprun" -np 2 -- "$train" "${reg[@]}" --max-steps 60 --checkpoint-dir "$work/ckpt" --resume "$work/ckpt" \
  --metrics-file "$work/part.jsonl" 2>&1) || fail "resumed run failed: $out"
grep -q "resumed from .*ckpt-00000030.safetensors: step 30" <<<"$out" || fail "did not resume from step 30: $out"
[ "$(losses "$work/full.jsonl")" == "$(losses "$work/part.jsonl")" ] || fail "resumed losses differ from the uninterrupted run"
[ "$(losses "$work/full.jsonl" | wc -l)" -eq 6 ] || fail "expected 6 logged losses"
mkdir -p "$work/three" && cp "$work/ckpt/ckpt-00000030.safetensors" "$work/three/"
out=$("$ddprun" -np 3 -- "$train" "${reg[@]}" --max-steps 60 --checkpoint-dir "$work/three" --resume "$work/three" 2>&1) \
  || fail "resume on 3 ranks failed: $out"
grep -q "written on 2 ranks, continuing on 3" <<<"$out" || fail "resume on 3 ranks did not say so: $out"
grep -q "final step=60" <<<"$out" || fail "resume on 3 ranks did not reach step 60: $out"

# 3. Classes from a safetensors file.
out=$("$ddprun" -np 2 -- "$train" --data "$work/classes.safetensors" --test-data "$work/classes_test.safetensors" \
  --hidden 32 --layers 1 --batch-size 50 --epochs 3 --lr 1e-2 --log-every 20 --tensorboard-dir "$work/tb" \
  --onnx "$work/model.onnx" 2>&1) || fail "classification run failed: $out"
acc=$(sed -n 's/.*final step=[0-9]* test_loss=[0-9.]* test_accuracy=\([0-9.]*\).*/\1/p' <<<"$out")
awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 0.9) }' || fail "classification accuracy $acc below 0.9"
grep -q "MLP 4-32-4" <<<"$out" || fail "4 features and 4 classes should make a 4-32-4 MLP: $out"
# Its artefacts: TensorBoard events with the training and test scalars, and an ONNX model ONNX's checker takes.
events=$(ls "$work"/tb/events.out.tfevents.* 2>/dev/null | head -1)
[ -n "$events" ] || fail "no TensorBoard events file in $work/tb"
for tag in train/loss train/lr train/samples_per_s test/loss test/accuracy; do
  grep -aq "$tag" "$events" 2>/dev/null || fail "the TensorBoard events have no $tag"
done
/usr/bin/python3 -c "import onnx, sys; onnx.checker.check_model(onnx.load(sys.argv[1]), full_check=True)" \
  "$work/model.onnx" || fail "ONNX's checker refuses the exported model"

# 4. Refusals.
cp "$work/train/features.npy" "$work/refused_features.npy"
expect_error "truncated" "truncated/features.npy" 2 --data "$work/truncated" --max-steps 1
expect_error "mismatched rows" "targets have shape [100, 2]; expected [4096] or [4096, W]" 2 --data "$work/mismatched" --max-steps 1
expect_error "loss that does not fit" "the loss is cross-entropy but the training set has float targets" 2 \
  "${reg[@]}" --loss cross-entropy --max-steps 1
expect_error "bf16 with tanh" "bf16 precision takes relu or gelu" 2 "${reg[@]}" --precision bf16 --max-steps 1
expect_error "another run's directory" "already holds another run's checkpoints" 2 "${reg[@]}" --max-steps 1 \
  --checkpoint-dir "$work/ckpt"
expect_error "another model" "does not match the model's" 2 "${reg[@]}" --hidden 32 --max-steps 70 --resume "$work/ckpt"
expect_error "seed past 2^64" "must be at most 18446744073709551615" 2 "${reg[@]}" --seed 99999999999999999999999
expect_error "one file for two outputs" "--metrics-file and --trace-file name the same file" 2 "${reg[@]}" \
  --max-steps 1 --metrics-file "$work/same.out" --trace-file "$work/same.out"
# Outputs are files, not strings: the same file however it is written, the data's own files, a checkpoint.
expect_error "one file written two ways" "--metrics-file and --onnx name the same file" 2 "${reg[@]}" \
  --max-steps 1 --metrics-file "$work/m.jsonl" --onnx "$work/./m.jsonl"
expect_error "ONNX over the training data" "--onnx $work/train/./features.npy is the data file" 2 "${reg[@]}" \
  --max-steps 1 --onnx "$work/train/./features.npy"
expect_error "metrics over the test targets" "is the data file $work/test/targets.npy" 2 "${reg[@]}" \
  --max-steps 1 --metrics-file "$work/test/targets.npy"
saved=$(ls "$work/ckpt" | grep '^ckpt-' | head -1)
expect_error "metrics over a checkpoint" "is a checkpoint directory's own file" 2 "${reg[@]}" --max-steps 70 \
  --resume "$work/ckpt" --checkpoint-dir "$work/ckpt" --metrics-file "$work/ckpt/$saved"
[ -f "$work/train/features.npy" ] && cmp -s "$work/train/features.npy" "$work/refused_features.npy" ||
  fail "a refused run changed the training data"

finish own_data
