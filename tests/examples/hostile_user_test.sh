#!/usr/bin/env bash
# What a hostile user tried on train_mlp, custom_loop and ddprun, each case named by what must hold:
#   - a sharded checkpoint whose rank 0 stalls in checkpoint I/O ends the job with a report within the deadline
#     (the gather of the optimizer shards is a collective like any other);
#   - a collective timeout too large to be one (1e10, inf) is refused before the first step, naming its bounds;
#   - a deeper model's checkpoint is refused by a shallower model, naming the tensors it does not have;
#   - checkpoint metadata out of range (a sampler position past the data set) or not a number (optimizer.steps)
#     makes the resume fall back to the previous checkpoint, with a warning naming the file and why;
#   - flags that differ across ranks (--lr, --epochs; custom_loop's --shard-optimizer) end every rank at start
#     with one message naming the flag and the ranks, instead of training wrong, crashing or hanging;
#   - a stop is never restarted: a rank signalled twice, or a stop whose checkpoint cannot be written;
#   - a stop asked in ddprun's first moments, or right after "restart 1 of 1", is held until the ranks can take
#     it: the job stops gracefully (exit 75) instead of training on or being killed;
#   - a line written in pieces by several ranks comes out whole, under its own rank's prefix;
#   - an open-files limit too low for mpirun is refused naming the limit, instead of a job that never starts.
set -uo pipefail
ddprun="$1"
train="$2"
custom_loop="$3"
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/test_harness.sh"
small=(--device cpu --hidden 32 --layers 1 --batch-size 64 --log-every 1000 --seed 7)


a_stalled_sharded_checkpoint_ends_the_job_with_a_report() {
  local start end out status
  start=$(date +%s)
  out=$(DDP_COLLECTIVE_TIMEOUT_S=30 DDP_FAULT_STALL=0:checkpoint:20 timeout 240 "$ddprun" -np 2 -- "$train" \
    "${small[@]}" --max-steps 40 --checkpoint-every 20 --shard-optimizer --checkpoint-dir "$work/stall" 2>&1)
  status=$?
  end=$(date +%s)
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ] || fail "stalled sharded checkpoint: exit status $status (124: hung)"
  grep -q "BucketOptimizerShard::gather" <<<"$out" || fail "stalled sharded checkpoint: the gather is not named: $out"
  grep -q "rank 0 is behind: .* in checkpoint I/O" <<<"$out" ||
    fail "stalled sharded checkpoint: the report does not say rank 0 is behind in checkpoint I/O: $out"
  [ $((end - start)) -lt 180 ] || fail "stalled sharded checkpoint: took $((end - start)) s with a 30 s deadline"
}

a_timeout_too_large_is_refused_naming_its_bounds() {
  local value out status
  for value in 1e10 inf; do
    out=$(DDP_COLLECTIVE_TIMEOUT_S=$value timeout 60 "$ddprun" -np 2 -- "$train" "${small[@]}" --max-steps 5 2>&1)
    status=$?
    [ "$status" -ne 0 ] && [ "$status" -ne 124 ] || fail "DDP_COLLECTIVE_TIMEOUT_S=$value: exit status $status"
    grep -q "DDP_COLLECTIVE_TIMEOUT_S must be a number of seconds above 0 and at most 1000000" <<<"$out" ||
      fail "DDP_COLLECTIVE_TIMEOUT_S=$value: no message naming the bounds: $out"
    grep -q -- "-2147483648" <<<"$out" && fail "DDP_COLLECTIVE_TIMEOUT_S=$value: overflowed: $out"
  done
}

a_deeper_models_checkpoint_is_refused_naming_its_extra_tensors() {
  local out status
  "$ddprun" -np 2 -- "$train" "${small[@]}" --layers 2 --hidden 10 --max-steps 10 --checkpoint-dir "$work/deep" \
    >/dev/null 2>&1 || fail "deeper model: the first run failed"
  out=$("$ddprun" -np 2 -- "$train" "${small[@]}" --layers 1 --hidden 10 --max-steps 20 --resume "$work/deep" \
    --checkpoint-dir "$work/shallow" 2>&1)
  status=$?
  [ "$status" -ne 0 ] || fail "deeper model: a shallower model resumed from it: $out"
  grep -q "holds tensors this model and optimizer do not have: .*4.weight" <<<"$out" ||
    fail "deeper model: the refusal does not name the extra tensors: $out"
}

# Rewrites metadata key $2 of checkpoint $1 to $3, with the metadata's checksum made again (as a bug of the
# writer or a hand would, past the checksum).
rewrite_metadata() {
  python3 - "$@" <<'EOF'
import json, struct, sys, zlib
path, key, value = sys.argv[1:4]
data = open(path, "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
meta = header["__metadata__"]
meta[key] = value
crc = 0
for k in sorted(meta):
    if not k.startswith("ddp.crc32:"):
        crc = zlib.crc32(k.encode() + b"\0" + meta[k].encode() + b"\0", crc)
meta["ddp.crc32:__metadata__"] = "%08x" % crc
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * ((8 - len(text) % 8) % 8)
open(path, "wb").write(struct.pack("<Q", len(text)) + text + data[8 + n:])
EOF
}

metadata_out_of_range_falls_back_to_the_previous_checkpoint() {
  local key value out status
  for key in ddp.sampler_position optimizer.steps; do
    value=999999999
    [ "$key" = optimizer.steps ] && value=x7
    rm -rf "$work/range"
    "$ddprun" -np 2 -- "$train" "${small[@]}" --max-steps 20 --checkpoint-every 10 --checkpoint-dir "$work/range" \
      >/dev/null 2>&1 || fail "metadata $key: the first run failed"
    rewrite_metadata "$work/range/ckpt-00000020.safetensors" "$key" "$value"
    out=$("$ddprun" -np 2 -- "$train" "${small[@]}" --max-steps 30 --checkpoint-every 10 \
      --checkpoint-dir "$work/range" --resume "$work/range" 2>&1)
    status=$?
    [ "$status" -eq 0 ] || fail "metadata $key=$value: the resume failed ($status): $out"
    grep -q "skipping checkpoint .*ckpt-00000020.safetensors: .*$key" <<<"$out" ||
      fail "metadata $key=$value: no warning naming the file and the key: $out"
    grep -q "resumed from .*ckpt-00000010.safetensors: step 10" <<<"$out" ||
      fail "metadata $key=$value: did not fall back to step 10: $out"
    grep -q "stoll" <<<"$out" && fail "metadata $key=$value: a bare stoll error: $out"
  done
}

flags_that_differ_across_ranks_are_refused_naming_the_flag_and_the_ranks() {
  local flag out status
  for flag in lr epochs; do
    local zero=0.1 one=0.5
    [ "$flag" = epochs ] && zero=1 && one=2
    out=$(timeout 60 "$ddprun" -np 2 -- bash -c \
      'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then v=$2; else v=$1; fi; shift 2; exec "$0" "$@" --'"$flag"' "$v"' \
      "$train" "$zero" "$one" "${small[@]}" --max-steps 5 2>&1)
    status=$?
    [ "$status" -ne 0 ] && [ "$status" -ne 124 ] || fail "per-rank --$flag: exit status $status"
    grep -q "the ranks were started with different flags" <<<"$out" && grep -q -- "--$flag: $zero on rank 0, $one on rank 1" <<<"$out" ||
      fail "per-rank --$flag: no message naming the flag and the ranks: $out"
  done
  # Paths name places on a rank's own node: a per-node --data (the same data under another path) is no
  # difference in the recipe.
  ln -sfn /usr/share/datasets/fashion-mnist "$work/fashion-mnist-of-node-1"
  out=$(timeout 60 "$ddprun" -np 2 -- bash -c \
    'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then v=$2; else v=$1; fi; shift 2; exec "$0" "$@" --data "$v"' \
    "$train" /usr/share/datasets/fashion-mnist "$work/fashion-mnist-of-node-1" "${small[@]}" --max-steps 5 2>&1) ||
    fail "a per-node --data path was refused: $out"
  out=$(timeout 60 mpirun -np 1 --oversubscribe --bind-to none "$custom_loop" --device cpu --steps 20 : \
    -np 1 --oversubscribe --bind-to none "$custom_loop" --device cpu --steps 20 --shard-optimizer 2>&1)
  status=$?
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ] || fail "custom_loop per-rank --shard-optimizer: exit status $status"
  grep -q "DdpOptions::shard_optimizer: false on rank 0, true on rank 1" <<<"$out" ||
    fail "custom_loop per-rank --shard-optimizer: no message naming the option and the ranks: $out"
}

# The pid of rank $2's program of the job whose checkpoint directory is $1.
program_pid() {
  for pid in $(pgrep -f -- "--checkpoint-dir $1"); do
    grep -q "OMPI_COMM_WORLD_RANK=$2" "/proc/$pid/environ" 2>/dev/null || continue
    grep -qz -- "--ddprun-rank-wrapper" "/proc/$pid/cmdline" 2>/dev/null && continue
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = train_mlp ] && { echo "$pid"; return; }
  done
}

a_stop_is_never_restarted() {
  local pid status
  # A rank signalled twice: the second signal ends it at once (while rank 0, paused 3 s in its checkpoint
  # write, keeps the job stopping).
  DDP_FAULT_STALL=0:checkpoint:1:3 "$ddprun" -np 2 --max-restarts 1 -- "$train" "${small[@]}" --epochs 50 \
    --log-every 20 --checkpoint-dir "$work/twice" >"$work/twice.out" 2>&1 &
  local job=$!
  wait_for_line "$work/twice.out" "step=20/" || fail "twice: the job did not start"
  pid=$(program_pid "$work/twice" 1)
  [ -n "$pid" ] && kill -TERM "$pid" && sleep 1 && kill -TERM "$pid"
  wait "$job"
  status=$?
  grep -q "restart 1 of 1" "$work/twice.out" && fail "a rank signalled twice was restarted: $(tail -5 "$work/twice.out")"
  [ "$status" -ne 0 ] || fail "a rank signalled twice: exit status 0"
  # A graceful stop whose checkpoint cannot be written (a file-size limit: EFBIG, as a full disk's ENOSPC; the
  # ranks talk over TCP, as the limit also stops the shared-memory transport's segment).
  OMPI_MCA_btl=self,tcp "$ddprun" -np 2 --max-restarts 2 -- bash -c 'ulimit -f 64; exec "$0" "$@"' "$train" \
    "${small[@]}" --epochs 50 \
    --log-every 20 --checkpoint-dir "$work/full" >"$work/full.out" 2>&1 &
  job=$!
  wait_for_line "$work/full.out" "step=20/" || fail "full disk: the job did not start"
  pid=$(program_pid "$work/full" 1)
  [ -n "$pid" ] && kill -USR1 "$pid"
  wait "$job"
  status=$?
  grep -q "checkpoint write failed" "$work/full.out" || fail "full disk: the checkpoint write did not fail"
  grep -q "restart 1 of 2" "$work/full.out" && fail "a stop whose checkpoint failed was restarted: $(tail -5 "$work/full.out")"
  [ "$status" -ne 0 ] || fail "a stop whose checkpoint failed: exit status 0"
}

a_stop_before_the_ranks_exist_is_held_until_they_can_take_it() {
  local delay status
  for delay in 0 0.3; do
    "$ddprun" -np 2 -- "$train" "${small[@]}" --epochs 5 --checkpoint-dir "$work/early$delay" \
      >"$work/early$delay.out" 2>&1 &
    local job=$!
    # From the moment ddprun catches SIGTERM (its first milliseconds; before, the signal ends it as any program).
    until [ $(( 0x$(awk '/^SigCgt:/ { print $2 }' "/proc/$job/status" 2>/dev/null || echo 0) >> 14 & 1 )) = 1 ]; do
      kill -0 "$job" 2>/dev/null || break
      sleep 0.005
    done
    sleep "$delay"
    kill -TERM "$job"
    wait "$job"
    status=$?
    [ "$status" -eq 75 ] || fail "SIGTERM after $delay s: exit status $status, not 75: $(tail -5 "$work/early$delay.out")"
    grep -q "stopped gracefully" "$work/early$delay.out" || fail "SIGTERM after $delay s: no graceful stop"
  done
  # Right after a restart: rank 1 dies at step 5 of the first attempt.
  DDP_FAULT_KILL_STEP=5 DDP_FAULT_KILL_RANK=1 "$ddprun" -np 2 --max-restarts 1 -- "$train" "${small[@]}" --epochs 5 \
    --checkpoint-dir "$work/restarted" >"$work/restarted.out" 2>&1 &
  local job=$!
  wait_for_line "$work/restarted.out" "restart 1 of 1" || fail "restart: no restart"
  kill -TERM "$job"
  wait "$job"
  status=$?
  [ "$status" -eq 75 ] || fail "SIGTERM right after a restart: exit status $status, not 75: $(tail -5 "$work/restarted.out")"
}

a_line_written_in_pieces_comes_out_whole_under_its_ranks_prefix() {
  local out
  out=$("$ddprun" -np 2 -- bash -c 'printf "part-one "; sleep 0.5; printf "part-two\n"' 2>&1)
  [ "$(grep -c '^\[rank [01]\] part-one part-two$' <<<"$out")" = 2 ] ||
    fail "pieces of a line: expected one whole line per rank: $out"
  grep -q '<stdout>' <<<"$out" && fail "pieces of a line: raw mpirun tags: $out"
}

too_few_open_files_are_refused_naming_the_limit() {
  local limit out status
  for limit in 24 32; do
    out=$(ulimit -n "$limit"; timeout 60 "$ddprun" -np 2 -- true 2>&1)
    status=$?
    [ "$status" -ne 0 ] && [ "$status" -ne 124 ] || fail "ulimit -n $limit: exit status $status (124: hung)"
    grep -q "open files.*$limit" <<<"$out" || fail "ulimit -n $limit: no message naming the limit: $out"
  done
}

# A data set larger than the memory a rank may have (ulimit -v; here a sparse file of 1.2 GB under a 1.5 GB limit)
# is said as such, naming the data set and what to do, not as a data set that cannot be read.
a_data_set_too_large_for_memory_is_said_as_such() {
  local dir="$work/too-large" out status
  if [ -n "${DDP_SANITIZER_MPI_NO_LEAKS:-}" ]; then  # set by --config=asan
    echo "a_data_set_too_large_for_memory_is_said_as_such: not under AddressSanitizer, whose shadow memory no" \
         "ulimit -v leaves room for (the plain build runs it)"
    return
  fi
  mkdir -p "$dir"
  /usr/bin/python3 - "$dir" <<'PY'
import os, sys
def npy(path, descr, shape, item):  # an .npy file of zeros (sparse): version 1.0 header, then the data
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%d, %d), }" % (descr, *shape) if len(shape) == 2 \
        else "{'descr': '%s', 'fortran_order': False, 'shape': (%d,), }" % (descr, shape[0])
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode())
        f.truncate(f.tell() + item * eval("*".join(map(str, shape))))
npy(os.path.join(sys.argv[1], "features.npy"), "<f4", (3000000, 100), 4)
npy(os.path.join(sys.argv[1], "targets.npy"), "<i8", (3000000,), 8)
PY
  out=$(ulimit -v 1500000; timeout 60 "$ddprun" -np 2 -- "$train" "${small[@]}" --data "$dir" --max-steps 1 2>&1)
  status=$?
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ] || fail "a data set too large for memory: exit status $status"
  grep -qF "ranks 0,1: not enough memory to hold the data set $dir in this process; use a machine with more memory, or fewer ranks on this node" <<<"$out" ||
    fail "a data set too large for memory: not said as such: $out"
  rm -rf "$dir"
}

for case in a_data_set_too_large_for_memory_is_said_as_such a_stalled_sharded_checkpoint_ends_the_job_with_a_report a_timeout_too_large_is_refused_naming_its_bounds \
  a_deeper_models_checkpoint_is_refused_naming_its_extra_tensors \
  metadata_out_of_range_falls_back_to_the_previous_checkpoint \
  flags_that_differ_across_ranks_are_refused_naming_the_flag_and_the_ranks a_stop_is_never_restarted \
  a_stop_before_the_ranks_exist_is_held_until_they_can_take_it \
  a_line_written_in_pieces_comes_out_whole_under_its_ranks_prefix too_few_open_files_are_refused_naming_the_limit; do
  if [ -n "${ONLY:-}" ] && [ "$ONLY" != "$case" ]; then continue; fi
  before=$failures
  "$case"
  [ "$failures" -eq "$before" ] && echo "ok: $case" || echo "FAILED: $case"
done
finish hostile_user
