"""safetensors files from and for PyTorch in the tests, written out because Debian 12 has no python3-safetensors:
load_file and save_file behave as safetensors.torch's (8-byte little-endian header length, a JSON header of
dtype, shape and data_offsets per tensor, padded with spaces to 8 bytes, then the raw little-endian data).
Imported by the tests that hand weights or checkpoints to PyTorch (the runfiles' tests/ folder on sys.path).
"""
import json
import struct

import numpy as np
import torch

_DTYPES = {"F32": (np.float32, torch.float32), "F64": (np.float64, torch.float64), "I32": (np.int32, torch.int32),
           "I64": (np.int64, torch.int64)}


def load_file(path):
    """{name: tensor} of the file at `path`, as safetensors.torch.load_file."""
    return load_file_and_metadata(path)[0]


def load_file_and_metadata(path):
    """({name: tensor}, {key: value} of __metadata__) of the file at `path`."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        array = np.frombuffer(data[base + begin:base + end], dtype=_DTYPES[entry["dtype"]][0]).reshape(entry["shape"])
        tensors[name] = torch.from_numpy(array.copy())
    return tensors, header.get("__metadata__", {})


def save_file(tensors, path):
    """Writes {name: tensor} to `path` as safetensors.torch.save_file (tensors in name order, no metadata)."""
    names = {torch_dtype: name for name, (_, torch_dtype) in _DTYPES.items()}
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        raw = t.numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
