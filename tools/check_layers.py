#!/usr/bin/env python3
"""Fails when a layer of the runtime includes a header of a layer above it.

The layers, bottom first (docs/layout.md says what each holds). A file may include its own layer and the
ones below; examples/, bench/ and tests/ may include anything; the launcher only runtime/core (it links neither
CUDA kernels, nor NCCL, nor MPI). Bazel's visibility keeps other workspaces on //:ddp; this keeps the layers
inside the runtime honest, so a newcomer can change a layer knowing what can depend on it.

  python3 tools/check_layers.py        # prints each violation as file:line, exits 1 if there is one
"""
import os
import re
import subprocess
import sys

LAYERS = [  # (folder or file, rank): equal ranks may not include each other unless they are the same folder
    ("runtime/core", 0),
    ("runtime/io", 1),
    ("runtime/kernels", 1),
    ("runtime/tensor", 2),
    ("runtime/autograd", 3),
    ("runtime/ops", 4),
    ("runtime/models", 5),
    ("runtime/optim", 6),
    ("runtime/distributed", 7),
    ("runtime/data", 8),
    ("runtime/training", 9),
    ("ddp.h", 10),
    ("ddp_mpi.h", 11),
    ("capi", 12),
]
LAUNCHER_MAY_INCLUDE = ("runtime/core", "launcher")
UNCHECKED = ("examples/", "bench/", "tests/", "third_party/", "bazel/", "tools/")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of(path):
    for prefix, rank in LAYERS:
        if path == prefix or path.startswith(prefix + "/"):
            return prefix, rank
    return None, None


def main():
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                          check=True).stdout.strip()
    files = subprocess.run(["git", "ls-files", "*.h", "*.cc", "*.cu", "*.cuh", "*.inc"], cwd=root,
                           capture_output=True, text=True, check=True).stdout.split()
    violations = []
    checked = 0
    for path in files:
        if path.startswith(UNCHECKED):
            continue
        own, rank = layer_of(path)
        is_launcher = path.startswith("launcher/")
        if own is None and not is_launcher:
            violations.append(f"{path}: in no layer (add its folder to tools/check_layers.py)")
            continue
        checked += 1
        with open(os.path.join(root, path), encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                target = m.group(1)
                if is_launcher:
                    if not target.startswith(LAUNCHER_MAY_INCLUDE):
                        violations.append(f"{path}:{number}: the launcher includes {target} (only runtime/core)")
                    continue
                other, other_rank = layer_of(target)
                if other is None or other == own:
                    continue
                if other_rank >= rank:
                    violations.append(f"{path}:{number}: {own} (layer {rank}) includes {target} of {other} "
                                      f"(layer {other_rank}), which is not below it")
    for v in violations:
        print(v)
    print(f"check_layers: {checked} files, {len(violations)} violation(s)")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
