#!/usr/bin/env bash
# A graceful stop of the main job, as a cluster preempts one (SIGTERM to ddprun) or a user asks (Ctrl-C, SIGUSR1):
#   - with a rank inside backward, inside a checkpoint write, or inside the evaluation when the signal comes (a
#     DDP_FAULT_STALL pause holds it there), on 2 and 4 CPU ranks: every rank stops after the same step, a
#     checkpoint of that step is written, ddprun exits 75 and says how long the stop took; resumed, the run ends
#     with the final checkpoint of a run never stopped, byte for byte;
#   - SIGUSR1 to one rank's program (not to ddprun) stops the whole job the same way;
#   - a second signal ends the job at once (exit 143), and --max-restarts never restarts a stopped job.
set -uo pipefail
ddprun="$1"
train="$2"
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/test_harness.sh"
# Batches of 256 per rank: an epoch is 118 steps on 2 ranks and 59 on 4, so the run evaluates before its end.
args=(--hidden 64 --layers 2 --batch-size 256 --log-every 10 --seed 5 --max-steps 150 --checkpoint-every 40)


# The reference: the same run on N ranks, never stopped.
reference() {
  "$ddprun" -np "$1" -- "$train" "${args[@]}" --checkpoint-dir "$work/reference$1" >"$work/reference$1.out" 2>&1 ||
    { fail "the reference run on $1 ranks failed"; cat "$work/reference$1.out"; }
}

# Resumes the stopped run in $2 on $1 ranks to its end and compares its final checkpoint with the reference's.
resume_and_compare() {
  local ranks="$1" dir="$2" name="$3"
  if ! out=$("$ddprun" -np "$ranks" -- "$train" "${args[@]}" --checkpoint-dir "$dir" --resume "$dir" 2>&1); then
    fail "$name: the resumed run failed"
    echo "$out" | tail -20
    return
  fi
  grep -E "resumed from" <<<"$out"
  if ! cmp -s "$work/reference$ranks/ckpt-00000150.safetensors" "$dir/ckpt-00000150.safetensors"; then
    fail "$name: the resumed run's final checkpoint differs from the one of a run never stopped"
  fi
}

# Checks a stopped job's output $2 (ddprun's status $3): exit 75, one step for all, its checkpoint written.
check_stopped() {
  local name="$1" out="$2" status="$3" dir="$4"
  grep -E "stopped|DDP_FAULT_STALL|ddprun:" "$out"
  [ "$status" -eq 75 ] || { fail "$name: ddprun exited $status, expected 75 (stopped)"; tail -30 "$out"; return 1; }
  local step
  step=$(grep -oE "train_mlp: stopped at step [0-9]+" "$out" | grep -oE "[0-9]+$")
  [ -n "$step" ] || { fail "$name: no 'stopped at step' line"; return 1; }
  [ "$step" -lt 150 ] || { fail "$name: stopped only at the end (step $step)"; return 1; }
  [ -f "$dir/$(printf "ckpt-%08d.safetensors" "$step")" ] || { fail "$name: no checkpoint of step $step"; return 1; }
  grep -qE "restart [0-9]+ of" "$out" && { fail "$name: the stopped job was restarted"; return 1; }
  return 0
}

# Stops a run on $1 ranks with SIGTERM to ddprun while rank $2 is paused in phase $3 at step $4.
stop_inside() {
  local ranks="$1" rank="$2" phase="$3" step="$4"
  local name="$ranks ranks, SIGTERM while rank $rank is in $phase" dir="$work/stop-$ranks-$phase"
  DDP_FAULT_STALL="$rank:$phase:$step:2" "$ddprun" -np "$ranks" --max-restarts 2 -- "$train" "${args[@]}" \
    --checkpoint-dir "$dir" >"$dir.out" 2>&1 &
  local pid=$!
  if wait_for_line "$dir.out" "pausing 2 s in"; then
    kill -TERM "$pid"
  else
    fail "$name: the pause never came"
  fi
  wait "$pid"
  local status=$?
  check_stopped "$name" "$dir.out" "$status" "$dir" && resume_and_compare "$ranks" "$dir" "$name"
}

reference 2
reference 4
stop_inside 2 1 backward 30
stop_inside 4 0 checkpoint 40
stop_inside 2 1 evaluation 0
stop_inside 4 3 evaluation 0

# SIGUSR1 to one rank's program.
dir="$work/direct"
DDP_FAULT_STALL="1:forward:25:2" "$ddprun" -np 2 -- "$train" "${args[@]}" --checkpoint-dir "$dir" >"$dir.out" 2>&1 &
pid=$!
if wait_for_line "$dir.out" "pausing 2 s in"; then
  program=$(pgrep -f "^$train .*--checkpoint-dir $dir" | head -1)
  [ -n "$program" ] && kill -USR1 "$program"
fi
wait "$pid"
status=$?
check_stopped "SIGUSR1 to one rank" "$dir.out" "$status" "$dir" && resume_and_compare 2 "$dir" "SIGUSR1 to one rank"
grep -q "a rank was asked to stop" "$dir.out" || fail "SIGUSR1 to one rank: ddprun did not say a rank was asked"

# Two signals: the second ends the job at once.
dir="$work/twice"
DDP_FAULT_STALL="1:backward:20:20" "$ddprun" -np 2 -- "$train" "${args[@]}" --checkpoint-dir "$dir" >"$dir.out" 2>&1 &
pid=$!
wait_for_line "$dir.out" "pausing 20 s in" || fail "two signals: the pause never came"
t0=$(date +%s.%N)
kill -TERM "$pid"
sleep 0.5
kill -TERM "$pid"
wait "$pid"
status=$?
elapsed=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
echo "two signals: ddprun exited $status ${elapsed} s after the first"
[ "$status" -eq 143 ] || { fail "two signals: ddprun exited $status, expected 143"; tail -20 "$dir.out"; }
awk -v e="$elapsed" 'BEGIN { exit !(e < 15) }' || fail "two signals: the job took ${elapsed} s to end"

finish graceful_stop
