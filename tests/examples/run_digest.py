#!/usr/bin/env python3
"""What a training run produced, as text that must not change when the code under it is refactored.

Usage: run_digest.py METRICS_FILE OUTPUT_FILE CHECKPOINT...

Prints, one per line: every metrics record with its wall-clock fields dropped (samples/s, step time, the time of
day), the output lines that carry results (epoch evaluations, the final line, stops and resumes), and for each
checkpoint its metadata (without the checksums, which follow the format) and the SHA-256 of every tensor's bytes
with its dtype and shape. Two runs whose digests are equal trained to the same bits.
"""
import hashlib
import json
import re
import struct
import sys

# Keys of a metrics line that measure time, not training.
WALL_CLOCK_KEYS = {"samples_per_s", "comm_hidden", "time", "elapsed_s", "step_ms", "eta_s", "wall_time",
                   "allreduce_ms", "exposed_comm_ms"}
# Output lines that carry results; the rest (timings, start-up) may change freely.
RESULT_LINE = re.compile(r"(test_loss|test_accuracy|final|stopped at step|resumed from|skipping step)")


def metrics_lines(path):
    for line in open(path):
        record = {k: v for k, v in json.loads(line).items() if k not in WALL_CLOCK_KEYS}
        yield "metrics " + json.dumps(record, sort_keys=True)


def output_lines(path):
    for line in open(path, errors="replace"):
        line = re.sub(r"^\[rank \d+\] ", "", line.rstrip("\n"))
        line = re.sub(r"\(\d+(\.\d+)? s after the request\)", "", line)
        line = re.sub(r"\bepoch[= ](\d+)", r"epoch \1", line)  # the facts, in either output style
        if RESULT_LINE.search(line):
            # Paths differ between the runs compared: keep only their last part.
            yield "output " + re.sub(r"\S*/(ckpt-\d+\.safetensors)", r"\1", line)


def checkpoint_lines(path):
    with open(path, "rb") as f:
        (header_size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_size))
        data = f.read()
    name = path.rsplit("/", 1)[-1]
    metadata = header.pop("__metadata__", {})
    for key in sorted(metadata):
        if not key.startswith("ddp.crc32") and key != "ddp.metadata_crc32":
            yield f"checkpoint {name} metadata {key}={metadata[key]}"
    for tensor in sorted(header):
        entry = header[tensor]
        begin, end = entry["data_offsets"]
        digest = hashlib.sha256(data[begin:end]).hexdigest()
        yield f"checkpoint {name} tensor {tensor} {entry['dtype']} {entry['shape']} {digest}"


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    for line in metrics_lines(argv[1]):
        print(line)
    for line in output_lines(argv[2]):
        print(line)
    for path in argv[3:]:
        for line in checkpoint_lines(path):
            print(line)


if __name__ == "__main__":
    main(sys.argv)
