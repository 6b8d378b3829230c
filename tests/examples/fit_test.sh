#!/usr/bin/env bash
# examples/fit (a user's program of 40 lines on the Trainer) against train_mlp with the same recipe, 2 CPU ranks:
# the same checkpoint file, byte for byte, after the same steps; and its graceful stop and resume work as the main
# job's do. The README shows it as it is.
set -uo pipefail
ddprun="$1"
train="$2"
fit="$3"
fit_source="$4"
readme="$5"
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/test_harness.sh"

shown_as_is "$readme" "$fit_source"

"$ddprun" -np 2 -- "$fit" "$work/fit" 40 >"$work/fit.out" 2>&1 || { fail "fit failed"; tail "$work/fit.out"; }
"$ddprun" -np 2 -- "$train" --checkpoint-dir "$work/train_mlp" --max-steps 40 >"$work/train.out" 2>&1 \
  || { fail "train_mlp failed"; tail "$work/train.out"; }
a="$work/fit/ckpt-00000040.safetensors" b="$work/train_mlp/ckpt-00000040.safetensors"
[ -f "$a" ] && [ -f "$b" ] || fail "a checkpoint of step 40 is missing"
cmp "$a" "$b" || fail "fit's checkpoint differs from train_mlp's"
grep -q "fit: 2 rank(s)" "$work/fit.out" || fail "fit's first line is missing"

# Started afresh into a directory that holds checkpoints, it is refused; with DDP_RESUME=1 (ddprun's restarts) it
# goes on from its newest checkpoint.
if out=$("$ddprun" -np 2 -- "$fit" "$work/fit" 50 2>&1); then fail "a fresh start into a run's directory was not refused"; fi
[ -f "$work/fit/ckpt-00000050.safetensors" ] && fail "the refused run wrote a checkpoint"
out=$(DDP_RESUME=1 "$ddprun" -np 2 -- "$fit" "$work/fit" 50 2>&1) || fail "fit did not continue with DDP_RESUME=1: $out"
grep -q "resumed from .*ckpt-00000040.safetensors: step 40" <<<"$out" || fail "fit did not resume from step 40: $out"
grep -q "final step=50" <<<"$out" || fail "fit did not reach step 50: $out"

finish fit
