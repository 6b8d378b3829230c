#!/usr/bin/env python3
"""PyTorch's side of bench/residual.sh: examples/residual_regression's recipe written as a PyTorch expert would,
so that the wall time of a whole run and the final test loss can be compared in the same run on the same GPU.

The recipe: .npy data (tests/examples/make_regression.py) held on the device, the network
Linear(in, width), `blocks` x [x + GELU(Linear(LayerNorm(x)))], Linear(width, out); MSE; AdamW (lr 1e-3, weight
decay 0.01); linear warmup over one epoch then cosine decay to 0; batch 512; a shuffled epoch order, the short
last batch kept; the test loss at the end.

Modes:
  eager   the step as written, fused AdamW;
  graph   the whole step (the batch's gather from the resident set by an index buffer, forward, backward,
          capturable AdamW with its learning rate a device tensor) captured once as a CUDA graph after a few
          eager steps, following the CUDA-graphs notes of PyTorch's documentation; the epoch's shorter last batch
          runs eagerly.

  python3 bench/pytorch_residual.py --data DIR --mode graph
Prints "final step=S test_loss=L" and a JSON line with the loop's seconds.
"""
import argparse
import json
import math
import os
import time

START = time.time()

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.body = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU())

    def forward(self, x):
        return x + self.body(x)


def network(features, width, blocks, out):
    return nn.Sequential(nn.Linear(features, width), *[Block(width) for _ in range(blocks)], nn.Linear(width, out))


def load(path, device):
    x = torch.from_numpy(np.load(os.path.join(path, "features.npy"))).to(device)
    y = torch.from_numpy(np.load(os.path.join(path, "targets.npy"))).to(device)
    return x, y


def lr_at(step, steps_per_epoch, epochs, base):
    warmup, total = steps_per_epoch, steps_per_epoch * epochs  # one epoch of warmup, as the example's
    if step < warmup:
        return base * (step + 1) / warmup
    return 0.0 if step >= total else base * 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / (total - warmup)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--mode", choices=["eager", "graph"], default="eager")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--lr", type=float, default=1e-3)
    args = p.parse_args()
    torch.manual_seed(0)
    device = torch.device("cuda")
    train_x, train_y = load(os.path.join(args.data, "train"), device)
    test_x, test_y = load(os.path.join(args.data, "test"), device)
    model = network(train_x.shape[1], args.width, args.blocks, train_y.shape[1]).to(device)
    graph = args.mode == "graph"
    lr = torch.tensor(args.lr, device=device) if graph else args.lr
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01,
                            **({"capturable": True} if graph else {"fused": True}))
    n, b = train_x.shape[0], args.batch_size
    steps_per_epoch = math.ceil(n / b)
    gen = torch.Generator(device=device).manual_seed(0)
    index = torch.zeros(b, dtype=torch.int64, device=device)  # the graph's batch: rows of the resident set

    def step(rows):
        loss = F.mse_loss(model(train_x[rows]), train_y[rows])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        return loss

    captured = None
    loop_start = time.time()
    steps = 0
    for epoch in range(args.epochs):
        order = torch.randperm(n, device=device, generator=gen)
        for i in range(0, n, b):
            rows = order[i:i + b]
            value = lr_at(steps, steps_per_epoch, args.epochs, args.lr)
            if not graph:
                for group in opt.param_groups:
                    group["lr"] = value
                step(rows)
            else:
                lr.fill_(value)
                if rows.shape[0] != b:
                    step(rows)  # the shorter last batch, eagerly from the same state
                elif captured is None and steps < 3:
                    index.copy_(rows)
                    side = torch.cuda.Stream()
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        step(index)
                    torch.cuda.current_stream().wait_stream(side)
                elif captured is None:
                    index.copy_(rows)
                    captured = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(captured):
                        step(index)
                    captured.replay()
                else:
                    index.copy_(rows)
                    captured.replay()
            steps += 1
    torch.cuda.synchronize()
    loop_s = time.time() - loop_start
    model.eval()
    with torch.no_grad():
        test_loss = F.mse_loss(model(test_x), test_y).item()
    print(f"final step={steps} test_loss={test_loss:.4f}")
    print(json.dumps({"mode": args.mode, "steps": steps, "loop_s": loop_s, "process_s": time.time() - START,
                      "us_per_step": loop_s * 1e6 / steps, "test_loss": test_loss}))


if __name__ == "__main__":
    main()
