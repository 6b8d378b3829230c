#!/usr/bin/env bash
# The main job on one's own data on the GPU: a regression (.npy files, 2 float targets) with tanh and with sigmoid,
# which run as standalone activation kernels between the GEMMs, reaches a stated test loss, and the graphed run
# gives the eager run's losses bit for bit. Run by tools/gpu_run.sh.
set -uo pipefail
B=${B:?B: the folder of the bundled binaries}
work=$(mktemp -d)
python3 - "$work" <<'PY' || exit 1
import os, sys, numpy as np
rng = np.random.default_rng(0)
for name, n in (("train", 8192), ("test", 2048)):
    os.makedirs(f"{sys.argv[1]}/{name}")
    x = rng.uniform(-2, 2, size=(n, 3)).astype(np.float32)
    np.save(f"{sys.argv[1]}/{name}/features.npy", x)
    np.save(f"{sys.argv[1]}/{name}/targets.npy", np.stack([np.sin(x[:, 0]) + 0.5 * x[:, 1] ** 2, x[:, 2] * x[:, 0]], 1))
PY
status=0
for act in tanh sigmoid; do
  for mode in graph eager; do
    flag=()
    [ "$mode" = eager ] && flag=(--no-cuda-graph)
    out=$(mpirun -np 1 --bind-to none "$B/train_mlp" --device cuda --data "$work/train" --test-data "$work/test" \
      --hidden 64 --layers 2 --activation "$act" --batch-size 64 --lr 3e-3 --schedule constant --epochs 8 \
      --log-every 20 --metrics-file "$work/$act-$mode.jsonl" "${flag[@]}" 2>&1 | tr '\r' '\n')
    echo "$out" | grep -E "^(train_mlp:|final )"
    loss=$(sed -n 's/^final step=[0-9]* test_loss=\([0-9.]*\).*/\1/p' <<<"$out")
    awk -v l="${loss:-9}" 'BEGIN { exit !(l < 0.05) }' || { echo "FAIL: $act $mode: test loss ${loss:-none} not below 0.05"; status=1; }
  done
  if [ "$(grep -o '"loss":[^,]*' "$work/$act-graph.jsonl")" != "$(grep -o '"loss":[^,]*' "$work/$act-eager.jsonl")" ]; then
    echo "FAIL: $act: the graphed run's losses differ from the eager run's"
    status=1
  fi
done
exit $status
