#!/usr/bin/env bash
# A rank that dies (SIGKILL) mid-training:
#   - without restarts, every other rank ends within 60 s (the time is printed), and ddprun exits non-zero
#     naming the rank that died;
#   - with --max-restarts 1, ddprun relaunches from the newest complete checkpoint and the run ends with the
#     same parameters as a run never interrupted: its final checkpoint is byte for byte the same file;
#   - when it dies before the first checkpoint, the relaunch (DDP_RESUME=1 asks for the newest checkpoint *if
#     there is one*) starts from scratch and says so, instead of refusing and burning the restart, and ends as
#     a run never interrupted; an explicit --resume of a directory without a checkpoint is still refused.
set -uo pipefail
ddprun="$1"
train="$2"
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/test_harness.sh"
# restarted_run NAME KILL_STEP ARGS...: the run of ARGS uninterrupted into $work/NAME-clean, then with rank 1 killed
# at KILL_STEP and --max-restarts 1 into $work/NAME-restarted, which must exit 0 after one restart; out and status
# are the restarted job's.
restarted_run() {
  local name="$1" kill_step="$2"
  shift 2
  "$ddprun" -np 2 -- "$train" "$@" --checkpoint-dir "$work/$name-clean" >/dev/null 2>&1 \
    || fail "uninterrupted run failed"
  out=$(DDP_FAULT_KILL_STEP="$kill_step" DDP_FAULT_KILL_RANK=1 "$ddprun" -np 2 --max-restarts 1 -- "$train" "$@" \
    --checkpoint-dir "$work/$name-restarted" 2>&1)
  status=$?
  echo "$out" | grep -E "ddprun|fault|scratch|resum|final|error" | head -8
  [ "$status" -eq 0 ] || fail "the restarted job exited $status"
  grep -q "restart 1 of 1" <<<"$out" || fail "ddprun did not restart"
}
# same_final_checkpoint NAME CHECKPOINT: restarted_run NAME's two runs wrote CHECKPOINT byte for byte the same.
same_final_checkpoint() {
  local clean="$work/$1-clean/$2" restarted="$work/$1-restarted/$2"
  if [ -f "$clean" ] && [ -f "$restarted" ]; then
    cmp -s "$clean" "$restarted" || fail "the restarted run ended with different parameters (checkpoints differ)"
  else
    fail "missing final checkpoints"
  fi
}
args=(--hidden 64 --layers 2 --batch-size 32 --log-every 10 --seed 3 --max-steps 60 --checkpoint-every 10)

# 1. Death without restarts.
start=$(date +%s.%N)
out=$(DDP_FAULT_KILL_STEP=35 DDP_FAULT_KILL_RANK=1 DDP_FAULT_KILL_STAMP="$work/death" \
  "$ddprun" -np 2 -- "$train" "${args[@]}" --checkpoint-dir "$work/dead" 2>&1)
status=$?
end=$(date +%s.%N)
echo "$out" | grep -E "ddprun|fault|fatal" | head -5
[ "$status" -ne 0 ] || fail "the job exited 0 although rank 1 died"
grep -q "ddprun: job failed (rank 1 first, signal 9)" <<<"$out" || fail "ddprun did not name rank 1 as the first failure"
if [ -f "$work/death" ]; then
  elapsed=$(awk -v a="$(cat "$work/death")" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
  echo "rank death to job end: ${elapsed} s"
  awk -v e="$elapsed" 'BEGIN { exit !(e < 60) }' || fail "the job took ${elapsed} s to end after rank 1 died"
else
  fail "the fault was not injected"
fi

# 2. The same death with a restart, against an uninterrupted run.
restarted_run late 35 "${args[@]}"
grep -q "resumed from .*ckpt-00000030.safetensors: step 30" <<<"$out" || fail "the restart did not resume from step 30"
same_final_checkpoint late ckpt-00000060.safetensors

# 3. A death before the first checkpoint (--checkpoint-every 0, the default: the only one is written at the end).
early=(--device cpu --hidden 32 --layers 1 --batch-size 32 --log-every 10 --seed 5 --max-steps 20)
restarted_run early 5 "${early[@]}"
grep -q "starting from scratch" <<<"$out" || fail "the restart did not say it starts from scratch"
if grep -q "no complete checkpoint" <<<"$out" && ! grep -q "starting from scratch" <<<"$out"; then
  fail "the restart refused for want of a checkpoint"
fi
same_final_checkpoint early ckpt-00000020.safetensors

# 4. An explicit --resume still needs a checkpoint.
mkdir -p "$work/empty"
out=$("$ddprun" -np 2 -- "$train" "${early[@]}" --resume "$work/empty" 2>&1)
status=$?
[ "$status" -ne 0 ] || fail "--resume of a directory without a checkpoint exited 0"
grep -q "no complete checkpoint in $work/empty" <<<"$out" || { fail "--resume of an empty directory: no clear refusal"; echo "$out" | tail -5; }

finish rank_failure
