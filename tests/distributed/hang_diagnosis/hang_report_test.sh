#!/usr/bin/env bash
# What a hung job says. Four ranks of hang_job (a small training job; see hang_job.cc), one of them made to hang:
#   data | forward | backward | optimizer | checkpoint | evaluation | user
#             the rank stalls in that phase (DDP_FAULT_STALL): the job must end within the collective timeout
#             plus a few seconds, with one report naming that rank, its last collective, its phase and step, and
#             what the others wait in (the collective after its last one); the evaluation case runs under ddprun,
#             which must name the rank that is behind as the one that failed first;
#   stopped   the rank stops itself (SIGSTOP): it is named as not answering; stopped_rank0 the same of rank 0,
#             the first asked to report (the next one reports at once);
#   mismatch  under DDP_DEBUG=collectives a rank issues a broadcast where the others all-reduce: the job fails at
#             once (long before the timeout) naming both sides;
#   dump      `ddprun --dump PID` while the job runs: every rank prints its flight recorder, the job goes on;
#   never_start rank 2 never makes its session: the others end the job from the start's first collective;
#   stopped_before_mpi rank 2 stops itself before it starts MPI, the others wait in MPI_Init: ddprun names it
#             after the start's deadline (DDP_COLLECTIVE_TIMEOUT_S, at least 10 s) and ends the job;
#   suspended Ctrl-Z (SIGTSTP) on ddprun for twice the timeout, then SIGCONT: the whole job stops and goes on,
#             and ends well, with no hang report.
# Usage: hang_report_test.sh CASE HANG_JOB DDPRUN [ARGS...]  (ARGS go to hang_job, e.g. --device cuda; DDPRUN "-"
# when there is none: the dump is then SIGUSR2 to mpirun, and the evaluation case runs under mpirun).
# HANG_TIMEOUT_S sets the collective timeout (default 2 s; ranks that start slowly, as 4 ranks on one GPU, need
# more, since the start-up's own agreements have the deadline too).
set -uo pipefail
case_name=$1
job=$2
ddprun=$3
shift 3
if [ -n "${TEST_SRCDIR:-}" ]; then
  source "${TEST_SRCDIR}/${TEST_WORKSPACE}/bazel/mpi_env.sh"
else
  source "$(cd "$(dirname "$0")" && pwd)/../../../bazel/mpi_env.sh"
fi
timeout_s=${HANG_TIMEOUT_S:-2}
export DDP_COLLECTIVE_TIMEOUT_S=$timeout_s DDP_FAULT_STALL= DDP_DEBUG=
mpirun=(mpirun -np 4 --oversubscribe --bind-to none -x DDP_COLLECTIVE_TIMEOUT_S -x DDP_FAULT_STALL -x DDP_DEBUG)
log="$session/output"
job_args=(--checkpoint-dir "$session/checkpoints" "$@")

fail() {
  echo "FAIL ($case_name): $*"
  exit 1
}

# Runs COMMAND..., each output line stamped with the time it arrived (so that the time from the stall to the
# job's end can be measured); prints the output; sets `status`, `finished` (when it ended) and `out`.
run() {
  "$@" 2>&1 | while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done >"$log"
  status=${PIPESTATUS[0]}
  finished=$EPOCHREALTIME
  out=$(cut -d' ' -f2- "$log")
  echo "$out"
  echo "exit status $status"
}

# Waits up to 30 s for a line matching PATTERN in the log of a job running in the background; fails with WHAT
# (and the log) if none comes.
wait_for_line() {
  local pattern=$1 what=$2
  for _ in $(seq 300); do
    grep -q "$pattern" "$log" && return 0
    sleep 0.1
  done
  cat "$log"
  fail "$what"
}

# Seconds from the first line matching PATTERN to the job's end.
seconds_since() {
  local at
  at=$(grep -m1 -E "$1" "$log" | cut -d' ' -f1)
  [ -n "$at" ] || fail "no line matches '$1'"
  awk -v a="$at" -v b="$finished" 'BEGIN { printf "%.1f", b - a }'
}

# The stall cases: RANK PHASE STEP and the report's expected line (an extended regular expression); the
# collective the others wait in must be the one after the behind rank's last.
expect_stall_report() {
  local rank=$1 report=$2
  out=$(sed -E 's/^\[rank [0-9]+\] //' <<<"$out")  # as ddprun prefixes them
  [ "$status" -ne 0 ] || fail "the job exited 0"
  [ "$(grep -c "Where the ranks are:" <<<"$out")" -eq 1 ] || fail "not exactly one report"
  grep -qE "error: rank [0-9]'s .* did not complete within $timeout_s s \(DDP_COLLECTIVE_TIMEOUT_S\); the job is ended. Where the ranks are:" <<<"$out" ||
    fail "no report header naming the collective that timed out"
  local line
  line=$(grep -E "^  $report" <<<"$out") || fail "no report line matching: $report"
  if grep -q "is behind" <<<"$line"; then
    local last waited stalled_for
    last=$(sed -nE 's/.*last collective #([0-9]+).*/\1/p' <<<"$line")
    waited=$(sed -nE 's/.* wait in #([0-9]+).*/\1/p' <<<"$line")
    [ "$waited" -eq $((last + 1)) ] || fail "the others wait in #$waited, not in the collective after #$last"
    stalled_for=$(sed -nE 's/.* for ([0-9.]+) s;.*/\1/p' <<<"$line")
    awk -v s="$stalled_for" -v t="$timeout_s" 'BEGIN { exit !(s >= t - 0.5) }' || fail "rank $rank in its phase for only $stalled_for s"
  fi
  local took
  took=$(seconds_since "(rank $rank: |\\[rank $rank\\] )fault injection")  # under mpirun, under ddprun
  echo "the job ended ${took} s after rank $rank stalled (timeout $timeout_s s)"
  awk -v t="$took" -v limit="$timeout_s" 'BEGIN { exit !(t <= limit + 6) }' || fail "the job ended ${took} s after the stall"
}

# stall_case RANK:PHASE:STEP[:stop] REPORT [LAUNCHER...]: runs the job with that rank stalled (DDP_FAULT_STALL),
# under mpirun or LAUNCHER, and expects REPORT.
stall_case() {
  local stall=$1 report=$2
  shift 2
  local launcher=("$@")
  [ ${#launcher[@]} -gt 0 ] || launcher=("${mpirun[@]}")
  DDP_FAULT_STALL=$stall run "${launcher[@]}" "$job" "${job_args[@]}"
  expect_stall_report "${stall%%:*}" "$report"
}

n='[0-9]+'
behind_from_agree="last collective #$n \(World::agree of 1 int32, step 2\)"
bucket3_step3="last collective #$n \(MPI_Allreduce of $n float32, bucket 3 of 4, step 3\)"
bucket0="wait in #$n \(MPI_Allreduce of $n float32, bucket 0 of 4, step 3\)"
sum_step3="wait in #$n \(World::sum of 1 float64, step 3\)"
stopped="stopped: SIGSTOP, Ctrl-Z or a debugger"
case "$case_name" in
  data) stall_case 2:data:2 "rank 2 is behind: $behind_from_agree, in data loading for [0-9.]+ s; ranks 0,1,3 $bucket0$" ;;
  forward) stall_case 1:forward:2 "rank 1 is behind: $behind_from_agree, in forward for [0-9.]+ s; ranks 0,2,3 $bucket0$" ;;
  backward) stall_case 3:backward:2 "rank 3 is behind: $behind_from_agree, in backward for [0-9.]+ s; ranks 0,1,2 $bucket0$" ;;
  optimizer) stall_case 3:optimizer:3 "rank 3 is behind: $bucket3_step3, in optimizer step for [0-9.]+ s; ranks 0,1,2 $sum_step3$" ;;
  checkpoint)
    stall_case 0:checkpoint:2 "rank 0 is behind: last collective #$n \(MPI_Allreduce of $n float32, bucket 3 of 4, step 2\), in checkpoint I/O for [0-9.]+ s; ranks 1,2,3 wait in #$n \(World::agree of 1 int32, step 2\)$"
    ;;
  evaluation)
    report="rank 1 is behind: $bucket3_step3, in evaluation for [0-9.]+ s; ranks 0,2,3 $sum_step3$"
    if [ "$ddprun" = - ]; then
      stall_case 1:evaluation:3 "$report"
    else
      stall_case 1:evaluation:3 "$report" "$ddprun" -np 4 --
      grep -q "^ddprun: job failed (rank 1 first" <<<"$out" || fail "ddprun did not name rank 1 as the one that failed first"
    fi
    ;;
  user) stall_case 3:user:3 "rank 3 is behind: $bucket3_step3, in user code for [0-9.]+ s; ranks 0,1,2 $sum_step3$" ;;
  stopped)
    stall_case 2:data:2:stop "rank 2 did not answer \($stopped\); ranks 0,1,3 $bucket0$"
    ;;
  stopped_rank0)
    # Rank 0, the first asked to make the report, cannot: the next rank makes it at once, not after the grace
    # an exiting rank 0 gets.
    stall_case 0:data:2:stop "rank 0 did not answer \($stopped\); ranks 1,2,3 $bucket0$"
    ;;
  mismatch)
    DDP_DEBUG=collectives DDP_COLLECTIVE_TIMEOUT_S=60 run "${mpirun[@]}" "$job" "${job_args[@]}" --mismatch 2:3
    [ "$status" -ne 0 ] || fail "the job exited 0"
    grep -qE "^error: collective #$n differs across ranks \(DDP_DEBUG=collectives\):$" <<<"$out" || fail "no mismatch error"
    grep -qx "  rank 2: MPI_Bcast of 100 float32 elements (root 0), step 2" <<<"$out" || fail "rank 2's side is not named"
    grep -qE "^  ranks 0,1,3: MPI_Allreduce of $n float32 elements \(average\), bucket 0 of 4, step 3$" <<<"$out" ||
      fail "the other ranks' side is not named"
    took=$(seconds_since "^[0-9.]+ step 2$")
    echo "the job ended ${took} s after step 2 (timeout 60 s)"
    awk -v t="$took" 'BEGIN { exit !(t <= 10) }' || fail "the mismatch took ${took} s to end the job"
    ;;
  dump)
    # A job of about 4 s; the dump is asked for once it has taken a few steps.
    if [ "$ddprun" = - ]; then
      launcher=("${mpirun[@]}")
    else
      launcher=("$ddprun" -np 4 --)
    fi
    "${launcher[@]}" "$job" "${job_args[@]}" --steps 40 --step-ms 100 >"$log" 2>&1 &
    pid=$!
    wait_for_line "step 3$" "the job did not get to step 3"
    if [ "$ddprun" = - ]; then
      kill -USR2 "$(pgrep -P $$ -x mpirun | head -1)" || fail "cannot signal mpirun"
    else
      "$ddprun" --dump "$pid" || fail "ddprun --dump $pid failed"
    fi
    wait "$pid"
    status=$?
    # ddprun's "[rank R] " prefix as the rank's own "rank R: " under mpirun (ddprun drops the program's).
    out=$(sed -E 's/^\[rank ([0-9]+)\] /rank \1: /' "$log")
    echo "$out"
    [ "$status" -eq 0 ] || fail "the job did not go on to succeed after the dump (exit status $status)"
    grep -qE "^(rank 0: )?done$" <<<"$out" || fail "the job did not finish its steps"
    for rank in 0 1 2 3; do
      dumps=$(grep -cE "^rank $rank: flight recorder: in [A-Za-z/ ]+ for [0-9.]+ s(, within [A-Za-z/ ]+)*, step $n, pid $n on " <<<"$out")
      [ "$dumps" -eq 1 ] || fail "rank $rank printed $dumps flight recorders, not one"
      grep -qE "^rank $rank:   #$n MPI_Allreduce of $n float32, bucket [0-3] of 4, step $n: issued [0-9.]+ s ago, took [0-9.]+ ms$" <<<"$out" ||
        fail "rank $rank's dump lists no completed bucket all-reduce"
    done
    ;;
  never_start)
    # Rank 2 never makes its session: the others end the job from the start's first collective, shortly after
    # the deadline (no side channel exists yet to make a report; the lowest rank waiting speaks first).
    run timeout 60 "${mpirun[@]}" "$job" "${job_args[@]}" --never-start 2
    [ "$status" -ne 0 ] || fail "the job exited 0"
    [ "$status" -ne 124 ] || fail "the job hung (killed after 60 s)"
    grep -qE "^rank 0: fatal: rank 0's MPI_Comm_idup at the session's start \(every rank makes its session together\) did not complete within $timeout_s s \(DDP_COLLECTIVE_TIMEOUT_S\); another rank has probably died or stalled before it; aborting the job$" <<<"$out" ||
      fail "rank 0 did not say which collective did not complete"
    took=$(seconds_since "^")
    echo "the job ended ${took} s after its first line"
    ;;
  stopped_before_mpi)
    [ "$ddprun" != - ] || fail "this case needs ddprun"
    run timeout 60 "$ddprun" -np 4 -- "$job" "${job_args[@]}" --stop-before-mpi 2
    [ "$status" -ne 0 ] || fail "the job exited 0"
    [ "$status" -ne 124 ] || fail "the job hung (killed after 60 s)"
    [ "$(grep -c "did not start within" <<<"$out")" -eq 1 ] || fail "not exactly one message of the start"
    grep -qE "^ddprun: error: the job did not start within 10 s \(the start's deadline: DDP_COLLECTIVE_TIMEOUT_S, at least 10 s\) of rank [013] starting MPI: rank 2 never began MPI_Init \(stopped, or stuck before its session\); ranks 0,1,3 wait in it; ending the job$" <<<"$out" ||
      fail "ddprun did not name rank 2 as the one that never began MPI_Init"
    grep -q "^ddprun: job failed (rank 2 first" <<<"$out" || fail "ddprun did not name rank 2 as the first failure"
    grep -q "ddprun-start:" <<<"$out" && fail "ddprun relayed the ranks' start markers"
    took=$(seconds_since "^")
    echo "the job ended ${took} s after its first line"
    ;;
  suspended)
    # Ctrl-Z on ddprun for longer than the timeout: every process of the job stops with ddprun, goes on with
    # it, and the job ends well. Ranks 0, 2 and 3 are stopped inside a collective, waiting for rank 1 (paused
    # for a while, less than the timeout): once continued, their deadlines must not have counted the stop.
    [ "$ddprun" != - ] || fail "this case needs ddprun"
    # No checkpoints: on a loaded machine a write can outlast the 2 s timeout by itself.
    DDP_FAULT_STALL=1:data:4:1.5 "$ddprun" -np 4 -- "$job" "$@" --steps 12 --step-ms 100 >"$log" 2>&1 &
    pid=$!
    wait_for_line "pausing 1.5 s in data loading" "rank 1 did not pause"
    sleep 0.5
    kill -TSTP "$pid"
    sleep 1
    state() { sed -E 's/^.*\) (.).*$/\1/' "/proc/$1/stat" 2>/dev/null; }
    [ "$(state "$pid")" = T ] || fail "ddprun is not stopped"
    # This job's programs: processes running the job below ddprun (other tests may run the same program).
    below_ddprun() {
      local p=$1
      while [ "${p:-1}" -gt 1 ]; do
        [ "$p" = "$pid" ] && return 0
        p=$(sed -E 's/^.*\) . ([0-9]+) .*$/\1/' "/proc/$p/stat" 2>/dev/null)
      done
      return 1
    }
    programs=
    for p in $(pgrep -f -- "^$job" || true); do
      below_ddprun "$p" && programs="$programs $p"
    done
    [ "$(wc -w <<<"$programs")" -eq 4 ] || fail "not 4 programs of the job: $programs"
    for p in $programs; do
      [ "$(state "$p")" = T ] || fail "rank process $p is not stopped"
    done
    lines=$(wc -l <"$log")
    sleep $((timeout_s * 2))
    [ "$(wc -l <"$log")" -eq "$lines" ] || fail "the job went on while stopped"
    kill -CONT "$pid"
    wait "$pid"
    status=$?
    out=$(cat "$log")
    echo "$out"
    [ "$status" -eq 0 ] || fail "the job did not succeed after it went on (exit status $status)"
    grep -qE "^(\[rank 0\] )?done$" <<<"$out" || fail "the job did not finish its steps"
    grep -q "did not complete" <<<"$out" && fail "a hang was reported"
    grep -qE "^ddprun: stopped with the job's [0-9]+ processes \(fg or SIGCONT to go on\)$" <<<"$out" ||
      fail "ddprun did not say it stopped with the job"
    grep -qx "ddprun: the job goes on" <<<"$out" || fail "ddprun did not say the job goes on"
    ;;
  *)
    fail "unknown case"
    ;;
esac
echo "PASS ($case_name)"
