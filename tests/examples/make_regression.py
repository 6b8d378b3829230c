"""A smooth regression as .npy files, for the residual example's tests and benchmark.

Usage: make_regression.py OUT_DIR FEATURES TARGETS TRAIN_ROWS TEST_ROWS

Writes OUT_DIR/train and OUT_DIR/test, each with features.npy [rows, FEATURES] uniform in [-1, 1] and
targets.npy [rows, TARGETS]: target j = sin(pi * x_j) * x_{j+1} + 0.5 * x_{j+2}^2 (indices mod FEATURES), a
function a residual network fits well and a linear model does not. Seeded: the same files on every machine.
"""
import os
import sys

import numpy as np

out, features, targets, train_rows, test_rows = sys.argv[1], *map(int, sys.argv[2:6])
rng = np.random.default_rng(0)
for name, rows in (("train", train_rows), ("test", test_rows)):
    os.makedirs(f"{out}/{name}", exist_ok=True)
    x = rng.uniform(-1, 1, size=(rows, features)).astype(np.float32)
    j = np.arange(targets)
    y = np.sin(np.pi * x[:, j % features]) * x[:, (j + 1) % features] + 0.5 * x[:, (j + 2) % features] ** 2
    np.save(f"{out}/{name}/features.npy", x)
    np.save(f"{out}/{name}/targets.npy", np.ascontiguousarray(y, dtype=np.float32))
