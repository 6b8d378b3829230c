#!/usr/bin/env bash
# Whatever ends ddprun, the job ends with it: SIGHUP, SIGINT, SIGQUIT, SIGTERM or SIGKILL to ddprun, or its output
# closed under it (`ddprun ... | head -1`), must leave no process of the job (mpirun, rank wrappers, ranks) alive
# more than a few seconds later; and ddprun's exit status is 128 + the signal (SIGPIPE's 141 for a closed pipe).
# The ranks are shell loops that never end by themselves, named by a token only this test run uses.
set -uo pipefail
ddprun="$1"
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/test_harness.sh"
token="ddprun-signals-test-$$-$RANDOM"
# A shell starts background jobs with SIGINT and SIGQUIT ignored (and ddprun keeps what it was started with
# ignored, as nohup expects): undo that, as an interactive user's ddprun would have them.
start=(env --default-signal=INT,QUIT,HUP,TERM "$ddprun" -np 2 --)

# Waits (up to $2 seconds) until no process with the token in its command line is left; prints how long it took.
wait_for_job_gone() {
  local name="$1" limit="$2" t0 now
  t0=$(date +%s.%N)
  while pgrep -f "$token" >/dev/null; do
    now=$(date +%s.%N)
    if awk -v a="$t0" -v b="$now" -v l="$limit" 'BEGIN { exit !(b - a > l) }'; then
      fail "$name: processes of the job still alive ${limit} s after ddprun ended:"
      ps -o pid,ppid,pgid,args -p "$(pgrep -d, -f "$token")"
      for pid in $(pgrep -f "$token"); do kill -9 "$pid" 2>/dev/null; done  # ours, by id
      return
    fi
    sleep 0.1
  done
  echo "$name: the job was gone $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s after ddprun"
}

# Waits (up to 30 s) for both ranks' "ready" line in $1.
wait_ready() {
  for _ in $(seq 300); do
    [ "$(grep -c "ready" "$1" 2>/dev/null)" -ge 2 ] && return 0
    sleep 0.1
  done
  return 1
}

for case in HUP:129 INT:130 QUIT:131 TERM:143 KILL:137; do
  sig="${case%%:*}"
  expected="${case##*:}"
  out="$session/out.$sig"
  "${start[@]}" /bin/sh -c 'echo ready; while :; do sleep 1; done' "$token" >"$out" 2>&1 &
  pid=$!
  if ! wait_ready "$out"; then
    fail "SIG$sig: the ranks did not start:"
    cat "$out"
  fi
  kill -"$sig" "$pid"
  wait "$pid"
  status=$?
  [ "$status" -eq "$expected" ] || { fail "SIG$sig: ddprun exited $status, expected $expected"; cat "$out"; }
  wait_for_job_gone "SIG$sig" 10
done
grep -q "ddprun: received SIGTERM; the job was ended" "$session/out.TERM" ||
  fail "SIGTERM: ddprun did not say it ended the job"

# Its stdout closed: read by head -1, which is gone when the second line comes 1 s later; then the ranks are
# silent, so mpirun (which ignores SIGPIPE) never finds out by itself. `timeout` bounds a ddprun that would not
# notice.
rank_program='[ "$OMPI_COMM_WORLD_RANK" = 0 ] && echo first; [ "$OMPI_COMM_WORLD_RANK" = 1 ] && sleep 1 && echo second
while :; do sleep 1; done'
timeout -s KILL 30 "${start[@]}" /bin/sh -c "$rank_program" "$token" 2>"$session/err.PIPE" | head -1 >/dev/null
status=${PIPESTATUS[0]}
[ "$status" -eq 141 ] || { fail "closed output: ddprun exited $status, expected 141"; cat "$session/err.PIPE"; }
grep -q "its output was closed (broken pipe); the job was ended" "$session/err.PIPE" ||
  { fail "closed output: ddprun did not say why it ended the job"; cat "$session/err.PIPE"; }
wait_for_job_gone "closed output" 10

# A second SIGTERM after every rank has stopped as asked (exit status 75) is not a failure: the stop was finished.
# Each rank leaves a process holding its output open for a few seconds, so mpirun is still there when it comes.
dir="$work/second_term"
mkdir -p "$dir"
"${start[@]}" /bin/sh -c 'trap "(sleep 4) & touch '"$dir"'/stopped-\$OMPI_COMM_WORLD_RANK; exit 75" USR1
  echo ready; while :; do sleep 0.1; done # '"$token" >"$dir/out" 2>&1 &
pid=$!
[ "$(for _ in $(seq 300); do [ "$(grep -c ready "$dir/out")" -ge 2 ] && echo ok && break; sleep 0.1; done)" = ok ] ||
  fail "second SIGTERM: the ranks did not start"
kill -TERM "$pid"
for _ in $(seq 300); do [ -e "$dir/stopped-0" ] && [ -e "$dir/stopped-1" ] && break; sleep 0.05; done
sleep 0.3  # the wrappers' exit markers reach ddprun
kill -TERM "$pid" 2>/dev/null
timeout 60 tail --pid="$pid" -f /dev/null
wait "$pid"
status=$?
if [ "$status" -ne 75 ]; then
  fail "a second SIGTERM after a finished graceful stop: exit status $status, not 75"
  cat "$dir/out"
fi
wait_for_job_gone "second SIGTERM" 10

# Slurm's requeue or time limit signals every process of the job at once, mpirun too, whose teardown then takes
# about the stop grace (odls_base_sigkill_timeout): ddprun must report the graceful stop once every rank has ended,
# not when mpirun is done (it took 22 s, with a checkpoint written 0.1 s after the signal). A fake allocation of
# this node makes ddprun start the job as inside Slurm.
dir="$work/requeue"
mkdir -p "$dir"
SLURM_JOB_ID=77 SLURM_JOB_NODELIST="$(hostname)" SLURM_TASKS_PER_NODE=2 SLURM_NTASKS=2 \
  "${start[@]}" /bin/sh -c 'trap "exit 75" USR1; echo ready; while :; do sleep 0.1; done # '"$token" \
  >"$dir/out" 2>&1 &
pid=$!
[ "$(for _ in $(seq 300); do [ "$(grep -c ready "$dir/out")" -ge 2 ] && echo ok && break; sleep 0.1; done)" = ok ] ||
  fail "requeue: the ranks did not start"
mpirun_pid=$(pgrep -P "$pid" -x mpirun)
t0=$(date +%s.%N)
kill -TERM "$pid" $mpirun_pid
timeout 60 tail --pid="$pid" -f /dev/null
took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
wait "$pid"
status=$?
echo "requeue: ddprun ended ${took} s after the signal to it and to mpirun, exit status $status"
[ "$status" -eq 75 ] || { fail "requeue: exit status $status, not 75"; cat "$dir/out"; }
awk -v t="$took" 'BEGIN { exit !(t < 6) }' ||
  fail "requeue: ddprun took ${took} s to report a stop its ranks ended at once"
wait_for_job_gone "requeue" 10

finish ddprun_signals_test
