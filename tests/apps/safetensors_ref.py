"""A minimal safetensors reader/writer written from the Hugging Face spec (Debian has no
python3-safetensors): 8-byte little-endian header length, JSON header, data. Tensors are numpy
arrays; BF16 tensors are uint16 bit patterns."""
import json
import struct

import numpy as np

DTYPES = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32, "F64": np.float64, "I64": np.int64,
          "I32": np.int32, "U8": np.uint8, "I8": np.int8, "U16": np.uint16, "I16": np.int16}


def write(path, tensors, metadata=None):
    """tensors: list of (name, dtype, numpy array) in file order."""
    header, offset, blobs = {}, 0, []
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, array in tensors:
        raw = np.ascontiguousarray(array, dtype=DTYPES[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read(path):
    """Returns ({name: (dtype, numpy array)}, metadata)."""
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    metadata = header.pop("__metadata__", {})
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        array = np.frombuffer(data[8 + n + begin:8 + n + end], dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
        out[name] = (info["dtype"], array)
    return out, metadata
