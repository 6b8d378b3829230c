#!/usr/bin/env bash
# //examples:train_mlp end to end on the CPU, under ddprun with 2 ranks:
#   - a short training reaches a stated accuracy and writes metrics, a trace and a checkpoint;
#   - the checkpoint loads into torch.nn.Sequential (strict) and PyTorch computes the same test accuracy;
#   - a run stopped at step 30 and resumed gives bitwise the same losses as a run never stopped;
#   - gradient clipping with a bound never reached changes nothing, a tight bound logs norms and clips;
#   - a checkpoint of 2 ranks resumes on 3 and on 1; with --global-batch-size the losses follow the run never
#     stopped to rounding;
#   - bad input ends every rank with one clear message and a non-zero exit, and nothing else (the whole output
#     compared at 2 and 4 ranks).
set -uo pipefail
ddprun="$1"
train="$2"
checker="$3"
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/test_harness.sh"
expect_error() {  # NAME EXPECTED ARGS...
  local name="$1" expected="$2"
  shift 2
  local out
  if out=$("$ddprun" -np 2 -- "$train" "$@" 2>&1); then fail "$name: exited 0"; fi
  grep -qF -- "$expected" <<<"$out" || { fail "$name: expected '$expected' in:"; echo "$out" | head -20; }
}
small=(--hidden 64 --layers 2 --batch-size 32 --lr 1e-3 --weight-decay 1e-4 --log-every 10 --seed 7)

# 1. A short training: 150 steps of 64 samples at a constant lr reach 0.78 test accuracy (0.797 measured).
out=$("$ddprun" -np 2 -- "$train" "${small[@]}" --schedule constant --max-steps 150 --checkpoint-dir "$work/ckpt" \
  --metrics-file "$work/metrics.jsonl" --trace-file "$work/trace.json" 2>&1)
status=$?
echo "$out" | tail -5
[ "$status" -eq 0 ] || fail "short training exited $status"
acc=$(grep -o 'final step=150 test_loss=[0-9.]* test_accuracy=[0-9.]*' <<<"$out" | sed 's/.*test_accuracy=//')
[ -n "$acc" ] || fail "no final test_accuracy line"
awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 0.78) }' || fail "test accuracy $acc below 0.78 after 150 steps"
grep -q '"step":150' "$work/metrics.jsonl" || fail "metrics file has no line for step 150"
grep -q '"test_accuracy"' "$work/metrics.jsonl" || fail "metrics file has no epoch line"
/usr/bin/python3 - "$work/trace.json" <<'PY' || fail "trace file is not a Chrome trace with backward and allreduce spans"
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
names = {(e.get("cat"), e.get("name")) for e in events if e.get("ph") == "X"}
assert ("compute", "backward") in names and ("comm", "allreduce") in names, names
assert all("bucket" in e["args"] and "bytes" in e["args"] for e in events if e.get("name") == "allreduce")
PY

# 2. PyTorch loads the checkpoint and agrees on the accuracy.
ckpt=$(ls "$work/ckpt"/ckpt-*.safetensors | tail -1)
torch_out=$(/usr/bin/python3 "$checker" "$ckpt" /usr/share/datasets/fashion-mnist 64 2 2>&1) || fail "PyTorch could not load $ckpt: $torch_out"
echo "$torch_out"
grep -qx "keys=0.bias,0.weight,2.bias,2.weight,4.bias,4.weight" <<<"$torch_out" || fail "state-dict names differ from nn.Sequential's"
tacc=$(sed -n 's/^torch_test_accuracy=//p' <<<"$torch_out")
awk -v a="${acc:-0}" -v b="${tacc:-9}" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.0005) }' \
  || fail "PyTorch's accuracy $tacc differs from the runtime's $acc"

# 3. Resume equivalence: 60 steps at once, or 30 then a resume to 60 (a checkpoint every 10 steps).
losses() { grep -o '"loss":[^,]*,"lr"' "$1" | grep -v null; }
"$ddprun" -np 2 -- "$train" "${small[@]}" --max-steps 60 --metrics-file "$work/full.jsonl" >/dev/null 2>&1 \
  || fail "uninterrupted run failed"
"$ddprun" -np 2 -- "$train" "${small[@]}" --max-steps 30 --checkpoint-dir "$work/resume" --checkpoint-every 10 \
  --metrics-file "$work/part.jsonl" >/dev/null 2>&1 || fail "first half failed"
mkdir -p "$work/odd" && cp "$work/resume/ckpt-00000010.safetensors" "$work/odd/" || fail "no checkpoint at step 10"
out=$("$ddprun" -np 2 -- "$train" "${small[@]}" --max-steps 60 --checkpoint-dir "$work/resume" --resume "$work/resume" \
  --metrics-file "$work/part.jsonl" 2>&1) || fail "resumed run failed: $out"
grep -q "resumed from .*ckpt-00000030.safetensors: step 30" <<<"$out" || fail "did not resume from step 30: $out"
if [ "$(losses "$work/full.jsonl")" != "$(losses "$work/part.jsonl")" ]; then
  fail "resumed losses differ from the uninterrupted run"
  diff <(losses "$work/full.jsonl") <(losses "$work/part.jsonl")
fi
[ "$(losses "$work/full.jsonl" | wc -l)" -eq 6 ] || fail "expected 6 logged losses"

# 3b. --clip-grad-norm: a bound no gradient reaches changes nothing (bitwise the same losses as the run above);
#     a tight one logs the norms before clipping and changes the training.
"$ddprun" -np 2 -- "$train" "${small[@]}" --max-steps 60 --clip-grad-norm 1e9 --metrics-file "$work/loose.jsonl" \
  >/dev/null 2>&1 || fail "run with --clip-grad-norm 1e9 failed"
[ "$(losses "$work/full.jsonl")" == "$(losses "$work/loose.jsonl")" ] || fail "a clip bound never reached changed the losses"
"$ddprun" -np 2 -- "$train" "${small[@]}" --max-steps 60 --clip-grad-norm 0.05 --metrics-file "$work/clip.jsonl" \
  >/dev/null 2>&1 || fail "run with --clip-grad-norm 0.05 failed"
norms=$(grep -o '"grad_norm":[0-9.e+-]*' "$work/clip.jsonl" | sed 's/.*://')
[ "$(wc -w <<<"$norms")" -eq 6 ] || fail "expected 6 logged gradient norms, got: $norms"
awk '{ for (i = 1; i <= NF; i++) if (!($i > 0.05)) exit 1 }' <<<"$norms" || fail "gradient norms not above the 0.05 bound: $norms"
[ "$(losses "$work/full.jsonl")" != "$(losses "$work/clip.jsonl")" ] || fail "clipping to 0.05 changed nothing"

# 4. Resume at another number of ranks. Step 10 of 2 ranks x 32 stopped at global sample 640: 3 ranks take the
#    rest of the epoch from there (with their own global batch of 96, as the resume line says); 1 rank resumes
#    the 60-step checkpoint (sample 3840).
out=$("$ddprun" -np 3 -- "$train" "${small[@]}" --max-steps 20 --resume "$work/odd" 2>&1) || fail "3 ranks could not resume: $out"
grep -q "resumed from .*ckpt-00000010.safetensors: step 10, epoch 0, sample 640 (written on 2 ranks, continuing on 3; global batch 64 -> 96)" <<<"$out" \
  || fail "no resume line for 2 -> 3 ranks: $out"
grep -q "final step=20 " <<<"$out" || fail "the 3-rank resume did not end at step 20: $out"
out=$("$ddprun" -np 1 -- "$train" "${small[@]}" --max-steps 70 --resume "$work/resume" 2>&1) || fail "1 rank could not resume: $out"
# --global-batch-size keeps the global batch: 30 steps on 2 ranks (48 each) resumed on 3 ranks (32 each) see the
# same samples per step as 60 steps on 2 ranks, so the losses agree to rounding (the average runs over other
# ranks); a global batch that does not split over the ranks is refused.
global=(--hidden 64 --layers 2 --global-batch-size 96 --lr 1e-3 --weight-decay 1e-4 --log-every 10 --seed 7)
"$ddprun" -np 2 -- "$train" "${global[@]}" --max-steps 60 --metrics-file "$work/g_full.jsonl" >/dev/null 2>&1 \
  || fail "uninterrupted --global-batch-size run failed"
"$ddprun" -np 2 -- "$train" "${global[@]}" --max-steps 30 --checkpoint-dir "$work/g" --checkpoint-every 10 \
  --metrics-file "$work/g_part.jsonl" >/dev/null 2>&1 || fail "first half of the --global-batch-size run failed"
out=$("$ddprun" -np 3 -- "$train" "${global[@]}" --max-steps 60 --checkpoint-dir "$work/g" --resume "$work/g" \
  --metrics-file "$work/g_part.jsonl" 2>&1) || fail "3 ranks could not resume the --global-batch-size run: $out"
grep -q "(written on 2 ranks, continuing on 3; global batch 96 -> 96)" <<<"$out" || fail "no resume line for 2 -> 3 ranks: $out"
paste <(losses "$work/g_full.jsonl") <(losses "$work/g_part.jsonl") | sed 's/"loss":\([^,]*\),"lr"/\1/g' | awk '
  NF == 2 { n++; d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) bad = bad " " $1 "/" $2 }
  END { if (n != 6 || bad != "") { print "losses differ after 2 -> 3 ranks (" n " lines):" bad; exit 1 } }' \
  || fail "a --global-batch-size run resumed on 3 ranks does not follow the uninterrupted one"
expect_error "global batch that does not split" \
  "a global batch of 97 does not split evenly over 2 ranks; start 1 or 97 ranks, which divide it (a resumed run keeps its global batch), or for a new run pass a multiple of 2 (96 or 98) or a per-rank batch size" \
  --global-batch-size 97
expect_error "both batch sizes" "--batch-size excludes --global-batch-size" --global-batch-size 96 --batch-size 48
expect_error "resume with another global batch" "was written with --global-batch-size 96, this run has --global-batch-size 64" \
  "${global[@]}" --global-batch-size 64 --max-steps 70 --resume "$work/g"

# 5. Bad input.
expect_error "unknown flag" "unknown argument '--bogus' (see --help)" --bogus
expect_error "a flag's prefix" "unknown arguments '--batch' '32'; did you mean --batch-size?" --batch 32
expect_error "zero batch" "--batch-size" --batch-size 0
expect_error "negative lr" "--lr" --lr -1
expect_error "negative clip norm" "--clip-grad-norm" --clip-grad-norm -1
expect_error "missing data" "data set $work/nowhere: no such file or directory" --data "$work/nowhere"
expect_error "batch over shard" "larger than rank" --batch-size 40000
expect_error "divergence" "training diverged" --optimizer sgd --lr 1e12 --momentum 0 --log-every 1 --max-steps 20
# --skip-nonfinite skips such steps, and stops with a clear message once --skip-nonfinite-limit of them come in a
# row (the parameters are then no longer finite), instead of "finishing" a run that learnt nothing.
if out=$("$ddprun" -np 2 -- "$train" "${small[@]}" --optimizer sgd --lr 1e12 --momentum 0 --epochs 1 --max-steps 40 \
  --skip-nonfinite --skip-nonfinite-limit 5 2>&1); then fail "--skip-nonfinite with every step skipped exited 0"; fi
grep -q "skipping step .*: the loss is not finite" <<<"$out" || fail "--skip-nonfinite skipped nothing"
[ "$(grep -c "\[rank 0\] skipping step" <<<"$out")" -eq 5 ] || fail "expected 5 skipped steps before the stop"
grep -q "5 batches in a row gave a non-finite loss" <<<"$out" || { fail "no clear stop after 5 skipped steps:"; tail -5 <<<"$out"; }
if [ ! -e /dev/nvidia0 ]; then expect_error "cuda without gpu" "CUDA was asked for" --device cuda; fi

# 6. An error on one rank alone (rank 1 fails after step 5 while rank 0 trains on) ends the job at once with that
#    rank's own message, not after the collective timeout with a guess.
t0=$(date +%s)
out=$(DDP_COLLECTIVE_TIMEOUT_S=120 DDP_FAULT_KILL_STEP=5 DDP_FAULT_KILL_RANK=1 DDP_FAULT_KIND=throw timeout 100 \
  "$ddprun" -np 2 -- "$train" "${small[@]}" --max-steps 50 2>&1)
status=$?
elapsed=$(($(date +%s) - t0))
[ "$status" -ne 0 ] || fail "an error on rank 1 alone: exited 0"
grep -qF "[rank 1] error: fault injection: an error on rank 1 alone after step 5" <<<"$out" \
  || { fail "rank 1's own error not shown:"; echo "$out" | tail -8; }
[ "$elapsed" -lt 40 ] || fail "the job took $elapsed s to end after an error on one rank"

# 6b. One error, one message: what the user sees, whole, at 2 and 4 ranks: the message once, naming the ranks and
#     what to do, then ddprun's line; no MPI banner (MPI_ABORT, "Primary job terminated normally", ORTE_ERROR_LOG)
#     and nothing about the device before a bad flag.
expect_output() {  # NAME EXPECTED-FILE COMMAND...
  local name="$1" expected="$2"
  shift 2
  local got
  got=$("$@" 2>&1)
  diff <(printf '%s\n' "$got") "$expected" >/dev/null || { fail "$name: the whole output differs:"; diff <(printf '%s\n' "$got") "$expected"; }
}
mkdir -p "$work/shape/train" "$work/shape/test"
/usr/bin/python3 -c "
import numpy as np, sys
for name, rows, features in (('train', 64, 5), ('test', 16, 3)):
    np.save(f'{sys.argv[1]}/{name}/features.npy', np.zeros((rows, features), np.float32))
    np.save(f'{sys.argv[1]}/{name}/targets.npy', np.zeros((rows, 2), np.float32))
" "$work/shape" || fail "cannot write the shape case's .npy files"
for np in 2 4; do
  ranks=$(seq -s, 0 $((np - 1)))
  printf '%s\n' "[rank 0] error: bad command line:" "[rank 0]   ranks $ranks: unknown argument '--bogus' (see --help)" \
    "ddprun: job failed (rank 0 first, exit status 65) with exit status 65" >"$work/bogus.expected"
  expect_output "a bad flag on $np ranks" "$work/bogus.expected" "$ddprun" -np "$np" -- "$train" --bogus
  printf '%s\n' "[rank 0] error: cannot read the data set:" \
    "[rank 0]   ranks $ranks: data set $work/nowhere: no such file or directory; name a directory with features.npy and targets.npy, a .safetensors file, or a directory with the four Fashion-MNIST .gz files" \
    "ddprun: job failed (rank 0 first, exit status 65) with exit status 65" >"$work/nodata.expected"
  expect_output "no data on $np ranks" "$work/nodata.expected" "$ddprun" -np "$np" -- "$train" --device cpu --data "$work/nowhere"
  # A shape error: a test set whose samples are not the training set's.
  printf '%s\n' "[rank 0] error: the data does not fit the model:" \
    "[rank 0]   ranks $ranks: the test set has 3 features per sample, the model's input has 5 as the training set has; give a test set of the training set's features" \
    "ddprun: job failed (rank 0 first, exit status 65) with exit status 65" >"$work/shape.expected"
  expect_output "a shape error on $np ranks" "$work/shape.expected" "$ddprun" -np "$np" -- "$train" --device cpu \
    --data "$work/shape/train" --test-data "$work/shape/test"
  # One rank's error alone (stderr only: rank 0's start line goes to stdout).
  printf '%s\n' "[rank 1] error: fault injection: an error on rank 1 alone after step 5" \
    "ddprun: job failed (rank 1 first, exit status 1) with exit status 1" >"$work/alone.expected"
  expect_output "an error on rank 1 of $np alone" "$work/alone.expected" \
    env DDP_FAULT_KILL_STEP=5 DDP_FAULT_KILL_RANK=1 DDP_FAULT_KIND=throw sh -c '"$@" 2>&1 >/dev/null' - \
    "$ddprun" -np "$np" -- "$train" "${small[@]}" --device cpu --max-steps 50
done

# 7. Output paths are checked on every rank before the first step, not when first written.
mkdir -p "$work/a_directory"
expect_error "metrics file is a directory" "cannot open metrics file $work/a_directory" "${small[@]}" --metrics-file "$work/a_directory"
expect_error "trace file under /proc" "cannot write the run's outputs" "${small[@]}" --trace-file /proc/ddp-trace.json
echo x >"$work/a_file"
expect_error "checkpoint dir is a file" "$work/a_file" "${small[@]}" --checkpoint-dir "$work/a_file"
expect_error "checkpoint dir under /proc" "cannot use the checkpoint directory" "${small[@]}" --checkpoint-dir /proc/ddp-ckpt

# 8. A fresh run is refused in a directory holding another run's checkpoints (its pruning would delete its own);
#    a second job on a directory in use is refused naming the first.
expect_error "fresh run in a used directory" "already holds another run's checkpoints (newest: ckpt-00000060.safetensors); to continue that run use --resume" \
  "${small[@]}" --max-steps 5 --checkpoint-dir "$work/resume"
"$ddprun" -np 1 -- "$train" "${small[@]}" --max-steps 1000000 --log-every 1 --checkpoint-dir "$work/busy" >"$work/busy.log" 2>&1 &
holder=$!
for _ in $(seq 100); do grep -q "epoch=0 step=" "$work/busy.log" && break; sleep 0.2; done
expect_error "second job on a directory in use" "is in use by another job (pid" "${small[@]}" --max-steps 5 --checkpoint-dir "$work/busy"
kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null

# A file-size limit (ulimit -f) makes the checkpoint write fail by name, with no partial file, instead of
# SIGXFSZ killing the rank without a word (a world of one: mpirun's own files need more than this limit).
out=$(ulimit -f 20000; "$train" --max-steps 2 --hidden 1024 --checkpoint-dir "$work/fsize" 2>&1)
status=$?
[ "$status" -eq 1 ] || fail "a checkpoint past ulimit -f: exit status $status, not 1"
grep -q "failed: File too large" <<<"$out" || { fail "no message for a checkpoint past ulimit -f:"; tail -3 <<<"$out"; }
[ -z "$(ls "$work/fsize")" ] || fail "a partial checkpoint was left: $(ls -a "$work/fsize")"

# Swapped training and test files.
mkdir -p "$work/swapped"
for f in images-idx3 labels-idx1; do
  ln -sf "/usr/share/datasets/fashion-mnist/t10k-$f-ubyte.gz" "$work/swapped/train-$f-ubyte.gz"
  ln -sf "/usr/share/datasets/fashion-mnist/train-$f-ubyte.gz" "$work/swapped/t10k-$f-ubyte.gz"
done
expect_error "swapped train and test files" "are the train-* and t10k-* files swapped?" --data "$work/swapped"

# 9. Flags that do not make sense, and resumes that would change the run, say what is wrong.
expect_error "nan learning rate" "--lr: must be a finite number, got nan" --lr nan
expect_error "zero epochs" "--epochs: must be at least 1, got 0" --epochs 0
expect_error "nan warmup" "--warmup-epochs: must be a finite number" --warmup-epochs nan
expect_error "nan clip norm" "--clip-grad-norm: must be a finite number" --clip-grad-norm nan
expect_error "warmup past the run" "is longer than the run" --epochs 2 --warmup-epochs 3
expect_error "resume with another optimizer" "was written with --optimizer adamw, this run has --optimizer sgd" \
  "${small[@]}" --max-steps 70 --optimizer sgd --resume "$work/resume"
expect_error "resume with another activation" "was written with --activation relu, this run has --activation gelu" \
  "${small[@]}" --max-steps 70 --activation gelu --resume "$work/resume"
expect_error "resume with another batch size" "was written with --batch-size 32, this run has --batch-size 16" \
  "${small[@]}" --max-steps 70 --batch-size 16 --resume "$work/resume"
expect_error "resume of a missing directory" "--resume $work/nothing-here: no such directory" "${small[@]}" --resume "$work/nothing-here"
expect_error "resume of a file" "is a file; pass the directory that holds the checkpoints" "${small[@]}" \
  --resume "$(ls "$work/resume"/ckpt-*.safetensors | tail -1)"

finish train_mlp
