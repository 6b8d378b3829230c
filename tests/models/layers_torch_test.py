#!/usr/bin/python3
"""The MLP family's ops and modules against PyTorch 1.13 on the CPU: runs layers_reference (the runtime's inputs,
outputs and gradients of an MSE loss), recomputes each in PyTorch from the same inputs, and loads the residual
LayerNorm GELU model's training checkpoint into the same torch.nn.Module (strict) to compare outputs and gradients.

  layers_torch_test.py PATH/TO/layers_reference

The safetensors reader is tests/torch_safetensors.py, because Debian has no python3-safetensors.
"""
import math
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch_safetensors  # noqa: E402  (tests/torch_safetensors.py)

failures = []



def check(what, ours, theirs, atol, rtol=1e-5):
    theirs = theirs.detach().to(torch.float32)
    err = (ours - theirs).abs().max().item() if ours.numel() else 0.0
    ok = ours.shape == theirs.shape and torch.allclose(ours, theirs, atol=atol, rtol=rtol)
    print(f"{'ok  ' if ok else 'FAIL'} {what}: max |runtime - torch| = {err:.3g} (atol {atol:g}, rtol {rtol:g})")
    if not ok:
        failures.append(what)


def frequency_encoding(x, frequencies, include_input=True):
    """The column order the runtime documents: [x, sin(2^0 pi x), cos(2^0 pi x), ..., sin, cos of 2^(L-1) pi x],
    each a block as wide as x, with the float32 constant 2^k pi times x rounded to float32 (as the kernels)."""
    parts = [x] if include_input else []
    for k in range(frequencies):
        a = torch.tensor(math.ldexp(math.pi, k), dtype=torch.float32)
        parts += [torch.sin(a * x), torch.cos(a * x)]
    return torch.cat(parts, dim=1)


class ResidualBlock(torch.nn.Module):
    def __init__(self, body, projection=None):
        super().__init__()
        self.body = body
        self.projection = projection

    def forward(self, x):
        return self.body(x) + (self.projection(x) if self.projection is not None else x)


def residual_model():
    blocks = [ResidualBlock(torch.nn.Sequential(torch.nn.LayerNorm(32), torch.nn.Linear(32, 32), torch.nn.GELU()))
              for _ in range(2)]
    return torch.nn.Sequential(torch.nn.Linear(8, 32), *blocks, torch.nn.Linear(32, 3))


def compare_op(t, op, fn, inputs, atol=1e-6, rtol=1e-5):
    """Recomputes op `op` with fn(*inputs) in PyTorch and compares its output and input gradients."""
    leaves = {}
    for name in inputs:
        value = t[f"{op}.{name}"]
        if value.dtype == torch.float32:
            value = value.clone().requires_grad_(f"{op}.grad.{name}" in t)
        leaves[name] = value
    y = fn(**leaves)
    check(f"{op} forward", t[f"{op}.y"], y, atol, rtol)
    F.mse_loss(y, t[f"{op}.target"]).backward()
    for name, leaf in leaves.items():
        if f"{op}.grad.{name}" in t:
            check(f"{op} gradient of {name}", t[f"{op}.grad.{name}"], leaf.grad, atol, rtol)


def main():
    reference = os.path.abspath(sys.argv[1])
    torch.set_default_dtype(torch.float32)
    with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as tmp:
        out = subprocess.run([reference, tmp], check=True, capture_output=True, text=True).stdout
        t = torch_safetensors.load_file(os.path.join(tmp, "ops.safetensors"))
        compare_op(t, "silu", lambda x: F.silu(x), ["x"])
        compare_op(t, "layer_norm", lambda x, weight, bias: F.layer_norm(x, (12,), weight, bias, 1e-5),
                   ["x", "weight", "bias"], atol=1e-5)
        compare_op(t, "frequency_encoding", lambda x: frequency_encoding(x, 5), ["x"], atol=1e-5)
        compare_op(t, "frequency_encoding_no_input", lambda x: frequency_encoding(x, 3, False), ["x"], atol=1e-5)
        # Dropout's mask is the runtime's own (a counter-based generator, not torch's): the kept elements are where
        # y != 0 (x is never 0 there); with that mask torch's scaling and gradient must agree.
        keep = (t["dropout.y"] != 0).to(torch.float32)
        kept = keep.mean().item()
        print(f"dropout kept {kept:.3f} of the elements at p = 0.3")
        if not 0.5 < kept < 0.9:
            failures.append("dropout kept fraction")
        compare_op(t, "dropout", lambda x: x * keep / (1 - 0.3), ["x"])
        compare_op(t, "embedding", lambda weight, indices: F.embedding(indices.long(), weight), ["weight", "indices"])

        embeddings = torch.nn.ModuleList([torch.nn.Embedding(4, 3), torch.nn.Embedding(3, 3)])
        embeddings.load_state_dict({k[len("embeddings."):]: t[f"categorical.{k}"]
                                    for k in ["embeddings.0.weight", "embeddings.1.weight"]}, strict=True)

        def categorical(x, **_):
            ids = [embeddings[j](x[:, j].long()) for j in range(2)]
            return torch.cat(ids + [x[:, 2:]], dim=1)

        y = categorical(t["categorical.x"])
        check("categorical features forward", t["categorical.y"], y, 1e-6)
        F.mse_loss(y, t["categorical.target"]).backward()
        for j in range(2):
            check(f"categorical features gradient of embeddings.{j}.weight",
                  t[f"categorical.grad.embeddings.{j}.weight"], embeddings[j].weight.grad, 1e-6)

        # The residual model's checkpoint in torch.nn, strict: the same keys, then the same outputs and gradients.
        checkpoint = out.split("checkpoint=")[1].strip()
        state = {k: v for k, v in torch_safetensors.load_file(checkpoint).items()
                 if not k.startswith("optimizer.") and not k.startswith("buffer.")}
        model = residual_model()
        model.load_state_dict(state, strict=True)
        print("checkpoint keys: " + ",".join(state))
        io = torch_safetensors.load_file(os.path.join(tmp, "model_io.safetensors"))
        y = model(io["x"])
        check("residual model output from the checkpoint", io["y"], y, 1e-5)
        F.mse_loss(y, io["target"]).backward()
        for name, p in model.named_parameters():
            check(f"residual model gradient of {name}", io[f"grad.{name}"], p.grad, 1e-5, 1e-4)
    if failures:
        sys.exit("layers_torch_test: differs from PyTorch: " + ", ".join(failures))
    print("layers_torch_test: every op and the residual model agree with PyTorch")


if __name__ == "__main__":
    main()
