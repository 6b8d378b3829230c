#!/usr/bin/python3
"""Loads a train_mlp checkpoint into torch.nn.Sequential with load_state_dict(strict=True) and prints the test
accuracy PyTorch computes with it, so the test can compare it with the runtime's own figure.

  load_checkpoint_in_torch.py CHECKPOINT DATA_DIR HIDDEN LAYERS

The reader is tests/torch_safetensors.py, because Debian has no python3-safetensors.
"""
import gzip
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch_safetensors  # noqa: E402  (tests/torch_safetensors.py)


def read_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    dims = raw[3]
    shape = struct.unpack(">" + "I" * dims, raw[4:4 + 4 * dims])
    return np.frombuffer(raw[4 + 4 * dims:], dtype=np.uint8).reshape(shape)


def main():
    path, data_dir, hidden, layers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    tensors, metadata = torch_safetensors.load_file_and_metadata(path)
    model_state = {k: v for k, v in tensors.items() if not k.startswith("optimizer.")}
    sizes = [784] + [hidden] * layers + [10]
    modules = []
    for i in range(len(sizes) - 1):
        modules.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i + 2 < len(sizes):
            modules.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*modules)
    model.load_state_dict(model_state, strict=True)
    images = read_idx(data_dir + "/t10k-images-idx3-ubyte.gz").reshape(-1, 784).astype(np.float32) / 255.0
    labels = read_idx(data_dir + "/t10k-labels-idx1-ubyte.gz").astype(np.int64)
    x = (torch.from_numpy(images) - 0.2860) / 0.3530
    with torch.no_grad():
        accuracy = (model(x).argmax(dim=1) == torch.from_numpy(labels)).double().mean().item()
    print(f"keys={','.join(sorted(model_state))}")
    print(f"step={metadata.get('ddp.step')}")
    print(f"torch_test_accuracy={accuracy:.4f}")


if __name__ == "__main__":
    main()
