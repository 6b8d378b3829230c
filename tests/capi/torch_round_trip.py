#!/usr/bin/python3
"""The PyTorch side of torch_round_trip_test.sh (PyTorch 1.13, CPU): builds the torch.nn model a JSON
description describes (the layers of runtime/models/model_description.h, with the same state_dict names),
trains it offline and saves its weights, and checks what the C and Fortran programs did with them.

  torch_round_trip.py offline DESCRIPTION DIR   trains a few steps; writes DIR/offline.safetensors, DIR/inputs.bin
                                                (fixed inputs, float32 rows) and DIR/torch_offline.bin (the
                                                trained model's outputs on them)
  torch_round_trip.py check DESCRIPTION DIR WEIGHTS OUTPUTS
                                                loads WEIGHTS (strict) and compares its outputs on DIR/inputs.bin
                                                with OUTPUTS (a program's ddp_predict) to 1e-5
  torch_round_trip.py compare A B               two files of float32 outputs agree to 1e-5
"""
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch_safetensors  # noqa: E402  (tests/torch_safetensors.py)

TOLERANCE = 1e-5
ROWS = 64


class Residual(torch.nn.Module):
    def __init__(self, body, projection):
        super().__init__()
        self.body = body
        self.projection = projection

    def forward(self, x):
        return self.body(x) + (self.projection(x) if self.projection is not None else x)


class FrequencyEncoding(torch.nn.Module):
    """The runtime's column order: [x, sin(2^0 pi x), cos(2^0 pi x), ...], the constant 2^k pi in float32."""

    def __init__(self, frequencies, include_input):
        super().__init__()
        self.frequencies = frequencies
        self.include_input = include_input

    def forward(self, x):
        parts = [x] if self.include_input else []
        for k in range(self.frequencies):
            a = torch.tensor(math.ldexp(math.pi, k), dtype=torch.float32)
            parts += [torch.sin(a * x), torch.cos(a * x)]
        return torch.cat(parts, dim=1)


ACTIVATIONS = {"relu": torch.nn.ReLU, "gelu": torch.nn.GELU, "tanh": torch.nn.Tanh, "sigmoid": torch.nn.Sigmoid,
               "silu": torch.nn.SiLU}


def build(layers, width):
    """nn.Sequential of `layers` applied to `width` columns, and the width it gives."""
    modules = []
    for spec in layers:
        kind = spec["type"]
        if kind == "linear":
            modules.append(torch.nn.Linear(width, spec["out"], bias=spec.get("bias", True)))
            width = spec["out"]
        elif kind in ACTIVATIONS:
            modules.append(ACTIVATIONS[kind]())
        elif kind == "layer_norm":
            modules.append(torch.nn.LayerNorm(width, eps=spec.get("eps", 1e-5)))
        elif kind == "residual":
            body, out = build(spec["body"], width)
            projection = build(spec["projection"], width)[0] if "projection" in spec else None
            modules.append(Residual(body, projection))
            width = out
        elif kind == "frequency_encoding":
            include = spec.get("include_input", True)
            modules.append(FrequencyEncoding(spec["frequencies"], include))
            width *= (1 if include else 0) + 2 * spec["frequencies"]
        elif kind == "dropout":
            modules.append(torch.nn.Dropout(spec.get("p", 0.5)))
        else:
            raise ValueError(f"unknown layer type {kind}")
    return torch.nn.Sequential(*modules), width


def model_of(path):
    with open(path) as f:
        description = json.load(f)
    model, outputs = build(description["layers"], description["inputs"])
    return model, description["inputs"], outputs


def read_floats(path):
    return torch.from_numpy(np.fromfile(path, dtype=np.float32))


def offline(description_path, out):
    torch.manual_seed(0)
    model, inputs, outputs = model_of(description_path)
    x = torch.rand(256, inputs) * 2 - 1
    y = torch.sin(x.sum(dim=1, keepdim=True)).expand(-1, outputs)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(20):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    torch_safetensors.save_file(model.state_dict(), os.path.join(out, "offline.safetensors"))
    fixed = torch.linspace(-1, 1, ROWS * inputs).reshape(inputs, ROWS).t().contiguous()
    fixed.numpy().tofile(os.path.join(out, "inputs.bin"))
    model.eval()
    with torch.no_grad():
        model(fixed).numpy().tofile(os.path.join(out, "torch_offline.bin"))
    print(f"offline: trained {sum(p.numel() for p in model.parameters())} parameters 20 steps")


def compare(what, ours, theirs):
    if ours.shape != theirs.shape:
        print(f"FAIL {what}: {ours.numel()} values against {theirs.numel()}")
        return False
    error = (ours - theirs).abs().max().item()
    ok = error <= TOLERANCE
    print(f"{'ok  ' if ok else 'FAIL'} {what}: max |difference| = {error:.3g} (tolerance {TOLERANCE:g})")
    return ok


def check(description_path, directory, weights, outputs):
    model, inputs, _ = model_of(description_path)
    model.load_state_dict(torch_safetensors.load_file(weights), strict=True)
    offline_weights = torch_safetensors.load_file(os.path.join(directory, "offline.safetensors"))
    moved = max((model.state_dict()[k] - v).abs().max().item() for k, v in offline_weights.items())
    model.eval()
    x = read_floats(os.path.join(directory, "inputs.bin")).reshape(-1, inputs)
    with torch.no_grad():
        ours = model(x).flatten()
    ok = compare(f"PyTorch on {os.path.basename(weights)} against {os.path.basename(outputs)}", ours,
                 read_floats(outputs))
    print(f"the weights moved by up to {moved:.3g} from the offline ones")
    return ok and moved > 1e-4


def main():
    command = sys.argv[1]
    if command == "offline":
        offline(sys.argv[2], sys.argv[3])
        return 0
    if command == "check":
        return 0 if check(*sys.argv[2:6]) else 1
    if command == "compare":
        return 0 if compare(f"{sys.argv[2]} against {sys.argv[3]}", read_floats(sys.argv[2]),
                            read_floats(sys.argv[3])) else 1
    raise SystemExit(__doc__)


if __name__ == "__main__":
    sys.exit(main())
