#!/usr/bin/env bash
# ddprun --max-restarts when the job fails before its first checkpoint: the relaunch carries
# DDP_RESUME=1, which asks for the newest complete checkpoint *if there is one*; with none yet, train_mlp must
# start from scratch and say so, not refuse "no complete checkpoint" and burn the restart. The run then ends
# exactly as one never interrupted (the same final checkpoint, byte for byte). An explicit --resume of a
# directory without a checkpoint must still be refused.
set -uo pipefail
ddprun="$1"
train="$2"
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/bazel/mpi_env.sh"
work="$session/work"
mkdir -p "$work"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# --checkpoint-every 0 (the default): the only checkpoint is written at the end, after the fault.
args=(--device cpu --hidden 32 --layers 1 --batch-size 32 --log-every 10 --seed 5 --max-steps 20)

"$ddprun" -np 2 -- "$train" "${args[@]}" --checkpoint-dir "$work/clean" >/dev/null 2>&1 || fail "uninterrupted run failed"

out=$(DDP_FAULT_KILL_STEP=5 DDP_FAULT_KILL_RANK=1 "$ddprun" -np 2 --max-restarts 1 -- "$train" "${args[@]}" \
  --checkpoint-dir "$work/restarted" 2>&1)
status=$?
echo "$out" | grep -E "ddprun|fault|scratch|resum|error" | head -8
[ "$status" -eq 0 ] || fail "the restarted job exited $status, expected 0"
grep -q "restart 1 of 1" <<<"$out" || fail "ddprun did not restart"
grep -q "starting from scratch" <<<"$out" || fail "the restart did not say it starts from scratch"
if grep -q "no complete checkpoint" <<<"$out" && ! grep -q "starting from scratch" <<<"$out"; then
  fail "the restart refused for want of a checkpoint"
fi
clean="$work/clean/ckpt-00000020.safetensors"
restarted="$work/restarted/ckpt-00000020.safetensors"
if [ -f "$clean" ] && [ -f "$restarted" ]; then
  cmp -s "$clean" "$restarted" || fail "the run started over ended with different parameters (checkpoints differ)"
else
  fail "missing final checkpoints"
fi

# An explicit --resume still needs a checkpoint.
mkdir -p "$work/empty"
out=$("$ddprun" -np 2 -- "$train" "${args[@]}" --resume "$work/empty" 2>&1)
status=$?
[ "$status" -ne 0 ] || fail "--resume of a directory without a checkpoint exited 0"
grep -q "no complete checkpoint in $work/empty" <<<"$out" || { fail "--resume of an empty directory: no clear refusal"; echo "$out" | tail -5; }

echo "restart without checkpoint: $failures failure(s)"
[ "$failures" -eq 0 ]
