#!/usr/bin/env bash
# A rank that dies (SIGKILL) mid-training:
#   - without restarts, every other rank ends within 60 s (the time is printed), and ddprun exits non-zero
#     naming the rank that died;
#   - with --max-restarts 1, ddprun relaunches from the newest complete checkpoint and the run ends with the
#     same parameters as a run never interrupted: its final checkpoint is byte for byte the same file.
set -uo pipefail
ddprun="$1"
train="$2"
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/bazel/mpi_env.sh"
work="$session/work"
mkdir -p "$work"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
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
"$ddprun" -np 2 -- "$train" "${args[@]}" --checkpoint-dir "$work/clean" >/dev/null 2>&1 || fail "uninterrupted run failed"
out=$(DDP_FAULT_KILL_STEP=35 DDP_FAULT_KILL_RANK=1 "$ddprun" -np 2 --max-restarts 1 -- "$train" "${args[@]}" \
  --checkpoint-dir "$work/restarted" 2>&1)
status=$?
echo "$out" | grep -E "ddprun|resumed|final" | head -5
[ "$status" -eq 0 ] || fail "the restarted job exited $status"
grep -q "restart 1 of 1" <<<"$out" || fail "ddprun did not restart"
grep -q "resumed from .*ckpt-00000030.safetensors: step 30" <<<"$out" || fail "the restart did not resume from step 30"
clean="$work/clean/ckpt-00000060.safetensors"
restarted="$work/restarted/ckpt-00000060.safetensors"
if [ -f "$clean" ] && [ -f "$restarted" ]; then
  cmp -s "$clean" "$restarted" || fail "the restarted run ended with different parameters (checkpoints differ)"
else
  fail "missing final checkpoints"
fi
echo "rank failure: $failures failure(s)"
[ "$failures" -eq 0 ]
