#!/usr/bin/env bash
# Checks that another Bazel workspace can depend on the runtime: builds examples/external_workspace (its own
# WORKSPACE, @ddp through local_repository, the runtime's repositories from ddp_dependencies()) and runs its
# binary on 1 and 2 ranks. Prints PASS or FAIL and exits accordingly; tools/test.sh runs it after the tests.
#
# Not a bazel test: Bazel inside a Bazel test sandbox is fragile. The consumer is its own workspace, so it has
# its own Bazel server and output base (the first run builds the runtime once more: about 2 minutes on 2 cores;
# later runs are incremental). The server exits after DDP_EXTERNAL_IDLE_S idle seconds (default 120).
set -uo pipefail
cd "$(dirname "$0")/../examples/external_workspace"
startup=(--max_idle_secs="${DDP_EXTERNAL_IDLE_S:-120}")
# No bazel-* convenience links inside the runtime's checkout.
options=(--symlink_prefix=/)
fail() { echo "external_workspace: FAIL: $*"; exit 1; }

begin=$(date +%s)
bazel "${startup[@]}" build "${options[@]}" //:consumer || fail "bazel build //:consumer in $(pwd) failed"
built=$(date +%s)
binary="$(bazel "${startup[@]}" info "${options[@]}" bazel-bin 2>/dev/null)/consumer"
[ -x "$binary" ] || fail "no binary at $binary"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# A session directory of its own (see bazel/mpi_run.sh).
TMPDIR=$(mktemp -d /tmp/ddp-mpi.XXXXXX)
export TMPDIR
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_backing_directory="$TMPDIR"
trap 'rm -rf "$TMPDIR"' EXIT
for ranks in 1 2; do
  out=$(mpirun -np "$ranks" --oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none \
    "$binary" 2>&1) || fail "$ranks rank(s) exited non-zero: $out"
  grep -q "^consumer: ranks=$ranks .* OK$" <<<"$out" || fail "$ranks rank(s): no OK line: $out"
  grep "^consumer:" <<<"$out"
done
echo "external_workspace: PASS (build $((built - begin)) s)"
