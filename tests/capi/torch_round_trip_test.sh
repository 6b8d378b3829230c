#!/usr/bin/env bash
# Weights to and from PyTorch 1.13 (CPU), for the tanh surrogate and a residual model with LayerNorm, a
# frequency encoding and a Dropout (predictions in eval mode), each described in JSON: PyTorch trains it offline
# and saves its state_dict as safetensors; the C program (torch_round_trip.c) builds it from the JSON on 2 and on
# 3 ranks of a communicator split from a world of 3, loads the weights, matches PyTorch's outputs, fine-tunes and
# saves; PyTorch loads the result (strict) and gives the C program's ddp_predict outputs to 1e-5. The Fortran
# program, when given, builds the model from the JSON, loads PyTorch's weights and gives PyTorch's outputs too.
#
#   torch_round_trip_test.sh C_PROGRAM [FORTRAN_PROGRAM]     C_PROGRAM "none": the Fortran program only
set -uo pipefail
binary="$1"
fortran="${2:-}"
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
source "$root/tests/test_harness.sh"
torch_side="$root/tests/capi/torch_round_trip.py"

cat >"$work/surrogate.json" <<'JSON'
{"inputs": 5, "layers": [{"type": "linear", "out": 64}, {"type": "tanh"},
                         {"type": "linear", "out": 64}, {"type": "tanh"},
                         {"type": "linear", "out": 1}]}
JSON
cat >"$work/residual.json" <<'JSON'
{"inputs": 3, "layers": [
  {"type": "frequency_encoding", "frequencies": 2},
  {"type": "linear", "out": 32},
  {"type": "residual", "body": [{"type": "layer_norm"}, {"type": "linear", "out": 32}, {"type": "gelu"},
                                {"type": "dropout", "p": 0.1}]},
  {"type": "residual", "body": [{"type": "layer_norm"}, {"type": "linear", "out": 16}, {"type": "silu"}],
   "projection": [{"type": "linear", "out": 16, "bias": false}]},
  {"type": "linear", "out": 2}]}
JSON

for model in surrogate residual; do
  dir="$work/$model"
  mkdir -p "$dir"
  /usr/bin/python3 "$torch_side" offline "$work/$model.json" "$dir" || { fail "$model: PyTorch offline"; continue; }
  for trainers in 2 3; do
    [ "$binary" = none ] && break
    out=$(mpirun_shared 3 "$binary" "$work/$model.json" "$dir" "$trainers" 2>&1) ||
      fail "$model, $trainers trainers: exited non-zero: $out"
    grep -q '^torch_round_trip: OK$' <<<"$out" || fail "$model, $trainers trainers: $out"
    echo "$model, $trainers trainers: $(grep -v '^torch_round_trip: OK' <<<"$out" | tr '\n' ' ')"
    /usr/bin/python3 "$torch_side" check "$work/$model.json" "$dir" "$dir/finetuned-$trainers.safetensors" \
      "$dir/c_finetuned-$trainers.bin" || fail "$model, $trainers trainers: PyTorch disagrees"
  done
  if [ -n "$fortran" ]; then
    out=$(mpirun_shared 2 "$fortran" "$work/$model.json" "$dir" 2>&1) || fail "$model, Fortran: $out"
    grep -q '^torch_round_trip_f: OK$' <<<"$out" || fail "$model, Fortran: $out"
    /usr/bin/python3 "$torch_side" compare "$dir/f_offline.bin" "$dir/torch_offline.bin" ||
      fail "$model, Fortran: PyTorch disagrees"
  fi
done
finish torch_round_trip
