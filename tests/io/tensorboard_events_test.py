#!/usr/bin/python3
"""Decodes the events file TensorBoardWriter writes, independently of our C++ and of our .proto: the Event schema
is built here at run time from TensorFlow's published field numbers (event.proto, summary.proto), the record
framing and its masked CRC32C are re-implemented from the format's description, and the tags, steps and values
are checked against what tensorboard_write_scalars wrote. Uses Debian's python3-protobuf (tools/setup.sh).

  tensorboard_events_test.py PATH/TO/tensorboard_write_scalars
"""
import glob
import os
import struct
import subprocess
import sys
import tempfile

try:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
except ImportError:
    sys.exit("tensorboard_events_test: google.protobuf is missing: run tools/setup.sh (it installs python3-protobuf)")


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def event_class():
    """tensorflow.Event with only the fields scalars use, numbered as in the published schema."""
    F = descriptor_pb2.FieldDescriptorProto
    f = descriptor_pb2.FileDescriptorProto(name="tb_event_check.proto", package="tensorflow", syntax="proto3")
    value = f.message_type.add(name="Value")
    value.field.add(name="tag", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    value.field.add(name="simple_value", number=2, type=F.TYPE_FLOAT, label=F.LABEL_OPTIONAL)
    summary = f.message_type.add(name="Summary")
    summary.field.add(name="value", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                      type_name=".tensorflow.Value")
    event = f.message_type.add(name="Event")
    event.field.add(name="wall_time", number=1, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    event.field.add(name="step", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    event.field.add(name="file_version", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    event.field.add(name="summary", number=5, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                    type_name=".tensorflow.Summary")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.MessageFactory(pool).GetPrototype(pool.FindMessageTypeByName("tensorflow.Event"))


def read_records(path):
    with open(path, "rb") as fh:
        data = fh.read()
    at, records = 0, []
    while at < len(data):
        assert at + 12 <= len(data), f"{path}: truncated record header at byte {at}"
        header = data[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[at + 8:at + 12])
        assert length_crc == masked(crc32c(header)), f"{path}: length CRC mismatch at byte {at}"
        body = data[at + 12:at + 12 + length]
        assert len(body) == length, f"{path}: truncated record at byte {at}"
        (body_crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
        assert body_crc == masked(crc32c(body)), f"{path}: data CRC mismatch at byte {at}"
        records.append(body)
        at += 16 + length
    return records


def tensorboard_reads(path):
    """TensorBoard's own loader, where TensorBoard is installed (it is not a Debian package)."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        print("tensorboard_events_test: TensorBoard is not installed: its own reader not run")
        return
    accumulator = EventAccumulator(path)
    accumulator.Reload()
    tags = sorted(accumulator.Tags()["scalars"])
    assert tags == ["test/accuracy", "train/loss"], tags
    assert [e.step for e in accumulator.Scalars("train/loss")] == list(range(1, 21))
    print("tensorboard_events_test: TensorBoard's EventAccumulator reads the file")


def main():
    assert crc32c(b"123456789") == 0xE3069283, "the test's own CRC32C is wrong"
    writer = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as tmp:
        out = subprocess.run([writer, os.path.join(tmp, "tb")], check=True, capture_output=True, text=True)
        files = glob.glob(os.path.join(tmp, "tb", "events.out.tfevents.*"))
        assert len(files) == 1, f"expected one events file, found {files}"
        assert out.stdout.strip() == files[0], (out.stdout, files)
        Event = event_class()
        events = []
        for body in read_records(files[0]):
            e = Event()
            e.ParseFromString(body)
            events.append(e)
        tensorboard_reads(files[0])

    assert events[0].file_version == "brain.Event:2", events[0]
    assert events[0].wall_time > 1.6e9, events[0].wall_time
    scalars = {}
    for e in events[1:]:
        assert e.wall_time >= events[0].wall_time
        for v in e.summary.value:
            scalars.setdefault(v.tag, []).append((e.step, v.simple_value))
    assert sorted(scalars) == ["test/accuracy", "train/loss"], sorted(scalars)
    assert [s for s, _ in scalars["train/loss"]] == list(range(1, 21))
    assert [s for s, _ in scalars["test/accuracy"]] == [5, 10, 15, 20]
    for step, value in scalars["train/loss"]:
        assert abs(value - 1.0 / step) <= 1e-7 * abs(1.0 / step) + 1e-12, (step, value)
    for step, value in scalars["test/accuracy"]:
        assert value == struct.unpack("<f", struct.pack("<f", step / 100.0))[0], (step, value)
    print(f"tensorboard_events_test: {len(events)} events, {sum(map(len, scalars.values()))} scalars, "
          "every CRC verified")


if __name__ == "__main__":
    main()
