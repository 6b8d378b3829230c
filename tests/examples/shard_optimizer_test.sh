#!/usr/bin/env bash
# `train_mlp --shard-optimizer` (and custom_loop's) end to end on the CPU:
#   1. on 2 ranks, with gradient clipping, the sharded run logs bitwise the losses of the unsharded one and writes
#      a byte-identical checkpoint; PyTorch loads it and computes the runtime's test accuracy;
#   2. a checkpoint saved sharded on 4 ranks resumes sharded on 2 and 3 ranks and unsharded on 1: one step later
#      each matches the same resume without sharding (bitwise on 1 and 2 ranks, within 1e-6 on 3, where MPI adds
#      the ranks' gradients in another order: see tests/distributed/zero_test.cc), so the state went where it
#      belongs;
#   3. a resume whose shapes differ is refused on every rank with one message naming the tensor;
#   4. custom_loop, whose loop uses no_sync accumulation, gives the unsharded final_mse on 2 ranks.
set -uo pipefail
ddprun="$1"
train="$2"
checker="$3"
custom="$4"
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/test_harness.sh"
losses() { grep -o '"loss":[^,]*,"lr"' "$1" | grep -v null; }
small=(--hidden 64 --layers 2 --lr 1e-3 --weight-decay 1e-4 --log-every 10 --seed 7 --schedule constant)

# The largest difference between two checkpoints' tensors (same names and shapes required).
max_difference() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import json, struct, sys
import numpy as np
def load(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    return {k: np.frombuffer(data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], dtype=np.float32)
            for k, v in header.items() if k != "__metadata__"}
a, b = load(sys.argv[1]), load(sys.argv[2])
assert sorted(a) == sorted(b), (sorted(a), sorted(b))
print(max(float(np.max(np.abs(a[k].astype(np.float64) - b[k]))) if a[k].size else 0.0 for k in a))
PY
}

# 1. Sharded and unsharded on 2 ranks, gradient clipping on (a tight bound: it clips every step).
for mode in plain sharded; do
  extra=()
  [ "$mode" = sharded ] && extra=(--shard-optimizer)
  out=$("$ddprun" -np 2 -- "$train" "${small[@]}" --batch-size 32 --max-steps 40 --clip-grad-norm 0.05 "${extra[@]}" \
    --checkpoint-dir "$work/$mode" --metrics-file "$work/$mode.jsonl" 2>&1) || fail "$mode run failed: $out"
done
grep -q "optimizer state sharded over 2 rank(s)" <<<"$out" || fail "the sharded run does not say so: $out"
[ -n "$(losses "$work/plain.jsonl")" ] || fail "no losses logged"
[ "$(losses "$work/plain.jsonl")" == "$(losses "$work/sharded.jsonl")" ] || {
  fail "sharded losses differ from unsharded ones"
  diff <(losses "$work/plain.jsonl") <(losses "$work/sharded.jsonl")
}
cmp "$work/plain/ckpt-00000040.safetensors" "$work/sharded/ckpt-00000040.safetensors" \
  || fail "the sharded run's checkpoint is not the unsharded one's bytes"
acc=$(grep -o 'final step=40 test_loss=[0-9.]* test_accuracy=[0-9.]*' <<<"$out" | sed 's/.*test_accuracy=//')
torch_out=$(/usr/bin/python3 "$checker" "$work/sharded/ckpt-00000040.safetensors" /usr/share/datasets/fashion-mnist 64 2 2>&1) \
  || fail "PyTorch could not load the sharded checkpoint: $torch_out"
tacc=$(sed -n 's/^torch_test_accuracy=//p' <<<"$torch_out")
awk -v a="${acc:-0}" -v b="${tacc:-9}" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.0005) }' \
  || fail "PyTorch's accuracy $tacc differs from the runtime's $acc"

# 2. Saved sharded on 4 ranks at step 30 (global sample 1920, which 1, 2 and 3 ranks split evenly).
"$ddprun" -np 4 -- "$train" "${small[@]}" --batch-size 16 --max-steps 30 --shard-optimizer \
  --checkpoint-dir "$work/four" >"$work/four.log" 2>&1 || { fail "4-rank sharded run failed"; tail -5 "$work/four.log"; }
saved="$work/four/ckpt-00000030.safetensors"
[ -f "$saved" ] || fail "no checkpoint from 4 ranks"
resume_one_step() {  # NAME RANKS FLAGS...: resumes $saved in a directory of its own, one step more
  local dir="$work/$1" ranks="$2" out
  shift 2
  mkdir -p "$dir" && cp "$saved" "$dir/"
  out=$("$ddprun" -np "$ranks" -- "$train" "${small[@]}" --batch-size 16 --max-steps 31 --resume "$dir" \
    --checkpoint-dir "$dir" "$@" 2>&1) || fail "$1: resume on $ranks rank(s) failed: $out"
  grep -q "resumed from .*ckpt-00000030.safetensors: step 30" <<<"$out" || fail "$1 did not resume from step 30"
}
for ranks in 1 2 3; do
  resume_one_step "plain$ranks" "$ranks"
  resume_one_step "sharded$ranks" "$ranks" --shard-optimizer
  a="$work/plain$ranks/ckpt-00000031.safetensors"
  b="$work/sharded$ranks/ckpt-00000031.safetensors"
  if [ "$ranks" -le 2 ]; then
    cmp "$a" "$b" || fail "on $ranks rank(s), the step after a sharded resume differs from the unsharded one"
  else
    d=$(max_difference "$a" "$b")
    echo "3 ranks: sharded and unsharded resumes differ by at most $d after one step"
    awk -v d="${d:-1}" 'BEGIN { exit !(d <= 1e-6) }' || fail "on 3 ranks the resumes differ by $d"
  fi
done

# 3. A resume whose shapes differ (--hidden 32 against a checkpoint of 64): refused on every rank, naming it.
if out=$("$ddprun" -np 2 -- "$train" "${small[@]}" --hidden 32 --batch-size 16 --max-steps 31 --shard-optimizer \
  --resume "$work/four" 2>&1); then fail "resumed with other shapes"; fi
grep -q "ranks 0,1: .*tensor 0.weight: shape \[64,784\] does not match the model's \[32,784\]" <<<"$out" \
  || { fail "no message on every rank for a resume with other shapes:"; echo "$out" | tail -5; }

# 4. custom_loop: no_sync accumulation and AdamW sharded, the unsharded final_mse.
a=$(mpirun_shared 2 "$custom" --device cpu --steps 100 2>&1 | grep '^final_mse=') || fail "custom_loop failed"
b=$(mpirun_shared 2 "$custom" --device cpu --steps 100 --shard-optimizer 2>&1 | grep '^final_mse=') || fail "custom_loop --shard-optimizer failed"
[ -n "$a" ] && [ "$a" == "$b" ] || fail "custom_loop: sharded '$b' differs from unsharded '$a'"

finish shard_optimizer
