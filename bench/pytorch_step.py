#!/usr/bin/env python3
"""PyTorch's side of the step benchmark: the same MLP training step (forward, cross-entropy, backward, SGD with
momentum) as bench/step_bench, timed the same way, printing one JSON line per configuration.

  python3 bench/pytorch_step.py --sizes 784,1024,1024,10 --batch 256 --device cuda --precision fp32 [--graph]
  python3 bench/pytorch_step.py --sizes 784,1024,1024,10 --batch 128 --device cpu --ranks 2   # DDP over gloo
  python3 bench/pytorch_step.py --sizes 4096,4096,4096,4096,4096 --batch 8192 --precision bf16 --ranks 8  # NCCL

GPU timings use CUDA events around `--iters` steps after `--warmup` steps, repeated `--repeats` times; the
median is reported. CPU timings use the wall clock the same way. Peak memory is torch.cuda.max_memory_allocated.
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.nn as nn


def build_mlp(sizes):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i + 2 < len(sizes):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def make_step(model, opt, x, y, precision, device):
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=False)
        if precision == "bf16":
            with torch.autocast(device_type=device, dtype=torch.bfloat16):
                loss = loss_fn(model(x), y)
        else:
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def time_steps(step, device, warmup, iters, repeats, graph):
    if device == "cuda":
        if graph:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    step()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                step()
            run = g.replay
        else:
            run = step
        for _ in range(warmup):
            run()
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000.0 / iters)
        return times
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        times.append((time.perf_counter() - t0) * 1e6 / iters)
    return times


def run_single(args):
    device = args.device
    sizes = [int(s) for s in args.sizes.split(",")]
    torch.manual_seed(0)
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
        torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
    else:
        torch.set_num_threads(args.threads or os.cpu_count())
    model = build_mlp(sizes).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(args.batch, sizes[0], device=device)
    y = torch.randint(0, sizes[-1], (args.batch,), device=device)
    step = make_step(model, opt, x, y, args.precision, device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = time_steps(step, device, args.warmup, args.iters, args.repeats, args.graph)
    result = {
        "impl": "pytorch" + ("-graph" if args.graph else "-eager"),
        "torch": torch.__version__,
        "sizes": args.sizes,
        "batch": args.batch,
        "device": device,
        "precision": args.precision,
        "ranks": 1,
        "step_us": statistics.median(times),
        "samples_per_s": args.batch / statistics.median(times) * 1e6,
        "peak_bytes": torch.cuda.max_memory_allocated() if device == "cuda" else None,
    }
    print(json.dumps(result), flush=True)


def ddp_worker(rank, args, port):
    """One rank of PyTorch DDP: gloo over CPU processes, or NCCL with one GPU per rank (cuda:rank)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    device = args.device
    if device == "cuda":
        torch.cuda.set_device(rank)
        torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
        dist.init_process_group("nccl", rank=rank, world_size=args.ranks, device_id=torch.device("cuda", rank))
    else:
        dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
        torch.set_num_threads(args.threads or max(1, os.cpu_count() // args.ranks))
    sizes = [int(s) for s in args.sizes.split(",")]
    torch.manual_seed(0)
    model = build_mlp(sizes).to(device)
    model = DDP(model, device_ids=[rank]) if device == "cuda" else DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(args.batch, sizes[0], device=device)
    y = torch.randint(0, sizes[-1], (args.batch,), device=device)
    step = make_step(model, opt, x, y, args.precision if device == "cuda" else "fp32", device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = time_steps(step, device, args.warmup, args.iters, args.repeats, False)
    t = torch.tensor([statistics.median(times)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        step_us = t.item()
        print(json.dumps({
            "impl": "pytorch-ddp-" + ("nccl" if device == "cuda" else "gloo"), "torch": torch.__version__,
            "sizes": args.sizes, "batch": args.batch, "device": device,
            "precision": args.precision if device == "cuda" else "fp32", "ranks": args.ranks, "step_us": step_us,
            "samples_per_s": args.batch * args.ranks / step_us * 1e6,
            "peak_bytes": torch.cuda.max_memory_allocated() if device == "cuda" else None,
        }), flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    p.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="fp32")
    p.add_argument("--graph", action="store_true", help="capture the step as a CUDA graph")
    p.add_argument("--ranks", type=int, default=1,
                   help="DDP with this many processes: gloo on the CPU, NCCL with one GPU per rank on cuda")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--port", type=int, default=29533)
    args = p.parse_args()
    if args.ranks > 1:
        import torch.multiprocessing as mp
        mp.spawn(ddp_worker, args=(args, args.port), nprocs=args.ranks, join=True)
    else:
        run_single(args)


if __name__ == "__main__":
    main()
