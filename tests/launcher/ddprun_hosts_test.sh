#!/usr/bin/env bash
# ddprun over several hosts for real. Two "hosts" of this machine, 127.0.0.2 and 127.0.0.3, each an sshd of this
# test's own (a throwaway key, a free high port), reached through Open MPI's ssh launch path exactly as remote
# nodes are (Open MPI starts its daemon on each over ssh; the ranks talk over TCP):
#   1. --hosts: ranks start on both, each bound to its share of its host's cores (as the probe of the host says);
#   2. --hostfile: train_mlp trains across the two hosts;
#   3. a host that cannot be reached is refused before anything starts, naming it; --min-np goes on without it;
#   4. elastic restart: train_mlp on both hosts with checkpoints; after the first checkpoint 127.0.0.3 goes down
#      (its sshd and every process under it killed), the job fails, and the restart goes on with 127.0.0.2
#      alone (--min-np 1): train_mlp resumes the 2-rank checkpoint on 1 rank and completes.
# Runs outside Bazel's sandbox (tag no-sandbox): sshd needs real root for its privilege separation.
set -uo pipefail
ddprun=$(realpath "$1")
train=$(realpath "$2")
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/test_harness.sh"
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/process_tree.sh"

sshd=/usr/sbin/sshd
if [ ! -x "$sshd" ] || ! command -v ssh >/dev/null || ! command -v ssh-keygen >/dev/null; then
  echo "FAIL: sshd, ssh and ssh-keygen are needed: apt-get install openssh-server openssh-client (tools/setup.sh)"
  exit 1
fi
if [ "$(id -u)" -eq 0 ] && [ ! -d /run/sshd ]; then
  # sshd's privilege separation directory (the package's tmpfiles.d creates it at boot under systemd).
  mkdir -p -m 755 /run/sshd || { echo "SKIPPED: /run/sshd cannot be created, so sshd cannot run as root here"; exit 0; }
fi

dir="$session/ssh"
mkdir -p "$dir"
ssh-keygen -q -t ed25519 -N '' -f "$dir/host_key" && ssh-keygen -q -t ed25519 -N '' -f "$dir/key" || exit 1
cp "$dir/key.pub" "$dir/authorized_keys"

# A host going down: its sshd and everything it started, at once (stopped first, so that none forks meanwhile).
host_down() {
  local pidfile="$dir/sshd-$1.pid"
  [ -f "$pidfile" ] || return 0
  local pids
  pids=$(process_tree "$(cat "$pidfile")")
  kill -STOP $pids 2>/dev/null
  pids=$(process_tree $pids)
  kill -KILL $pids 2>/dev/null
  rm -f "$pidfile"
}
cleanup() {
  host_down 127.0.0.2
  host_down 127.0.0.3
  rm -rf "$session"
}
trap cleanup EXIT

start_sshd() {  # ADDRESS PORT
  # Each "host" gets a temporary directory of its own, as real hosts have: Open MPI's daemons there keep their
  # session directories under TMPDIR, and two daemons of one machine sharing /tmp race on its top directory
  # (one removes it as the other creates its own: "A call to mkdir was unable to create the desired directory").
  mkdir -p "$session/tmp-$1"
  cat >"$dir/sshd-$1.conf" <<EOF
ListenAddress $1:$2
HostKey $dir/host_key
AuthorizedKeysFile $dir/authorized_keys
PidFile $dir/sshd-$1.pid
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
MaxStartups 100
SetEnv TMPDIR=$session/tmp-$1
EOF
  "$sshd" -f "$dir/sshd-$1.conf" -E "$dir/sshd-$1.log" || return 1
  for _ in $(seq 50); do [ -s "$dir/sshd-$1.pid" ] && return 0; sleep 0.1; done
  return 1
}
port=""
for try in 1 2 3 4 5; do
  candidate=$((20000 + RANDOM % 40000))
  if start_sshd 127.0.0.2 "$candidate" && start_sshd 127.0.0.3 "$candidate"; then
    port=$candidate
    break
  fi
  host_down 127.0.0.2
  host_down 127.0.0.3
done
if [ -z "$port" ]; then
  echo "FAIL: sshd did not start on 127.0.0.2 and 127.0.0.3:"
  cat "$dir"/sshd-*.log
  exit 1
fi
export OMPI_MCA_plm_rsh_args="-p $port -i $dir/key -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR"
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
ssh $OMPI_MCA_plm_rsh_args 127.0.0.3 true || { fail "ssh to 127.0.0.3 port $port failed"; cat "$dir"/sshd-*.log; exit 1; }
remote_tmp=$(ssh $OMPI_MCA_plm_rsh_args 127.0.0.3 'echo $TMPDIR')
[ "$remote_tmp" = "$session/tmp-127.0.0.3" ] || fail "127.0.0.3's sessions see TMPDIR '$remote_tmp', not their own"

# 1. --hosts with 2 slots each: with 2 cores a host, each rank gets 1 core, and the two ranks of a host differ.
cores=$("$ddprun" --ddprun-probe | sed -n 's/^ddprun-probe: cores=\([0-9]*\) .*/\1/p')
out=$("$ddprun" --hosts 127.0.0.2:2,127.0.0.3:2 -- /bin/sh -c \
  'echo "local=$OMPI_COMM_WORLD_LOCAL_RANK node=$OMPI_COMM_WORLD_LOCAL_SIZE/$OMPI_COMM_WORLD_NODE_RANK $(grep Cpus_allowed_list /proc/self/status)"' 2>&1)
status=$?
echo "$out"
[ "$status" -eq 0 ] || fail "--hosts job exited $status"
[ "$(grep -c 'local=[01] node=2/' <<<"$out")" -eq 4 ] || fail "expected 4 ranks, 2 on each host"
if [ "${cores:-0}" -ge 2 ]; then
  per_rank=$((cores / 2))
  for r in 0 1 2 3; do
    list=$(sed -n "s/^\[rank $r\] .*Cpus_allowed_list:\s*//p" <<<"$out")
    n=$(tr ',' '\n' <<<"$list" | awk -F- '{ n += ($2 == "" ? 1 : $2 - $1 + 1) } END { print n + 0 }')
    [ "$n" -ge "$per_rank" ] && [ "$n" -le $((2 * per_rank)) ] || fail "rank $r is bound to CPUs '$list', not to $per_rank core(s)"
  done
  a=$(sed -n 's/^\[rank 0\] .*Cpus_allowed_list:\s*//p' <<<"$out")
  b=$(sed -n 's/^\[rank 1\] .*Cpus_allowed_list:\s*//p' <<<"$out")
  [ "$a" != "$b" ] || fail "the two ranks of 127.0.0.2 share CPUs $a"
fi
"$ddprun" --dry-run --hosts 127.0.0.2:2,127.0.0.3:2 -- prog 2>&1 | grep -q "slot:PE=" || fail "--dry-run shows no binding"

# 2. --hostfile: a short training across the two hosts (its all-reduces over TCP between them).
printf '127.0.0.2 slots=1\n127.0.0.3 slots=1\n' >"$session/hostfile"
small=(--hidden 64 --layers 2 --lr 1e-3 --log-every 10 --seed 7)
out=$("$ddprun" --hostfile "$session/hostfile" -- "$train" "${small[@]}" --batch-size 32 --max-steps 20 2>&1)
status=$?
[ "$status" -eq 0 ] || { fail "train_mlp over --hostfile exited $status:"; tail -20 <<<"$out"; }
grep -q "train_mlp: 2 rank(s)" <<<"$out" || fail "train_mlp did not run on 2 ranks"
grep -q "final step=20 " <<<"$out" || fail "train_mlp over --hostfile did not finish"

# 3. A host that cannot be reached (no sshd on 127.0.0.4): refused up front, naming it; --min-np goes on.
out=$("$ddprun" --hosts 127.0.0.2:1,127.0.0.4:1 -- /bin/true 2>&1)
status=$?
[ "$status" -eq 1 ] || fail "an unreachable host: exit status $status, not 1"
grep -q "ddprun: error: cannot start the job: cannot reach 127.0.0.4 (ssh: connect to host 127.0.0.4 port $port: Connection refused); pass --min-np" <<<"$out" \
  || { fail "no clear refusal of an unreachable host:"; echo "$out"; }
out=$("$ddprun" --hosts 127.0.0.2:1,127.0.0.4:1 --min-np 1 -- /bin/sh -c 'echo "ranks=$OMPI_COMM_WORLD_SIZE"' 2>&1)
status=$?
[ "$status" -eq 0 ] || fail "--min-np 1 with a host down exited $status"
grep -q "ddprun: cannot reach 127.0.0.4 (.*); going on with 1 rank on 127.0.0.2:1 (--min-np 1)" <<<"$out" \
  || { fail "no line about going on without the host:"; echo "$out"; }
grep -q "\[rank 0\] ranks=1" <<<"$out" || fail "the job did not run on the host left"

# 4. Elastic: 127.0.0.3 goes down after the first checkpoint; the restart resumes on 127.0.0.2 alone.
ckpt="$session/ckpt"
elastic=(--hidden 256 --layers 2 --global-batch-size 128 --lr 1e-3 --log-every 100 --seed 3 --max-steps 1000
  --checkpoint-dir "$ckpt" --checkpoint-every 20)
"$ddprun" --hosts 127.0.0.2:1,127.0.0.3:1 --max-restarts 2 --min-np 1 -- "$train" "${elastic[@]}" \
  >"$session/elastic.log" 2>&1 &
job=$!
# Any checkpoint will do: with --keep-checkpoints 3 the one of step 20 is gone by step 80, which a loaded machine
# can reach between two looks.
checkpointed() { compgen -G "$ckpt/ckpt-*.safetensors" >/dev/null; }
for _ in $(seq 600); do
  checkpointed && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
checkpointed || fail "no checkpoint on the two hosts"
grep -q "final step=" "$session/elastic.log" && fail "the first attempt finished before the host went down"
host_down 127.0.0.3
wait "$job"
status=$?
out=$(cat "$session/elastic.log")
echo "$out" | grep -v "epoch [0-9]* step \| test_\|^ \|^--\|^$" | tail -25
[ "$status" -eq 0 ] || fail "the elastic job exited $status"
grep -q "ddprun: job failed (host 127.0.0.3 lost: mpirun lost its daemon there); restart 1 of 2" <<<"$out" \
  || fail "no restart naming the host that went down"
grep -q "ddprun: cannot reach 127.0.0.3 (ssh: connect to host 127.0.0.3 port $port: Connection refused); going on with 1 rank on 127.0.0.2:1 (--min-np 1)" <<<"$out" \
  || fail "the restart did not go on without 127.0.0.3"
grep -q "\[rank 0\] resumed from .*: step [0-9]*, epoch 0, sample [0-9]* (written on 2 ranks, continuing on 1; global batch 128 -> 128)" <<<"$out" \
  || fail "train_mlp did not resume the 2-rank checkpoint on 1 rank"
grep -q "\[rank 0\] final step=1000 " <<<"$out" || fail "the resumed run did not reach step 1000"

finish ddprun_hosts_test
