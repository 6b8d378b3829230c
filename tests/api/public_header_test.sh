#!/usr/bin/env bash
# The promise of the public header: a translation unit that includes "ddp.h" compiles with the runtime's own
# headers alone on its include path (no MPI, NCCL or CUDA directory), and none of <mpi.h>, <nccl.h> or a CUDA
# or cuBLAS header is among the files it reads, so user code never depends on them through the runtime. Nor
# does it reach the runtime's internals: the kernel layer (runtime/kernels/, GEMM options included), the
# allocator (runtime/core/allocator.h), the World under the Session (runtime/distributed/world.h and the MPI
# and NCCL wrappers beside it), nor what DistributedDataParallel, the parameter store and the checkpoint files
# keep behind a pointer or a forward declaration (the reducer, the bucket plan, join's options, the gradient gate,
# the optimizer shard, the safetensors reader, the atomic-file writer). And the count of the runtime's headers
# it reads stays at most max_headers, so that a new include in a public header is a decision, not an accident.
set -uo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
cxx="${CXX:-c++}"
fail() { echo "FAIL: $*"; exit 1; }

tu="$TEST_TMPDIR/uses_ddp.cc"
cat >"$tu" <<'CC'
#include "ddp.h"
int main(int argc, char** argv) {
  return ddp::run_main([&] {
    ddp::Session session(&argc, &argv);
    return session.rank() >= 0 ? 0 : 1;
  });
}
CC
"$cxx" -std=c++20 -fsyntax-only -I"$root" "$tu" 2>"$TEST_TMPDIR/compile.log" ||
  fail "ddp.h does not compile without MPI/NCCL/CUDA include paths: $(head -20 "$TEST_TMPDIR/compile.log")"
# Every file the translation unit reads, system headers included.
files=$("$cxx" -std=c++20 -M -I"$root" "$tu" | tr ' \\' '\n\n' | grep -v '^$')
forbidden=$(grep -E '(^|/)(mpi|mpi-ext|mpi_portable_platform|nccl|nccl_net)\.h$|/cuda[^/]*\.h$|/cublas|/usr/local/cuda|openmpi' <<<"$files")
[ -z "$forbidden" ] || fail "ddp.h reaches headers a user must not need: $forbidden"
internal=$(grep -E "^$root/(runtime/kernels/|runtime/core/allocator\.h$|runtime/distributed/(world|world_mpi|nccl_communicator|process_group_[a-z_]+)\.h$)" <<<"$files")
[ -z "$internal" ] || fail "ddp.h reaches the runtime's internal headers (include them by name where needed): $internal"
kept_out=(
  runtime/distributed/reducer.h
  runtime/distributed/bucket_plan.h
  runtime/distributed/join.h
  runtime/io/safetensors.h
  runtime/io/atomic_file.h
  runtime/autograd/gradient_gate.h
  runtime/autograd/optimizer_shard.h
)
for header in "${kept_out[@]}"; do
  ! grep -qx "$root/$header" <<<"$files" ||
    fail "ddp.h reaches $header, which a user never names: forward-declare its types where a reference suffices"
done
max_headers=46
count=$(grep "^$root/" <<<"$files" | grep -cvx "$root/ddp.h" || true)
[ "$count" -le "$max_headers" ] ||
  fail "ddp.h reaches $count of the runtime's headers, more than $max_headers: forward-declare what a reference needs"
echo "public header: compiles alone, reads $count runtime headers (at most $max_headers), no MPI/NCCL/CUDA header and no internal one"
