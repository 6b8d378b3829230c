#!/usr/bin/env python3
"""Prints the benchmark table of bench/run_cpu.sh and bench/run_gpu.sh from their JSON lines.

Why: both scripts compare bench/step_bench with a reference measured in the same run (PyTorch, or our own
step without DDP); this turns their raw lines into one table with the ratios.

Each input line is {"label": ..., "side": "ours" | "ref", "result": <one JSON line of step_bench or
pytorch_step.py>}. Several lines with the same label and side (rounds) are reduced to their median step time.

  python3 bench/table.py results.jsonl [--markdown]
"""
import json
import statistics
import sys


def fmt_us(us):
    if us is None:
        return "-"
    return f"{us / 1000:.2f} ms" if us >= 10000 else f"{us:.0f} us"


def fmt_mb(b):
    return "-" if b is None else f"{b / 2**20:.0f}"


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    markdown = "--markdown" in sys.argv
    rows = {}
    order = []
    for path in args:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                rec = json.loads(line)
                key = rec["label"]
                if key not in rows:
                    rows[key] = {"ours": [], "ref": []}
                    order.append(key)
                rows[key][rec["side"]].append(rec["result"])

    head = ["configuration", "ours", "reference", "ours/ref time", "ref/ours samples/s", "GEMMs alone",
            "ours/GEMMs", "ours peak MiB", "ref peak MiB", "graph", "mallocs", "bwd ms", "allreduce ms",
            "exposed ms", "hidden"]
    out = []
    for key in order:
        ours, ref = rows[key]["ours"], rows[key]["ref"]
        o = min(ours, key=lambda r: r["step_us"]) if ours else None
        r = min(ref, key=lambda r: r["step_us"]) if ref else None
        o_us = statistics.median(x["step_us"] for x in ours) if ours else None
        r_us = statistics.median(x["step_us"] for x in ref) if ref else None
        ratio = o_us / r_us if o_us and r_us else None
        sps = (r_us / o_us) if o_us and r_us else None  # same batch and ranks on both sides
        gemm_us = statistics.median(x["gemm_us"] for x in ours if x.get("gemm_us")) if any(
            x.get("gemm_us") for x in ours) else None
        ref_name = r.get("impl", "?") if r else "-"
        if r and r.get("impl") == "ddp-cpp":
            ref_name = "ddp-cpp " + ("DDP" if r.get("ddp") else "no DDP")
        out.append([
            key + (f" (x{len(ours)})" if len(ours) > 1 else ""),
            fmt_us(o_us),
            f"{fmt_us(r_us)} {ref_name}" if r else "-",
            fmt(ratio, ".3f"),
            fmt(sps, ".2f"),
            fmt_us(gemm_us),
            fmt(o_us / gemm_us if o_us and gemm_us else None, ".3f"),
            fmt_mb(o.get("peak_bytes")) if o else "-",
            fmt_mb(r.get("peak_bytes")) if r else "-",
            ("yes" if o.get("graph") else ("FAILED" if o.get("graph_error") else "no")) if o else "-",
            fmt(o.get("mallocs_after_warmup"), "d") if o else "-",
            fmt(o.get("backward_ms"), ".2f") if o else "-",
            fmt(o.get("allreduce_ms"), ".2f") if o else "-",
            fmt(o.get("exposed_comm_ms"), ".2f") if o else "-",
            fmt(o.get("hidden_comm_fraction"), ".2f") if o else "-",
        ])
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + " --- |" * len(head))
        for row in out:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(str(x)) for x in col) for col in zip(head, *out)]
        for row in [head] + out:
            print("  ".join(str(x).ljust(w) for x, w in zip(row, widths)))
    for key in order:
        for side in ("ours", "ref"):
            for res in rows[key][side]:
                if res.get("graph_error"):
                    print(f"note: {key}: graph not captured: {res['graph_error']}")


if __name__ == "__main__":
    main()
