#!/usr/bin/python3
"""tools/plot_run.py on two small synthetic metrics files: one run with test accuracy and wall time, one a
regression with test loss only and a null (non-finite) loss; the PNG and SVG must exist and be valid (PNG
signature and IHDR, an <svg> root that parses as XML), the legend must carry both labels, and bad input must end
with a message naming the file.

  plot_run_test.py PATH/TO/tools/plot_run.py
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET


def write_metrics(path, accuracy, with_time, epochs=3, steps_per_epoch=20, comm=False):
    with open(path, "w") as f:
        step = 0
        for epoch in range(epochs):
            for _ in range(steps_per_epoch):
                step += 1
                record = {"step": step, "epoch": epoch, "loss": 2.3 / (1 + 0.05 * step),
                          "lr": 0.1 * (1 - step / (epochs * steps_per_epoch)), "samples_per_s": 1e5 + 10 * step,
                          "grad_norm": 1.0 / step}
                if with_time:
                    record["time"] = 1.7e9 + 0.01 * step
                if comm:  # as train_mlp writes them on several ranks
                    record.update(step_ms=1.5 + 0.01 * step, allreduce_ms=0.6, exposed_comm_ms=0.1, comm_hidden=0.83)
                if not accuracy and step == 7:
                    record["loss"] = None  # how MetricsWriter writes a NaN
                f.write(json.dumps(record) + "\n")
            record = {"epoch": epoch, "test_loss": 1.0 / (epoch + 1)}
            if accuracy:
                record["test_accuracy"] = 0.8 + 0.03 * epoch
            if with_time:
                record["time"] = 1.7e9 + 0.01 * step + 0.005
            f.write(json.dumps(record) + "\n")


def check_outputs(prefix, labels):
    with open(prefix + ".png", "rb") as f:
        png = f.read()
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    assert png[12:16] == b"IHDR", "a PNG's first chunk is IHDR"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width >= 600 and height >= 400, (width, height)
    root = ET.parse(prefix + ".svg").getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg", root.tag
    text = "".join(root.itertext())
    for label in labels:
        assert label in text, f"legend label {label!r} missing from the SVG"
    return text


def main():
    plot_run = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as tmp:
        a, b = os.path.join(tmp, "fp32.jsonl"), os.path.join(tmp, "regression.jsonl")
        write_metrics(a, accuracy=True, with_time=True, comm=True)
        write_metrics(b, accuracy=False, with_time=False)

        # Two runs overlaid, legend from --label.
        out = os.path.join(tmp, "compare")
        subprocess.run([sys.executable, plot_run, a, b, "--label", "1 rank", "--label", "bf16 run",
                        "-o", out, "--title", "overlay"], check=True)
        text = check_outputs(out, ["1 rank", "bf16 run"])
        for title in ("test accuracy", "learning rate", "samples/s", "step time", "communication per step"):
            assert title in text, f"panel {title!r} missing"
        assert "no communication measured" not in text and "no step times" not in text, text

        # The step time and communication series are read, and a run without them says so in its panels.
        spec = importlib.util.spec_from_file_location("plot_run", plot_run)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        run = module.read_run(a, "a", "step")
        assert run.series["step_ms"][0] == (1, 1.51), run.series["step_ms"][0]
        assert run.series["exposed_comm_ms"][-1] == (60, 0.1) and len(run.series["allreduce_ms"]) == 60

        # One run without accuracy: the panel shows test loss; the legend is the file name.
        out = os.path.join(tmp, "single")
        subprocess.run([sys.executable, plot_run, b, "-o", out], check=True)
        text = check_outputs(out, ["regression.jsonl"])
        assert "test loss" in text and "test accuracy" not in text
        assert "no communication measured" in text and "no step times" in text, text

        # Wall time on the horizontal axis.
        out = os.path.join(tmp, "by_time")
        subprocess.run([sys.executable, plot_run, a, "--x", "time", "-o", out], check=True)
        check_outputs(out, ["fp32.jsonl"])

        # Errors name the file and what to do.
        bad = os.path.join(tmp, "bad.jsonl")
        with open(bad, "w") as f:
            f.write('{"step": 1, "loss": 1}\nnot json\n')
        for args, expected in (([bad], "bad.jsonl:2"), ([b, "--x", "time"], "--x step"),
                               ([a, b, "--label", "one"], "one per file"),
                               ([os.path.join(tmp, "missing.jsonl")], "missing.jsonl")):
            r = subprocess.run([sys.executable, plot_run, *args, "-o", os.path.join(tmp, "x")],
                               capture_output=True, text=True)
            assert r.returncode != 0 and expected in r.stderr, (args, r.returncode, r.stderr)
    print("plot_run_test: PNG and SVG valid for an overlay, a single run and a time axis; bad input refused")


if __name__ == "__main__":
    main()
