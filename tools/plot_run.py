#!/usr/bin/python3
"""Turns a run's metrics (the JSON-lines file --metrics-file writes) into one picture, PNG and SVG, and overlays
several runs (1, 2 and 4 ranks; fp32 against bf16) so they can be compared at a glance.

Panels: training loss (with the test loss per epoch), test accuracy (test loss when no run has accuracy),
learning rate, samples/s, step time, and communication: the all-reduce time of a step and the part of it that
backward did not hide (exposed). Step records carry step, loss, lr, samples_per_s (and maybe grad_norm, time,
step_ms, allreduce_ms, exposed_comm_ms: a single rank has no communication); epoch records carry epoch,
test_loss, test_accuracy. An epoch record is drawn at the step of the step record before it.
Uses Debian's python3-matplotlib (tools/setup.sh) with the Agg backend: no display needed.

  tools/plot_run.py runs/a/metrics.jsonl runs/b/metrics.jsonl --label 1-rank --label 2-ranks -o runs/compare
  # writes runs/compare.png and runs/compare.svg
"""
import argparse
import json
import os
import sys

try:
    import matplotlib
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text in the SVG: searchable and editable
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("plot_run: matplotlib is missing: run tools/setup.sh (it installs python3-matplotlib)")


class Run:
    """One metrics file's series, each a list of (x, value)."""

    def __init__(self, label):
        self.label = label
        self.series = {}

    def add(self, name, x, value):
        if isinstance(value, (int, float)) and not isinstance(value, bool):  # null (a non-finite value): skipped
            self.series.setdefault(name, []).append((x, value))

    def has(self, name):
        return bool(self.series.get(name))


def read_run(path, label, x_axis):
    run = Run(label)
    last_step, first_time = 0, None
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"plot_run: {path}:{number}: not a JSON line ({e}); pass the file --metrics-file wrote")
            if not isinstance(record, dict):
                sys.exit(f"plot_run: {path}:{number}: a record must be a JSON object")
            if "time" in record and first_time is None:
                first_time = record["time"]
            if x_axis == "time":
                if "time" not in record:
                    sys.exit(f"plot_run: {path}:{number}: no \"time\" field, so --x time cannot place it; "
                             "plot with --x step")
                x = record["time"] - first_time
            else:
                x = record.get("step", last_step)
            if "step" in record:
                last_step = record["step"]
                for key in ("loss", "lr", "samples_per_s", "grad_norm", "step_ms", "allreduce_ms",
                            "exposed_comm_ms"):
                    run.add(key, x, record.get(key))
            else:
                for key in ("test_loss", "test_accuracy"):
                    run.add(key, x, record.get(key))
    if not run.series:
        sys.exit(f"plot_run: {path}: no step or epoch record with numbers in it")
    return run


def draw(ax, runs, colours, name, style, **kwargs):
    for run, colour in zip(runs, colours):
        points = run.series.get(name)
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, style, color=colour, **kwargs)


def note(ax, text):
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="0.4")


def plot(runs, x_axis, title, output, dpi=120):
    colours = [f"C{i % 10}" for i in range(len(runs))]
    fig, axes = plt.subplots(3, 2, figsize=(12, 11), sharex=True)
    (loss_ax, eval_ax), (lr_ax, rate_ax), (time_ax, comm_ax) = axes

    draw(loss_ax, runs, colours, "loss", "-", linewidth=1)
    draw(loss_ax, runs, colours, "test_loss", "o--", markersize=4, linewidth=1)
    loss_ax.set_title("loss (line: training, dots: test)")
    if any(r.has("loss") and min(v for _, v in r.series["loss"]) > 0 for r in runs):
        loss_ax.set_yscale("log")

    if any(r.has("test_accuracy") for r in runs):
        draw(eval_ax, runs, colours, "test_accuracy", "o-", markersize=4)
        eval_ax.set_title("test accuracy")
    else:
        draw(eval_ax, runs, colours, "test_loss", "o-", markersize=4)
        eval_ax.set_title("test loss")

    draw(lr_ax, runs, colours, "lr", "-")
    lr_ax.set_title("learning rate")
    draw(rate_ax, runs, colours, "samples_per_s", "-", linewidth=1)
    rate_ax.set_title("samples/s")

    draw(time_ax, runs, colours, "step_ms", "-", linewidth=1)
    time_ax.set_title("step time (ms, mean over the logging window)")
    if not any(r.has("step_ms") for r in runs):
        note(time_ax, "no step times in these files")

    draw(comm_ax, runs, colours, "allreduce_ms", ":", linewidth=1)
    draw(comm_ax, runs, colours, "exposed_comm_ms", "-", linewidth=1)
    comm_ax.set_title("communication per step (ms; dotted: all-reduce, line: exposed)")
    if not any(r.has("allreduce_ms") or r.has("exposed_comm_ms") for r in runs):
        note(comm_ax, "no communication measured (one rank, or CUDA graph replays)")

    for ax in axes.flat:
        ax.grid(True, alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("step" if x_axis == "step" else "seconds since the first record")
    handles = [plt.Line2D([], [], color=c, label=r.label) for r, c in zip(runs, colours)]
    top = 0.95 if title else 0.99  # a title above the legend, the legend above the panels
    if title:
        fig.suptitle(title, y=0.995)
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, top), ncol=min(len(runs), 4),
               frameon=False)
    fig.tight_layout(rect=(0, 0, 1, top - 0.03))
    written = []
    for ext in ("png", "svg"):
        path = f"{output}.{ext}"
        fig.savefig(path, dpi=dpi)
        written.append(path)
    plt.close(fig)
    return written


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("metrics", nargs="+", help="metrics JSON-lines files (one per run)")
    parser.add_argument("--label", action="append", default=[],
                        help="a run's name in the legend, once per file in order (default: the file name)")
    parser.add_argument("-o", "--output", default="run",
                        help="output path without extension: writes OUTPUT.png and OUTPUT.svg (default: run)")
    parser.add_argument("--x", choices=("step", "time"), default="step",
                        help="horizontal axis: the step, or the seconds since the first record (needs \"time\")")
    parser.add_argument("--title", default="", help="a title over the panels")
    parser.add_argument("--dpi", type=int, default=120,
                        help="the PNG's dots per inch (default 120; 90 keeps a picture for a README near 100 KB)")
    args = parser.parse_args(argv)
    if args.label and len(args.label) != len(args.metrics):
        parser.error(f"{len(args.label)} --label for {len(args.metrics)} files: give one per file, or none")
    labels = args.label or [os.path.basename(p) for p in args.metrics]
    if not args.label and len(set(labels)) < len(labels):  # runs/a/metrics.jsonl, runs/b/metrics.jsonl
        labels = [os.path.relpath(p) for p in args.metrics]
    for path in args.metrics:
        if not os.path.isfile(path):
            sys.exit(f"plot_run: {path}: no such file; pass the file a run's --metrics-file wrote")
    out_dir = os.path.dirname(args.output)
    if out_dir and not os.path.isdir(out_dir):
        sys.exit(f"plot_run: the output directory {out_dir} does not exist; create it or pick another -o")
    runs = [read_run(p, label, args.x) for p, label in zip(args.metrics, labels)]
    for path in plot(runs, args.x, args.title, args.output, args.dpi):
        print(f"plot_run: wrote {path}")


if __name__ == "__main__":
    main()
