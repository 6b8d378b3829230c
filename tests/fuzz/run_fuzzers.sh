#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (not Bazel: the Bazel toolchain here is gcc) and runs each for a
# bounded time on a copy of its seed corpus in tests/fuzz/corpus/<name>/.
#   tests/fuzz/run_fuzzers.sh [SECONDS_PER_TARGET]    (default 30; FUZZ_OUT=dir for the build and run files)
# Needs clang++ and its fuzzer runtime (Debian: clang-14 and libclang-rt-14-dev), zlib1g-dev, libdeflate-dev,
# nlohmann-json3-dev, and the headers/libraries runtime/core links (CUDA under /usr/local/cuda, libopenmpi-dev).
# A crash leaves its input as $FUZZ_OUT/<name>/crash-*; the script then exits non-zero. New interesting inputs
# stay in $FUZZ_OUT/<name>/corpus (copy the useful ones into the repository's corpus by hand).
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds="${1:-30}"
out="${FUZZ_OUT:-/tmp/ddp-fuzz}"
cxx="${CXX_FUZZ:-clang++}"
mkdir -p "$out"

probe="$out/probe.cc"
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$probe"
if ! "$cxx" -fsanitize=fuzzer,address "$probe" -o "$out/probe" 2>"$out/probe.log"; then
  echo "run_fuzzers: $cxx cannot link -fsanitize=fuzzer (see $out/probe.log)." >&2
  echo "run_fuzzers: install clang and its runtime: apt-get install clang-14 libclang-rt-14-dev" >&2
  exit 2
fi

flags=(-std=c++20 -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -I. -I/usr/local/cuda/include -I/usr/local/cuda/include/cccl -I/usr/lib/x86_64-linux-gnu/openmpi/include
       -DOMPI_SKIP_MPICXX)
# runtime/core (errors, element types) links the CUDA runtime only; the readers need zlib and libdeflate.
libs=(-L/usr/local/cuda/lib64 -Wl,-rpath,/usr/local/cuda/lib64 -lcudart -lz -ldeflate)

declare -A sources=(
  [safetensors]="tests/fuzz/safetensors_fuzzer.cc runtime/io/safetensors.cc runtime/io/atomic_file.cc runtime/io/file_identity.cc"
  [idx]="tests/fuzz/idx_fuzzer.cc runtime/data/idx.cc runtime/io/file_identity.cc runtime/io/atomic_file.cc"
)

status=0
for name in safetensors idx; do
  echo "run_fuzzers: building $name"
  # shellcheck disable=SC2086
  "$cxx" "${flags[@]}" ${sources[$name]} runtime/core/check.cc runtime/core/dtype.cc "${libs[@]}" -o "$out/${name}_fuzzer"
  work="$out/$name"
  rm -rf "$work"
  mkdir -p "$work/corpus"
  cp tests/fuzz/corpus/"$name"/* "$work/corpus/"
  echo "run_fuzzers: running $name for ${seconds}s"
  if ! (cd "$work" && ASAN_OPTIONS=detect_leaks=1 "$out/${name}_fuzzer" -max_total_time="$seconds" \
          -max_len=65536 -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 corpus >"$work/fuzz.log" 2>&1); then
    echo "run_fuzzers: $name FAILED; input and log in $work" >&2
    tail -40 "$work/fuzz.log" >&2
    status=1
  else
    grep -E "^stat::number_of_executed_units|Done [0-9]+ runs" "$work/fuzz.log" | sed "s/^/run_fuzzers: $name: /"
  fi
done
exit "$status"
