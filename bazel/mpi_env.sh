# Sourced (not run) by every test that starts mpirun: the environment Open MPI needs under `bazel test`.
#   - root is allowed (CI runs as root);
#   - a session directory of its own, $session, which becomes TMPDIR: Open MPI puts its Unix sockets there
#     (Bazel's own TMPDIR can exceed the 108-byte socket path limit) and, named after mpirun's pid, it would
#     collide between tests running side by side in PID namespaces where every mpirun may have the same pid;
#   - the shared-memory transport's segments in that directory too, for the same reason;
#   - under --config=asan, no leak detection in the ranks (Open MPI's plugin allocations; see .bazelrc).
# The directory is removed when the sourcing script exits.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
session=$(mktemp -d /tmp/ddp-mpi.XXXXXX)
trap 'rm -rf "$session"' EXIT
export TMPDIR="$session"
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_backing_directory="$session"
if [ -n "${DDP_SANITIZER_MPI_NO_LEAKS:-}" ]; then
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
fi
