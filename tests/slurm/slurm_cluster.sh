# Sourced (not run) by the Slurm tests: a real Slurm of the test's own on this machine, no mock. munged,
# slurmctld and one slurmd (Debian's slurm-wlm 22.05), each with its state, sockets, logs and pid files under
# $cluster (a private directory), on free high ports, so that nothing is shared with a system Slurm or with a
# previous run; stopped, and their leftovers (job steps, ranks) killed, when the sourcing script exits (its
# EXIT trap, which runs the one set before it).
#   slurm_start [slurm.conf lines...]   starts them; the client commands (sbatch, srun, squeue, scontrol,
#                                       scancel) then talk to this cluster through SLURM_CONF
#   slurm_node                          the node's name (this host's short name)
#   slurm_wait_state JOB STATES SECS    waits until the job's state matches the regex STATES
#   slurm_job_state JOB                 its state now (PENDING, RUNNING, COMPLETED, TIMEOUT, NODE_FAIL, ...)
#   slurm_node_down                     the node lost: slurmd, its job steps and everything under them killed
# Needs root (slurmd starts jobs as their user) and the packages of tools/setup.sh.
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/process_tree.sh"
cluster=$(mktemp -d /tmp/ddp-slurm.XXXXXX)
chmod 755 "$cluster"
slurm_node=$(hostname -s)
export SLURM_CONF="$cluster/slurm.conf"
# Nothing of the caller's own Slurm job may leak into the jobs of this one.
for v in $(compgen -e | grep '^SLURM_' | grep -v '^SLURM_CONF$'); do unset "$v"; done

slurm_node() { echo "$slurm_node"; }

# The processes this cluster started that outlive their daemon (slurmd forks slurmstepd away from itself, and
# the job's tasks run under it): every process whose environment names this cluster's config and a job.
slurm_job_processes() {
  local pid
  for pid in $(ls /proc | grep -E '^[0-9]+$'); do
    [ "$pid" = "$$" ] && continue
    {
      tr '\0' '\n' <"/proc/$pid/environ" | grep -qx "SLURM_CONF=$SLURM_CONF" || continue
      { tr '\0' '\n' <"/proc/$pid/environ" | grep -q '^SLURM_JOB_ID=' || grep -qx slurmstepd "/proc/$pid/comm"; } && echo "$pid"
    } 2>/dev/null
  done
}
slurm_kill_pidfile() {  # FILE: the daemon and everything under it, stopped first so that none forks meanwhile
  [ -s "$1" ] || return 0
  local pids
  pids=$(process_tree "$(cat "$1")")
  kill -STOP $pids 2>/dev/null
  kill -KILL $(process_tree $pids) 2>/dev/null
  rm -f "$1"
}
# The node lost at once: slurmd, its job steps and every task under them (stopped first, so that none forks
# or reports meanwhile), as a machine that loses power.
slurm_node_down() {
  local pids
  pids=$(slurm_job_processes)
  [ -s "$cluster/slurmd.pid" ] && pids="$pids $(cat "$cluster/slurmd.pid")"
  pids=$(process_tree $pids)
  [ -n "$pids" ] || return 0
  kill -STOP $pids 2>/dev/null
  kill -KILL $(process_tree $pids) 2>/dev/null
  rm -f "$cluster/slurmd.pid"
}
slurm_stop() {
  slurm_node_down
  # The daemons' logs outlive the cluster for a failed test: Bazel keeps them in test.outputs.
  if [ -n "${TEST_UNDECLARED_OUTPUTS_DIR:-}" ] && [ -d "$cluster/log" ]; then
    cp -r "$cluster/log" "$TEST_UNDECLARED_OUTPUTS_DIR/slurm-logs" 2>/dev/null
  fi
  slurm_kill_pidfile "$cluster/slurmctld.pid"
  slurm_kill_pidfile "$cluster/munged.pid"
  rm -rf "$cluster"
}
# The caller's own EXIT trap (bazel/mpi_env.sh's) runs after ours.
slurm_caller_exit_trap=$(trap -p EXIT)
slurm_on_exit() {
  slurm_stop
  [ -n "$slurm_caller_exit_trap" ] || return 0
  eval "set -- $slurm_caller_exit_trap"  # trap -- 'COMMAND' EXIT
  eval "$3"
}
trap slurm_on_exit EXIT

slurm_start() {
  mkdir -p "$cluster/munge" "$cluster/ctld" "$cluster/spool" "$cluster/log" "$cluster/tmp"
  chmod 700 "$cluster/munge"
  dd if=/dev/urandom of="$cluster/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$cluster/munge/munge.key"
  # --force: munged otherwise refuses a socket directory under /tmp (writable by all, even with the sticky bit).
  munged --force --socket="$cluster/munge/socket" --key-file="$cluster/munge/munge.key" \
    --pid-file="$cluster/munged.pid" --seed-file="$cluster/munge/seed" --log-file="$cluster/log/munged.log" \
    || { echo "slurm_cluster: munged did not start:"; cat "$cluster/log/munged.log"; return 1; }

  local port=$((20000 + RANDOM % 40000)) cpus
  cpus=$(nproc)
  cat >"$SLURM_CONF" <<CONF
ClusterName=ddptest
SlurmctldHost=$slurm_node(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$cluster/munge/socket
CredType=cred/munge
StateSaveLocation=$cluster/ctld
SlurmdSpoolDir=$cluster/spool
SlurmctldPidFile=$cluster/slurmctld.pid
SlurmdPidFile=$cluster/slurmd.pid
SlurmctldLogFile=$cluster/log/slurmctld.log
SlurmdLogFile=$cluster/log/slurmd.log
# The job steps' scratch (the PMIx plugin's spmix_appdir_UID_JOB.STEP) here, not in /tmp: job ids start at 1
# in every run, and a step that a lost node left behind would block the next run's step of the same id.
TmpFS=$cluster/tmp
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups (a container may have none to give): processes are tracked by their parent links.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
# Quick to notice a lost node (it is pinged every SlurmdTimeout/3 s), quick to schedule; patient with a
# loaded machine (a step launch on 2 busy cores can take seconds).
SlurmdTimeout=10
MessageTimeout=10
SchedulerParameters=sched_interval=1
MinJobAge=600
KillWait=30
JobRequeue=1
# The node as configured here, whatever this machine has: jobs of 2 ranks run on a 1-core machine too.
SlurmdParameters=config_overrides
NodeName=$slurm_node NodeAddr=127.0.0.1 CPUs=$((cpus < 4 ? 4 : cpus)) State=UNKNOWN
PartitionName=test Nodes=$slurm_node Default=YES MaxTime=INFINITE State=UP
CONF
  local line
  for line in "$@"; do echo "$line" >>"$SLURM_CONF"; done
  echo "PMIxCliTmpDirBase=$cluster/tmp" >"$cluster/mpi.conf"
  slurmctld -i -f "$SLURM_CONF" || { echo "slurm_cluster: slurmctld did not start:"; cat "$cluster/log/slurmctld.log"; return 1; }
  slurmd -f "$SLURM_CONF" || { echo "slurm_cluster: slurmd did not start:"; cat "$cluster/log/slurmd.log"; return 1; }
  local i
  for i in $(seq 300); do
    sinfo -h -N -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)' && return 0
    sleep 0.1
  done
  echo "slurm_cluster: the node did not come up within 30 s:"
  sinfo -N 2>&1
  tail -20 "$cluster/log/slurmctld.log" "$cluster/log/slurmd.log"
  return 1
}

slurm_job_state() { scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
slurm_wait_state() {  # JOB STATES SECONDS
  local i
  for i in $(seq $(($3 * 5))); do
    [[ "$(slurm_job_state "$1")" =~ ^($2)$ ]] && return 0
    sleep 0.2
  done
  return 1
}
