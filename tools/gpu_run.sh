#!/usr/bin/env bash
# Runs, on a GPU machine without Bazel, what tools/gpu_bundle.sh put in .gpu/: every GPU test binary, then
# every job of tools/gpu_jobs.txt (multi-rank runs, examples, benchmarks). Prints each result and a summary;
# logs go to $OUT (or .gpu/logs) when set.
set -uo pipefail
cd "$(dirname "$0")/.."
libs=/tmp/ddp-gpu-lib
mkdir -p "$libs" && tar -C "$libs" -xJf .gpu/lib.tar.xz
[ -f .gpu/bin.tar.xz ] && tar -C .gpu -xJf .gpu/bin.tar.xz   # the binaries, packed by tools/gpu_bundle.sh
export LD_LIBRARY_PATH="$libs/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
# The training jobs read the data set bundled with GPU_BUNDLE_DATA=1.
export DDP_GPU_DATA="$PWD/.gpu/data"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# NVLink multicast stays off on shared hosts: a program using it can take the host's GPUs out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# A job that hangs is ended after GPU_JOB_TIMEOUT seconds (a failure, not a wait for the call's own limit).
job_timeout=${GPU_JOB_TIMEOUT:-600}
logs="${OUT:-.gpu/logs}"
mkdir -p "$logs"
nvidia-smi -L || true
# One rank per GPU for the jobs named *_multigpu; on a node with fewer than two GPUs they are skipped, and said so.
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
export GPUS
passed=0
failed=0
skipped=0
failures=()

record() {  # name status
  if [ "$2" -eq 0 ]; then
    passed=$((passed + 1)); echo "PASS $1"
  else
    failed=$((failed + 1)); failures+=("$1"); echo "FAIL $1 (exit $2): last lines of $logs/$1.log:"; tail -20 "$logs/$1.log"
  fi
}

for t in $(cat .gpu/tests.txt); do
  if [ -n "${GPU_TESTS:-}" ] && ! grep -qE "$GPU_TESTS" <<<"$t"; then continue; fi
  [ -x ".gpu/bin/$t" ] || continue
  timeout "$job_timeout" ".gpu/bin/$t" </dev/null >"$logs/$t.log" 2>&1
  s=$?
  grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/$t.log" | sed "s/^/  $t: /"
  record "$t" "$s"
done

# Jobs: "name<TAB>command" lines; the command runs in bash with B=.gpu/bin.
export B="$PWD/.gpu/bin"
while IFS=$'\t' read -r name command; do
  [ -z "$name" ] || [ "${name:0:1}" = "#" ] && continue
  # GPU_JOBS selects jobs by a regular expression on their names, GPU_SKIP leaves some out.
  if [ -n "${GPU_JOBS:-}" ] && ! grep -qE "$GPU_JOBS" <<<"$name"; then continue; fi
  if [ -n "${GPU_SKIP:-}" ] && grep -qE "$GPU_SKIP" <<<"$name"; then continue; fi
  if [[ "$name" == *_multigpu ]] && [ "${GPUS:-0}" -lt 2 ]; then
    skipped=$((skipped + 1)); echo "SKIP $name (one rank per GPU over NCCL needs two or more GPUs; this node has ${GPUS:-0})"
    continue
  fi
  timeout "$job_timeout" bash -c "$command" </dev/null >"$logs/$name.log" 2>&1
  s=$?
  tail -5 "$logs/$name.log" | sed "s/^/  $name: /"
  record "$name" "$s"
done <tools/gpu_jobs.txt

echo "gpu: $passed passed, $failed failed, $skipped skipped ${failures[*]:-}"
[ "$failed" -eq 0 ]
