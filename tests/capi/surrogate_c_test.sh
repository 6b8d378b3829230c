#!/usr/bin/env bash
# The C program of examples/embedded at 1, 2 and 3 ranks: trains on a split communicator (all ranks, or all but
# the last), its own messages on that communicator and on the world arrive intact between steps, the surrogate's
# held-out error falls below 0.01 and a tenth of its start, and its checkpoint reloads to the same predictions.
set -uo pipefail
binary="$1"
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/test_harness.sh"
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/capi/surrogate_checks.sh"
check_surrogate surrogate "$binary" 300
