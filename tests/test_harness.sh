# Sourced (not run) by the shell tests of the examples, the launcher and Slurm. Gives them the MPI environment
# (bazel/mpi_env.sh), a work folder $work removed with the test, and a tally of failures: `fail MESSAGE` counts
# one and goes on, so a run reports every broken check at once; `finish NAME` ends the test with the tally.
# Found beside this file, so that a test run from the tree without Bazel (the GPU machine) can source it too.
source "$(dirname "${BASH_SOURCE[0]}")/../bazel/mpi_env.sh"
work="$session/work"
mkdir -p "$work"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# mpirun_shared N PROGRAM ARGS...: N ranks on this machine's cores shared among them (more ranks than cores
# allowed, no binding), without the shared-memory transport's single-copy mechanism (containers may forbid it).
mpirun_shared() {
  mpirun -np "$1" --oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none "${@:2}"
}

# Waits (up to $3 seconds, 60 by default) for a line matching the extended regular expression $2 in file $1.
wait_for_line() {
  for _ in $(seq $((${3:-60} * 100))); do
    grep -qE "$2" "$1" 2>/dev/null && return 0
    sleep 0.01
  done
  return 1
}

# shown_as_is DOC SOURCE: the fenced block of DOC that opens with SOURCE's first line holds SOURCE exactly, so a page
# that shows a program shows it as it is built and run.
shown_as_is() {
  local shown
  shown=$(awk -v first="$(head -1 "$2")" 'inside && /^```/ { exit } inside { print } /^```/ { getline line;
    if (line == first) { inside = 1; print line } }' "$1")
  [ -n "$shown" ] || { fail "$1 does not show $(basename "$2")"; return; }
  diff <(echo "$shown") "$2" >/dev/null || fail "$1 shows another $(basename "$2") than the one built: $(diff <(echo "$shown") "$2" | head -6)"
}

# PASS and exit 0, or the number of failures and exit 1.
finish() {
  if [ "$failures" -eq 0 ]; then
    echo "$1: PASS"
    exit 0
  fi
  echo "$1: $failures failure(s)"
  exit 1
}
