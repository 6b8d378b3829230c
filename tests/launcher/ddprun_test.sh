#!/usr/bin/env bash
# ddprun end to end under the real mpirun, with plain shell programs as ranks: "[rank R] " prefixes, the job's
# exit status, the failed rank named, restarts with DDP_RESUME=1, and --dry-run.
set -uo pipefail
ddprun="$1"
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/bazel/mpi_env.sh"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
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

out=$("$ddprun" -np 0 -- prog 2>&1)
status=$?
[ "$status" -ne 0 ] || fail "-np 0 exited 0"
check_contains bad-np "$out" "-np must be a positive number of ranks"

out=$("$ddprun" -np 2 -- /nonexistent/program 2>&1)
status=$?
[ "$status" -ne 0 ] || fail "missing program exited 0"
check_contains missing-program "$out" "cannot run /nonexistent/program"

[ "$failures" -eq 0 ] && echo "ddprun_test: all checks passed"
exit "$failures"
