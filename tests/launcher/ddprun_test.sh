#!/usr/bin/env bash
# ddprun end to end under the real mpirun, with plain shell programs as ranks: "[rank R] " prefixes, the job's
# exit status, the failed rank named, restarts with DDP_RESUME=1, --dry-run, and the warning for a job this node
# cannot carry. (Signals to ddprun: ddprun_signals_test.sh.)
set -uo pipefail
ddprun="$1"
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/test_harness.sh"
check_contains() {  # NAME TEXT EXPECTED
  if ! grep -qF -- "$3" <<<"$2"; then fail "$1: expected '$3' in:"; echo "$2"; fi
}

out=$("$ddprun" -np 2 -- /bin/sh -c 'echo "hi from $OMPI_COMM_WORLD_RANK"' 2>&1)
status=$?
[ "$status" -eq 0 ] || fail "hello job exited $status"
check_contains hello "$out" "[rank 0] hi from 0"
check_contains hello "$out" "[rank 1] hi from 1"

out=$("$ddprun" -np 2 -- /bin/sh -c '[ "$OMPI_COMM_WORLD_RANK" = 1 ] && exit 3; exit 0' 2>&1)
status=$?
[ "$status" -eq 3 ] || fail "failing job exited $status, expected 3"
check_contains failing "$out" "ddprun: job failed (rank 1 first, exit status 3)"
if grep -q "ddprun-exit:" <<<"$out"; then fail "exit markers leaked into the output"; fi

out=$("$ddprun" -np 2 -- /bin/sh -c '[ "$OMPI_COMM_WORLD_RANK" = 0 ] && kill -9 $$; sleep 5' 2>&1)
status=$?
[ "$status" -ne 0 ] || fail "killed job exited 0"
check_contains killed "$out" "rank 0 first, signal 9"

# An error all ranks raised together, as the runtime reports it (World::agree): rank 0 prints it and every rank
# exits 1. Rank 1 has nothing to print, so it exits first (once rank 0 has printed: on a loaded machine rank 0
# may start late); the report names rank 0, and so must ddprun.
printed="${TEST_TMPDIR:-/tmp}/ddprun-test-printed-$$"
rm -f "$printed"
out=$(DDP_TEST_PRINTED="$printed" "$ddprun" -np 2 -- /bin/sh -c 'if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then
  printf "error: checkpoint write failed:\n  rank 0: checkpoint directory d exists but is not a directory\n" >&2
  touch "$DDP_TEST_PRINTED"; sleep 0.5
  else for i in $(seq 200); do [ -f "$DDP_TEST_PRINTED" ] && break; sleep 0.05; done; fi; exit 1' 2>&1)
status=$?
[ "$status" -eq 1 ] || fail "agreed error exited $status, expected 1"
check_contains agreed-error "$out" "ddprun: job failed (rank 0 first"

# Fails on rank 1 until restarted once; the restart sees DDP_RESTART=1 and DDP_RESUME=1.
out=$("$ddprun" -np 2 --max-restarts 2 -- /bin/sh -c \
  'echo "restart=${DDP_RESTART:-0} resume=${DDP_RESUME:-0}"; [ "$OMPI_COMM_WORLD_RANK" = 1 ] && [ "${DDP_RESTART:-0}" = 0 ] && exit 4; exit 0' 2>&1)
status=$?
[ "$status" -eq 0 ] || fail "restarted job exited $status"
check_contains restart "$out" "ddprun: job failed (rank 1 first, exit status 4); restart 1 of 2"
check_contains restart "$out" "[rank 1] restart=1 resume=1"

out=$("$ddprun" -np 2 --max-restarts 1 -- /bin/sh -c 'exit 5' 2>&1)
status=$?
[ "$status" -eq 5 ] || fail "always-failing job exited $status"
check_contains exhausted "$out" "restart 1 of 1"
check_contains exhausted "$out" "after 1 restarts"

out=$(DDP_SOMETHING=1 "$ddprun" --dry-run -np 3 --backend mpi -- prog 'a b' 2>&1)
status=$?
[ "$status" -eq 0 ] || fail "dry run exited $status"
check_contains dry-run "$out" "mpirun -np 3"
check_contains dry-run "$out" "-x DDP_SOMETHING"
check_contains dry-run "$out" "-x DDP_BACKEND=mpi"
check_contains dry-run "$out" "prog 'a b'"

# Far more ranks than cores, and more memory than any CI machine has: warned before anything runs; the job is
# still started (here a dry run, so the command is printed).
out=$("$ddprun" --dry-run -np 4096 -- prog 2>&1)
status=$?
[ "$status" -eq 0 ] || fail "oversubscribed dry run exited $status"
check_contains oversubscribed "$out" "ddprun: warning: 4096 ranks on"
check_contains oversubscribed "$out" "ddprun: warning: 4096 ranks of about 400 MiB each (--rank-memory-mib) need 1600.0 GiB"
check_contains oversubscribed "$out" "mpirun -np 4096"
out=$("$ddprun" --dry-run -np 1 -- prog 2>&1)
if grep -q "warning" <<<"$out"; then fail "one rank drew a warning: $out"; fi

out=$("$ddprun" -np 0 -- prog 2>&1)
status=$?
[ "$status" -ne 0 ] || fail "-np 0 exited 0"
check_contains bad-np "$out" "-np must be a positive number of ranks"

# A job whose ranks agreed that its input is wrong (exit status 65, ddp::kInputErrorExitStatus) is not restarted:
# a retry would meet the same input.
runs="${TEST_TMPDIR:-/tmp}/ddprun-test-runs-$$"
rm -f "$runs"
out=$(DDP_TEST_RUNS="$runs" "$ddprun" --max-restarts 3 -np 2 -- /bin/sh -c \
  'echo run >>"$DDP_TEST_RUNS"; [ "$OMPI_COMM_WORLD_RANK" = 0 ] && exit 65; exit 0' 2>&1)
status=$?
[ "$status" -eq 65 ] || fail "an input error exited $status, not 65"
[ "$(wc -l <"$runs")" -eq 2 ] || fail "an input error was restarted: $(wc -l <"$runs") runs of a rank"
check_contains input-error "$out" "which a restart would meet again; not restarted"
if grep -q "restart 1 of 3" <<<"$out"; then fail "an input error was restarted: $out"; fi

# A program that is not there: one line, not one per rank, and a shell's status for it.
out=$("$ddprun" -np 8 -- /nonexistent/program 2>&1)
status=$?
[ "$status" -eq 127 ] || fail "missing program exited $status, not 127"
[ "$(grep -c "cannot run" <<<"$out")" -eq 1 ] || fail "missing program: not one message: $out"
check_contains missing-program "$out" \
  "ddprun: error: cannot run /nonexistent/program: No such file or directory; no rank was started"
out=$("$ddprun" -np 2 -- no-such-program-ddp 2>&1)
check_contains missing-program-on-path "$out" "cannot run no-such-program-ddp: no such program on PATH"

finish ddprun_test
