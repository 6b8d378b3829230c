#!/usr/bin/env bash
# The runtime under a real Slurm (Debian's slurm-wlm 22.05: munged, slurmctld, one slurmd, started here by
# tests/slurm/slurm_cluster.sh with a private config, state and ports, and stopped at the end):
#   1. sbatch of the docs' job script (docs/slurm/train.sbatch): ddprun takes the allocation (2 tasks on this
#      node), says so, trains and finishes; -np beyond the allocation is refused with its size;
#   2. srun of the main job without ddprun: with --mpi=pmix one world of 2 ranks; with srun's default (no PMI)
#      or --mpi=pmi2 the singleton trap, every task refused within 5 s of its start naming `srun --mpi=pmix`;
#   3. preemption: the job script's job gets `scancel --signal=USR1 --batch` (what --signal=B:USR1@N sends)
#      mid-training, stops at an agreed step with a checkpoint, requeues itself, resumes from that checkpoint
#      and ends with the final checkpoint of case 1's run, never stopped, byte for byte;
#   4. jobs that reach their time limit: with the script's early USR1, or without it by Slurm's SIGTERM to
#      every process of the job at the limit, the job stops at an agreed step with its checkpoint, ddprun
#      exits 75 and the script requeues the job;
#   5. the node lost mid-job (slurmd, its job steps and the ranks killed at once): the job ends NODE_FAIL and
#      srun says which node failed.
# Outside Bazel's sandbox (slurmd runs jobs as root and listens on ports); alone (tag exclusive), as it
# loads both cores; not under ASan (the jobs' ranks do not get the sanitizer's environment).
set -uo pipefail
ddprun=$(realpath "$1")
train=$(realpath "$2")
job_script=$(realpath "$3")
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/test_harness.sh"
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/slurm/slurm_cluster.sh"
for tool in munged slurmctld slurmd sbatch srun; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool is missing: apt-get install slurm-wlm munge (tools/setup.sh)"; exit 1; }
done
slurm_start || exit 1
node=$(slurm_node)
cd "$work" || exit 1
seconds_since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
# The job script as the docs give it, with ddprun and train_mlp from here; jobs inherit this environment.
export DDPRUN="$ddprun" TRAIN_MLP="$train"
small=(--hidden 64 --layers 1 --batch-size 32 --lr 1e-3 --seed 7 --log-every 50)
endless=("${small[@]}" --max-steps 100000000 --epochs 100000 --log-every 20000)

# 1. The job script trains and finishes: 300 steps, the reference of case 3.
t0=$(date +%s.%N)
job=$(CHECKPOINT_DIR="$work/reference" sbatch --parsable -o "$work/reference.out" "$job_script" "${small[@]}" --max-steps 300)
slurm_wait_state "$job" "COMPLETED|FAILED|CANCELLED|TIMEOUT" 120 || fail "sbatch: job $job still $(slurm_job_state "$job") after 120 s"
echo "1. sbatch of the job script: $(slurm_job_state "$job") in $(seconds_since "$t0") s"
out=$(cat "$work/reference.out")
[ "$(slurm_job_state "$job")" = COMPLETED ] || { fail "sbatch: job $job ended $(slurm_job_state "$job")"; echo "$out" | tail -20; }
grep -F "ddprun: in Slurm job $job (2 tasks on 1 node: $node:2); starting 2 ranks on this node" <<<"$out" \
  || fail "ddprun did not say what it took from the allocation"
grep -q "\[rank 0\] train_mlp: 2 rank(s)" <<<"$out" || fail "train_mlp did not run on the allocation's 2 tasks"
grep -q "\[rank 0\] final step=300 " <<<"$out" || fail "the job script's run did not finish"
[ -f "$work/reference/ckpt-00000300.safetensors" ] || fail "no final checkpoint of the reference run"

job=$(sbatch --parsable -n 1 -o "$work/too_many.out" --wrap "$ddprun -np 4 -- /bin/true")
slurm_wait_state "$job" "COMPLETED|FAILED" 60
[ "$(slurm_job_state "$job")" = FAILED ] || fail "-np 4 in an allocation of 1 task: job $(slurm_job_state "$job"), not FAILED"
grep -F "ddprun: error: -np 4 is more ranks than Slurm job $job (1 task on 1 node: $node:1) holds: pass -np 1 or fewer" \
  "$work/too_many.out" || { fail "-np beyond the allocation: no refusal with its size"; cat "$work/too_many.out"; }

# 2. srun starts the ranks itself.
out=$(srun --mpi=pmix -n 2 "$train" "${small[@]}" --max-steps 20 2>&1)
status=$?
echo "2. srun --mpi=pmix -n 2: exit $status"
[ "$status" -eq 0 ] || { fail "srun --mpi=pmix -n 2 exited $status"; echo "$out" | tail -20; }
grep -q "train_mlp: 2 rank(s)" <<<"$out" || fail "srun --mpi=pmix: the ranks did not make one world of 2"
grep -q "final step=20 " <<<"$out" || fail "srun --mpi=pmix: the run did not finish"
# The refusal is timed in each task, from its start to its exit (srun's own allocation and launch come on top:
# seconds on a loaded machine).
timed='t0=$(date +%s%N); "$@"; status=$?; echo "task $SLURM_PROCID ended after $((($(date +%s%N) - t0) / 1000000)) ms"; exit $status'
for mpi in "" --mpi=pmi2; do
  t0=$(date +%s.%N)
  out=$(srun $mpi -n 2 /bin/bash -c "$timed" timed "$train" "${small[@]}" --max-steps 20 2>&1)
  status=$?
  slowest=$(grep -oE "task [0-9]+ ended after [0-9]+ ms" <<<"$out" | grep -oE "[0-9]+ ms" | sort -n | tail -1)
  echo "   srun ${mpi:-(no --mpi)} -n 2: exit $status after $(seconds_since "$t0") s; the slower task took ${slowest:-?}"
  [ "$status" -ne 0 ] || fail "srun ${mpi:-without --mpi}: the singleton start was not refused"
  grep -q "ddp: error: this is task 0 of the 2 tasks srun started .*srun --mpi=pmix" <<<"$out" \
    || { fail "srun ${mpi:-without --mpi}: no refusal naming srun --mpi=pmix"; echo "$out" | head -20; }
  grep -q "train_mlp: 1 rank(s)" <<<"$out" && fail "srun ${mpi:-without --mpi}: a singleton started training"
  [ "$(grep -c "task [01] ended after" <<<"$out")" -eq 2 ] || fail "srun ${mpi:-without --mpi}: not both tasks timed"
  [ -n "$slowest" ] && [ "${slowest% ms}" -lt 5000 ] || fail "srun ${mpi:-without --mpi}: refused only after ${slowest:-?} (limit 5 s)"
done

# 3. Preemption: USR1 to the batch shell while rank 0 is held at step 100 (DDP_FAULT_STALL), a requeue, a
#    resume; the final checkpoint is case 1's.
t0=$(date +%s.%N)
job=$(CHECKPOINT_DIR="$work/preempted" DDP_FAULT_STALL=0:forward:100:3 \
  sbatch --parsable -o "$work/preempted.out" "$job_script" "${small[@]}" --max-steps 300)
if wait_for_line "$work/preempted.out" "pausing 3 s in forward" 120; then
  scancel --signal=USR1 --batch "$job"
else
  fail "preemption: the run never reached step 100"
fi
# Slurm holds a requeued batch job for two minutes (its begin time); let it start 5 s later instead (in the
# same second as the requeue, slurmd would take its new credential for the revoked one and refuse it).
for _ in $(seq 300); do
  scontrol show job "$job" 2>/dev/null | grep -q "Restarts=1" && [ "$(slurm_job_state "$job")" = PENDING ] && break
  sleep 0.1
done
scontrol update JobId="$job" StartTime=now+5
slurm_wait_state "$job" "COMPLETED|FAILED|CANCELLED|TIMEOUT" 120
echo "3. preempted, requeued and resumed: $(slurm_job_state "$job") in $(seconds_since "$t0") s"
out=$(cat "$work/preempted.out")
grep -E "stopped|requeue|resumed|final step|restart|Restarts" <<<"$out"
[ "$(slurm_job_state "$job")" = COMPLETED ] || { fail "preemption: job $job ended $(slurm_job_state "$job")"; echo "$out" | tail -30; }
step=$(grep -oE "train_mlp: stopped at step [0-9]+ on SIGUSR1" <<<"$out" | grep -oE "[0-9]+ on" | grep -oE "[0-9]+")
[ -n "$step" ] || fail "preemption: no 'stopped at step' line"
grep -q "ddprun: received SIGUSR1; the job stopped gracefully .* exit status 75" <<<"$out" || fail "preemption: ddprun did not stop gracefully"
grep -q "train.sbatch: stopped with a checkpoint; requeueing job $job" <<<"$out" || fail "preemption: the job script did not requeue"
grep -q "train.sbatch: job $job, run 2," <<<"$out" || fail "preemption: no second run of the job"
[ -n "$step" ] && { grep -q "\[rank 0\] resumed from .*ckpt-$(printf %08d "$step").safetensors: step $step" <<<"$out" \
  || fail "preemption: the requeued run did not resume from step $step"; }
cmp "$work/reference/ckpt-00000300.safetensors" "$work/preempted/ckpt-00000300.safetensors" \
  || fail "preemption: the final checkpoint differs from the one of the run never stopped"

# 4. The time limit (1 minute, Slurm's least), two jobs side by side:
#    a. the job script with its warning (--signal=B:USR1@N; N=20 here, the script's 120 being longer than the
#       whole job, and late enough to find train_mlp past its start-up): USR1 comes before the end, the job
#       stops at a step with its checkpoint, ddprun exits 75, and the job requeues itself;
#    b. the job script without a warning: at the limit Slurm sends SIGTERM to every process of the job, mpirun
#       and the ranks included; the ranks still stop at an agreed step and write its checkpoint (mpirun, told
#       by ddprun, waits before it ends them), ddprun learns it from the wrappers' exit files (mpirun no
#       longer relays the ranks' output then) and exits 75, and the script asks for a requeue.
grep -v -- "--signal=" "$job_script" >"$work/no_warning.sbatch"
t0=$(date +%s.%N)
warned=$(CHECKPOINT_DIR="$work/warned" sbatch --parsable --time=1 --signal=B:USR1@20 -o "$work/warned.out" \
  "$job_script" "${endless[@]}")
unwarned=$(CHECKPOINT_DIR="$work/unwarned" sbatch --parsable --time=1 -o "$work/unwarned.out" "$work/no_warning.sbatch" \
  "${endless[@]}")
wait_for_line "$work/warned.out" "^ddprun: .*exit status" 150 || fail "time limit with a warning: ddprun never ended"
echo "4a. time limit with a warning: ddprun's last line $(seconds_since "$t0") s after the submission"
out=$(cat "$work/warned.out")
grep -E "stopped|requeue" <<<"$out"
step=$(grep -oE "train_mlp: stopped at step [0-9]+ on SIGUSR1" <<<"$out" | grep -oE "[0-9]+ on" | grep -oE "[0-9]+")
[ -n "$step" ] || { fail "time limit with a warning: no 'stopped at step' line"; echo "$out" | tail -20; }
[ -n "$step" ] && { [ -f "$work/warned/ckpt-$(printf %08d "$step").safetensors" ] || fail "time limit with a warning: no checkpoint of step $step"; }
grep -q "ddprun: received SIGUSR1; the job stopped gracefully .* exit status 75" <<<"$out" \
  || fail "time limit with a warning: ddprun did not stop gracefully"
wait_for_line "$work/warned.out" "DUE TO JOB REQUEUE" 30 || fail "time limit with a warning: the job was not requeued"
scancel "$warned"  # requeued: this test does not wait for its next run

wait_for_line "$work/unwarned.out" "DUE TO TIME LIMIT" 150 || fail "time limit: Slurm did not end the job for its time limit"
wait_for_line "$work/unwarned.out" "^ddprun: .*exit status" 40 || fail "time limit: ddprun never ended"
slurm_wait_state "$unwarned" "TIMEOUT|PENDING" 40
state=$(slurm_job_state "$unwarned")
echo "4b. time limit without a warning: job $state $(seconds_since "$t0") s after the submission"
scancel "$unwarned"
grep -E "TIME LIMIT|ddprun: received|requeue" "$work/unwarned.out"
[[ "$state" =~ ^(TIMEOUT|PENDING)$ ]] || fail "time limit: job $state, neither TIMEOUT nor requeued (PENDING)"
grep -q "ddprun: received SIGTERM; the job stopped gracefully .* exit status 75" "$work/unwarned.out" \
  || fail "time limit: ddprun did not see the ranks stop as asked"
grep -q "train.sbatch: stopped with a checkpoint; requeueing job $unwarned" "$work/unwarned.out" \
  || fail "time limit: the job script did not ask for a requeue"
checkpoint=$(ls "$work/unwarned" 2>/dev/null | grep -E "^ckpt-[0-9]+\.safetensors$" | tail -1)
[ -n "$checkpoint" ] || fail "time limit: the ranks wrote no checkpoint when the time limit stopped them"
echo "    its checkpoint: ${checkpoint:-none}"

# 5. The node lost mid-job: srun's job ends NODE_FAIL, and srun names the node.
srun --mpi=pmix -n 2 "$train" "${endless[@]}" >"$work/lost.out" 2>&1 &
srun_pid=$!
wait_for_line "$work/lost.out" "step=20000/" 120 || fail "node lost: the run never reached step 20000"
job=$(squeue -h -o %i | head -1)
t0=$(date +%s.%N)
slurm_node_down
for _ in $(seq 600); do kill -0 "$srun_pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$srun_pid" 2>/dev/null && { fail "node lost: srun still running 60 s later"; kill "$srun_pid"; }
echo "5. node lost: srun ended $(seconds_since "$t0") s later; job $job $(slurm_job_state "$job")"
grep -E "srun: error" "$work/lost.out"
grep -q "srun: error: Node failure on $node" "$work/lost.out" || { fail "node lost: srun did not name the node"; tail "$work/lost.out"; }
[ "$(slurm_job_state "$job")" = NODE_FAIL ] || fail "node lost: job $job ended $(slurm_job_state "$job"), not NODE_FAIL"

finish slurm_test
