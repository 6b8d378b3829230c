#!/usr/bin/env python3
"""PyTorch's side of bench/time_to_accuracy.sh: train_mlp's default recipe, written the way a PyTorch user
would, so that the wall time from process start to the final accuracy can be compared in the same run.

The recipe (examples/train_mlp.cc's defaults): Fashion-MNIST normalised with mean 0.2860 / std 0.3530, an MLP
784-512-512-10 with ReLU, batch 128 per rank, AdamW (lr 2e-3, weight decay 0.05, betas 0.9/0.999, eps 1e-8),
linear warmup over 0.5 epoch then cosine decay to 0 at the last step, 30 epochs, a shuffled epoch order from a
seeded generator, the short last batch kept (469 steps an epoch), the test accuracy after every epoch.

Modes:
  dataloader  a torch.utils.data.DataLoader over CPU tensors (pinned on the GPU), the way most code is written;
  resident    the data set held on the device, batches by randperm indexing (no loader);
  compiled    resident, with the step under torch.compile(mode="reduce-overhead") (CUDA graphs), compile time
              included.
With --ranks N on the CPU it runs DistributedDataParallel over gloo in N processes (dataloader mode only). Under
torchrun it runs DistributedDataParallel over NCCL, one process per GPU (any mode: resident and compiled give each
rank every world-th row of the epoch's shared permutation, the DistributedSampler's split).

  python3 bench/pytorch_train.py --data DIR --device cuda --mode resident
  python3 bench/pytorch_train.py --data DIR --device cpu --ranks 2
  torchrun --standalone --nproc-per-node 2 bench/pytorch_train.py --data DIR --device cuda --mode resident
Prints one line per epoch and "final step=S test_loss=L test_accuracy=A" (as train_mlp), then a JSON line.
"""
import argparse
import gzip
import json
import math
import os
import struct
import sys
import time

START = time.time()

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_step import build_mlp  # noqa: E402

MEAN, STD = 0.2860, 0.3530


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(data_dir, split):
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz")).reshape(-1, 784)
    labels = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
    x = (torch.from_numpy(images.astype(np.float32)) / 255.0 - MEAN) / STD
    return x, torch.from_numpy(labels.astype(np.int64))


def build_model(hidden, layers):
    return build_mlp([784] + [hidden] * layers + [10])  # bench/pytorch_step.py's, the step benchmark's model


def lr_lambda(steps_per_epoch, epochs, warmup_epochs):
    warmup = int(warmup_epochs * steps_per_epoch)
    total = steps_per_epoch * epochs

    def f(step):  # step: 0-based index of the step about to be taken, as train_mlp's CosineWithWarmup
        if step < warmup:
            return (step + 1) / warmup
        if step >= total or total == warmup:
            return 0.0
        return 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / (total - warmup)))

    return f


@torch.no_grad()
def evaluate(model, x, y, chunk=10000):
    model.eval()
    loss, correct = 0.0, 0
    for i in range(0, x.shape[0], chunk):
        logits = model(x[i:i + chunk])
        loss += F.cross_entropy(logits, y[i:i + chunk], reduction="sum").item()
        correct += (logits.argmax(1) == y[i:i + chunk]).sum().item()
    model.train()
    return loss / x.shape[0], correct / x.shape[0]


def train(args, rank=0, world=1):
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    if device.type == "cuda" and world > 1:
        device = torch.device("cuda", torch.cuda.current_device())  # torchrun_worker's choice
    if args.precision == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
    train_x, train_y = load(args.data, "train")
    test_x, test_y = load(args.data, "test")
    model = build_model(args.hidden, args.layers).to(device)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay,
                            **({"fused": True} if device.type == "cuda" and args.mode != "compiled" else {}))
    n = train_x.shape[0]
    per_rank = math.ceil(n / world)
    steps_per_epoch = math.ceil(per_rank / args.batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(steps_per_epoch, args.epochs, args.warmup_epochs))
    test_x, test_y = test_x.to(device), test_y.to(device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")

    def step(x, y):
        with autocast:
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    if args.mode == "dataloader":
        from torch.utils.data import DataLoader, TensorDataset
        from torch.utils.data.distributed import DistributedSampler
        ds = TensorDataset(train_x, train_y)
        sampler = DistributedSampler(ds, num_replicas=world, rank=rank, seed=args.seed) if world > 1 else None
        loader = DataLoader(ds, batch_size=args.batch_size, shuffle=sampler is None, sampler=sampler,
                            pin_memory=device.type == "cuda", num_workers=0,
                            generator=torch.Generator().manual_seed(args.seed) if sampler is None else None)
    else:
        train_x, train_y = train_x.to(device), train_y.to(device)
        gen = torch.Generator(device=device).manual_seed(args.seed)
    if args.mode == "compiled":
        step = torch.compile(step, mode="reduce-overhead")

    steps = 0
    acc = loss = float("nan")
    for epoch in range(args.epochs):
        if args.mode == "dataloader":
            if sampler is not None:
                sampler.set_epoch(epoch)
            batches = ((x.to(device, non_blocking=True), y.to(device, non_blocking=True)) for x, y in loader)
        else:
            order = torch.randperm(n, device=device, generator=gen)[rank::world]
            batches = ((train_x[order[i:i + args.batch_size]], train_y[order[i:i + args.batch_size]])
                       for i in range(0, order.shape[0], args.batch_size))
        for x, y in batches:
            if args.mode == "compiled" and x.shape[0] != args.batch_size:
                torch.compiler.cudagraph_mark_step_begin()
            step(x, y)
            sched.step()
            steps += 1
        loss, acc = evaluate(model, test_x, test_y)
        if world > 1:
            t = torch.tensor([loss, acc], dtype=torch.float64, device=device)
            torch.distributed.all_reduce(t)
            loss, acc = (t / world).tolist()
        if rank == 0:
            print(f"epoch {epoch} test_loss={loss:.4f} test_accuracy={acc:.4f}", flush=True)
    if rank == 0:
        print(f"final step={steps} test_loss={loss:.4f} test_accuracy={acc:.4f}", flush=True)
        print(json.dumps({"impl": "pytorch", "mode": args.mode, "device": args.device, "precision": args.precision,
                          "ranks": world, "steps": steps, "test_accuracy": acc,
                          "seconds_in_process": time.time() - START, "torch": torch.__version__}), flush=True)


def ddp_worker(rank, args):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.set_num_threads(max(1, os.cpu_count() // args.ranks))
    train(args, rank, args.ranks)
    torch.distributed.destroy_process_group()


def torchrun_worker(args):
    # torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, the rendezvous): one process per GPU over NCCL.
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.distributed.init_process_group("nccl")
    train(args, rank, world)
    torch.distributed.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--device", default="cuda")
    p.add_argument("--mode", choices=["dataloader", "resident", "compiled"], default="dataloader")
    p.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="fp32")
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--warmup-epochs", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if "LOCAL_RANK" in os.environ and args.device == "cuda":
        torchrun_worker(args)
    elif args.ranks > 1:
        torch.multiprocessing.spawn(ddp_worker, args=(args,), nprocs=args.ranks)
    else:
        train(args)


if __name__ == "__main__":
    main()
