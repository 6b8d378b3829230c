#!/usr/bin/env bash
# Sets up the machine and runs every test it can run: all of them on a GPU machine, and everything but the
# `gpu`/`multigpu`-tagged tests where there is no GPU (detected here, not configured by hand).
# Extra arguments go to `bazel test` (for example a target pattern or --config=asan).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh

# OpenBLAS's kernel pinned for every test, as ddprun pins it for its ranks (launcher/command.h, kOpenBlasCoreType,
# the one place it is named): OpenBLAS reads OPENBLAS_CORETYPE once when it is loaded, and .bazelrc passes it to
# the tests. Unset, it picks by the CPU, and results recorded on one machine would differ on another.
if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
  OPENBLAS_CORETYPE=$(sed -n 's/.*kOpenBlasCoreType = "\(.*\)";/\1/p' launcher/command.h)
  export OPENBLAS_CORETYPE
  echo "test: OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE (unset here; the kernel ddprun gives its ranks)"
fi

gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi
filter=()
if [ "$gpus" -eq 0 ]; then
  echo "test: no GPU on this machine: gpu and multigpu tests are filtered out (run them with tools/gpu_bundle.sh)"
  filter=(--test_tag_filters=-gpu,-multigpu)
elif [ "$gpus" -lt 2 ]; then
  echo "test: one GPU: multigpu tests are filtered out"
  filter=(--test_tag_filters=-multigpu)
fi

targets=("$@")
[ "${#targets[@]}" -eq 0 ] && targets=(//...)

log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
# The layering: no layer of the runtime includes a header of a layer above it (tools/check_layers.py).
if [ "$#" -eq 0 ]; then
  if python3 tools/check_layers.py; then
    echo "//tools:check_layers PASSED" >>"$log"
  else
    echo "//tools:check_layers FAILED" >>"$log"
    layers_failed=1
  fi
fi
echo "test: bazel test ${targets[*]}"
bazel test "${filter[@]}" --test_output=errors --test_summary=short "${targets[@]}" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
[ "${layers_failed:-0}" = 1 ] && status=1
# The same CPU tests again under AddressSanitizer + UndefinedBehaviorSanitizer (skip with DDP_TEST_ASAN=0).
if [ "${DDP_TEST_ASAN:-1}" = 1 ] && [ "$#" -eq 0 ]; then
  echo "test: the CPU tests again under --config=asan"
  bazel test --config=asan --test_tag_filters=-gpu,-multigpu,-no_asan --test_output=errors --test_summary=short \
    //... 2>&1 | sed 's/^\(\/\/.* \)\(PASSED\|FAILED\)/\1\2 (asan)/' | tee -a "$log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
# Fuzzers over the checkpoint and IDX readers, bounded in time (skip with DDP_TEST_FUZZ=0).
if [ "${DDP_TEST_FUZZ:-1}" = 1 ] && [ "$#" -eq 0 ] && [ -x tests/fuzz/run_fuzzers.sh ]; then
  echo "test: fuzzing"
  if tests/fuzz/run_fuzzers.sh 2>&1 | tail -20; then
    echo "//tests/fuzz PASSED" | tee -a "$log"
  else
    echo "//tests/fuzz FAILED" | tee -a "$log"
    status=1
  fi
fi
# The runtime as another workspace's dependency (examples/external_workspace; skip with DDP_TEST_EXTERNAL=0).
# Its own Bazel server and output base: the first run builds the runtime again, about 2 minutes on 2 cores.
if [ "${DDP_TEST_EXTERNAL:-1}" = 1 ] && [ "$#" -eq 0 ]; then
  echo "test: the runtime as an external repository of another workspace"
  if tools/test_external_workspace.sh 2>&1 | tail -20; then
    echo "//examples/external_workspace PASSED" | tee -a "$log"
  else
    echo "//examples/external_workspace FAILED" | tee -a "$log"
    status=1
  fi
fi
set -e

# One closing line for CI: counts from Bazel's per-target summary.
passed=$(grep -cE '^//.* (PASSED|\(cached\) PASSED)' "$log" || true)
failed=$(grep -cE '^//.* (FAILED|TIMEOUT|NO STATUS|INCOMPLETE|FAILED TO BUILD)' "$log" || true)
echo "$passed passed, $failed failed"
exit "$status"
