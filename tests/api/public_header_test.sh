#!/usr/bin/env bash
# The promise of the public headers: a translation unit that includes "ddp.h", or one of the public headers a
# program includes by name beside it (tools/public_headers.txt), compiles with the runtime's own
# headers alone on its include path (no MPI, NCCL or CUDA directory), and none of <mpi.h>, <nccl.h> or a CUDA
# or cuBLAS header is among the files it reads, so user code never depends on them through the runtime. Nor
# does it reach the runtime's internals: the kernel layer (runtime/kernels/, GEMM options included), the
# allocator (runtime/core/allocator.h), the World under the Session (runtime/distributed/world.h and the MPI
# and NCCL wrappers beside it), nor what DistributedDataParallel, the parameter store and the checkpoint files
# keep behind a pointer or a forward declaration (the reducer, the bucket plan, join's options, the gradient gate,
# the optimizer shard, the safetensors reader, the atomic-file writer). And the count of the runtime's headers
# ddp.h reads stays at most max_headers, so that a new include in it is a decision, not an accident: the larger
# parts (the Trainer, TrainStep, data loaders, checkpoint files, ...) are included by name where they are used.
set -uo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
cxx="${CXX:-c++}"
fail() { echo "FAIL: $*"; exit 1; }

named=$(grep -v -e '^#' -e '^$' "$root/tools/public_headers.txt")
# check_reach LABEL FILE: FILE compiles alone, reads no MPI/NCCL/CUDA header and none of the internal ones;
# prints the runtime's headers it reads.
check_reach() {
  local label="$1" tu="$2" files forbidden internal header
  "$cxx" -std=c++20 -fsyntax-only -I"$root" "$tu" 2>"$TEST_TMPDIR/compile.log" ||
    fail "$label does not compile without MPI/NCCL/CUDA include paths: $(head -20 "$TEST_TMPDIR/compile.log")"
  # Every file the translation unit reads, system headers included.
  files=$("$cxx" -std=c++20 -M -I"$root" "$tu" | tr ' \\' '\n\n' | grep -v '^$')
  forbidden=$(grep -E '(^|/)(mpi|mpi-ext|mpi_portable_platform|nccl|nccl_net)\.h$|/cuda[^/]*\.h$|/cublas|/usr/local/cuda|openmpi' <<<"$files")
  [ -z "$forbidden" ] || fail "$label reaches headers a user must not need: $forbidden"
  internal=$(grep -E "^$root/(runtime/kernels/|runtime/core/allocator\.h$|runtime/distributed/(world|world_mpi|nccl_communicator|process_group_[a-z_]+)\.h$)" <<<"$files")
  [ -z "$internal" ] || fail "$label reaches the runtime's internal headers (include them by name where needed): $internal"
  for header in "${kept_out[@]}"; do
    ! grep -qx "$root/$header" <<<"$files" ||
      fail "$label reaches $header, which a user never names: forward-declare its types where a reference suffices"
  done
  grep "^$root/" <<<"$files"
}
kept_out=(
  runtime/distributed/reducer.h
  runtime/distributed/bucket_plan.h
  runtime/distributed/join.h
  runtime/io/safetensors.h
  runtime/io/atomic_file.h
  runtime/autograd/gradient_gate.h
  runtime/autograd/optimizer_shard.h
)

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
files=$(check_reach ddp.h "$tu") || { echo "$files"; exit 1; }
max_headers=25
count=$(grep -cvx "$root/ddp.h" <<<"$files" || true)
[ "$count" -le "$max_headers" ] ||
  fail "ddp.h reaches $count of the runtime's headers, more than $max_headers: include the larger parts by name" \
    "(tools/public_headers.txt) or forward-declare what a reference needs"

# Each public header named beside ddp.h keeps the same promise, on its own.
for header in $named; do
  [ -f "$root/$header" ] || fail "tools/public_headers.txt names $header, which does not exist"
  printf '#include "%s"\n' "$header" >"$TEST_TMPDIR/named.cc"
  out=$(check_reach "$header" "$TEST_TMPDIR/named.cc") || { echo "$out"; exit 1; }
done
echo "public headers: ddp.h compiles alone and reads $count runtime headers (at most $max_headers); it and the $(wc -w <<<"$named") named beside it reach no MPI/NCCL/CUDA header and no internal one"
