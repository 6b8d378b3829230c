#!/usr/bin/env bash
# tests/capi/async_step.c at 1 and 2 ranks on the CPU: the asynchronous step gives the synchronous step's model bit
# for bit, and DDP_CUDA_GRAPH=0 changes nothing (on the GPU machine the same comparison is tools/gpu_jobs.txt's
# async_step_cuda_graph_equals_eager, where it compares the captured step with the step kernel by kernel).
set -uo pipefail
binary="$1"
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/test_harness.sh"
for np in 1 2; do
  out=$(mpirun_shared "$np" "$binary" cpu 20 2>&1) || fail "$np rank(s): $out"
  grep -q '^async_step: OK$' <<<"$out" || fail "$np rank(s): $out"
  eager=$(DDP_CUDA_GRAPH=0 mpirun_shared "$np" "$binary" cpu 20 2>&1) || fail "$np rank(s), DDP_CUDA_GRAPH=0: $eager"
  [ "$out" = "$eager" ] || fail "$np rank(s): DDP_CUDA_GRAPH=0 changed the result:
$out
---
$eager"
  echo "$np rank(s): OK ($(grep -c '^prediction' <<<"$out") predictions the same)"
done
finish async_step
