"""pulse's safetensors reader and writer against a reference written here from the format's
specification (Debian has no python3-safetensors): an 8-byte little-endian header length N,
N bytes of UTF-8 JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
{str: str}} padded with spaces to a multiple of 8, then the data section.

Both directions, with PyTorch tensors (bfloat16 compared through int16 views, so NaN payloads
and -0 must survive bit-exactly):
  - a file written by the Python writer (header keys in another order than the data, metadata
    last) is read by pulse (safetensors_driver dump) with identical names, dtypes, shapes, bytes;
  - pulse rewrites it (safetensors_driver rewrite) in a chosen order; the Python reader gets the
    same tensors back, and the file is byte-identical to the Python writer's for that order.
"""
import argparse
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

# name -> (element bytes, torch dtype, or None where torch 1.13 has none: those pass as bytes)
DTYPES = {
    "BOOL": (1, torch.bool), "U8": (1, torch.uint8), "I8": (1, torch.int8),
    "F8_E5M2": (1, None), "F8_E4M3": (1, None),
    "I16": (2, torch.int16), "U16": (2, None), "F16": (2, torch.float16), "BF16": (2, torch.bfloat16),
    "I32": (4, torch.int32), "U32": (4, None), "F32": (4, torch.float32),
    "F64": (8, torch.float64), "I64": (8, torch.int64), "U64": (8, None),
}
# Integer types of each element size: tensors are compared and moved as bit patterns.
TORCH_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
NUMPY_INT = {1: "<u1", 2: "<i2", 4: "<i4", 8: "<i8"}


def to_bytes(t):
    t = t.contiguous().reshape(-1)
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    return t.view(TORCH_INT[t.element_size()]).numpy().astype(NUMPY_INT[t.element_size()]).tobytes()


def from_bytes(dtype, shape, raw):
    size, torch_dtype = DTYPES[dtype]
    ints = torch.from_numpy(np.frombuffer(raw, dtype=NUMPY_INT[size]).copy())
    if torch_dtype == torch.bool:
        return ints.to(torch.bool).reshape(shape)
    return ints.view(torch_dtype).reshape(shape)


def same_bits(a, b):
    if a.dtype == torch.bool:
        return torch.equal(a, b)
    return a.shape == b.shape and torch.equal(a.view(TORCH_INT[a.element_size()]), b.view(TORCH_INT[b.element_size()]))


# ---- the reference reader and writer, from the specification ----

def ref_write(path, tensors, metadata, key_order=None, metadata_last=False):
    """tensors: list of (name, dtype, shape, bytes) laid out in this order; header keys in
    key_order (names) when given."""
    entries, offset = {}, 0
    for name, dtype, shape, raw in tensors:
        entries[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    header = {}
    if metadata and not metadata_last:
        header["__metadata__"] = dict(metadata)
    for name in key_order or [t[0] for t in tensors]:
        header[name] = entries[name]
    if metadata and metadata_last:
        header["__metadata__"] = dict(metadata)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in tensors))


def reject_duplicates(pairs):
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"duplicate keys {keys}"
    return dict(pairs)


def ref_read(path):
    """Returns (metadata, [(name, dtype, shape, bytes)] in data order, raw header bytes)."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    assert 8 + n <= len(blob), "header length beyond the file"
    raw_header = blob[8:8 + n]
    header = json.loads(raw_header.decode("utf-8"), object_pairs_hook=reject_duplicates)
    metadata = header.pop("__metadata__", None) or {}
    data = blob[8 + n:]
    tensors, covered = [], 0
    for name, e in sorted(header.items(), key=lambda kv: tuple(kv[1]["data_offsets"])):
        begin, end = e["data_offsets"]
        assert begin == covered and end >= begin, f"{name}: offsets {begin, end} after {covered}"
        assert end - begin == int(np.prod(e["shape"], dtype=np.int64)) * DTYPES[e["dtype"]][0], name
        tensors.append((name, e["dtype"], tuple(e["shape"]), data[begin:end]))
        covered = end
    assert covered == len(data), "data section not covered"
    return metadata, tensors, raw_header


# ---- test data ----

def make_tensors():
    g = torch.Generator().manual_seed(3)
    special_bf16 = torch.tensor([0x7FC0, 0x7FC1, 0x7F81, -1, -32768, 0x7F80, -128, 0x0001, 0x3F80], dtype=torch.int16)
    special_f32 = torch.tensor([0x7FC00001, 0x7F800001, -1, -2147483648, 1], dtype=torch.int32)
    rng = np.random.default_rng(5)
    out = [
        ("model.embed.weight", "BF16", torch.randn(64, 33, generator=g).to(torch.bfloat16)),
        ("bf16.specials", "BF16", special_bf16.view(torch.bfloat16)),
        ("ω.weight", "F16", torch.randn(7, 5, generator=g).to(torch.float16)),
        ("f32", "F32", torch.randn(3, 4, 5, generator=g)),
        ("f32.specials", "F32", special_f32.view(torch.float32)),
        ("f64.scalar", "F64", torch.tensor(2.5, dtype=torch.float64)),
        ("i64", "I64", torch.randint(-2**62, 2**62, (6,), generator=g, dtype=torch.int64)),
        ("i32", "I32", torch.randint(-2**31, 2**31 - 1, (2, 3), generator=g, dtype=torch.int32)),
        ("i16", "I16", torch.randint(-2**15, 2**15 - 1, (9,), generator=g, dtype=torch.int16)),
        ("i8", "I8", torch.randint(-128, 127, (4, 1), generator=g, dtype=torch.int8)),
        ("u8", "U8", torch.randint(0, 255, (10,), generator=g, dtype=torch.uint8)),
        ("mask", "BOOL", torch.rand(3, 3, generator=g) > 0.5),
        ("empty", "BF16", torch.zeros(0, dtype=torch.bfloat16)),
        ("empty2", "F32", torch.zeros(2, 0)),
    ]
    tensors = [(name, dtype, tuple(t.shape), to_bytes(t)) for name, dtype, t in out]
    # dtypes torch 1.13 lacks pass through as bytes
    for name, dtype, shape in (("u16", "U16", (5,)), ("u32", "U32", (2, 2)), ("u64", "U64", (3,)),
                               ("f8a", "F8_E5M2", (8,)), ("f8b", "F8_E4M3", (2, 4))):
        n = int(np.prod(shape)) * DTYPES[dtype][0]
        tensors.append((name, dtype, shape, rng.integers(0, 256, n, dtype=np.uint8).tobytes()))
    return tensors, {name: t for name, _, t in out}


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, **kw)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--driver", required=True)
    driver = parser.parse_args().driver
    tensors, torch_tensors = make_tensors()
    metadata = {"format": "pt", "step": "41", "note": "ünïcode, \"quotes\"\nand a newline"}
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory() as d:
        # Python writes: data in one order, header keys shuffled, metadata last.
        src = os.path.join(d, "python.safetensors")
        key_order = [t[0] for t in tensors]
        random.Random(11).shuffle(key_order)
        ref_write(src, tensors, metadata, key_order=key_order, metadata_last=True)

        r = run([driver, "dump", src], check=True)
        got = json.loads(r.stdout)
        check(got["metadata"] == metadata, f"metadata {got['metadata']}")
        check([t["name"] for t in got["tensors"]] == [t[0] for t in tensors], "pulse's tensor order is not the data order")
        for (name, dtype, shape, raw), t in zip(tensors, got["tensors"]):
            check(t["name"] == name and t["dtype"] == dtype and tuple(t["shape"]) == shape, f"{name}: entry {t}")
            raw_pulse = bytes.fromhex(t["hex"])
            check(raw_pulse == raw, f"{name}: bytes differ")
            if name in torch_tensors:
                check(same_bits(from_bytes(dtype, shape, raw_pulse), torch_tensors[name]), f"{name}: torch tensor differs")
        print(f"python -> pulse: {len(got['tensors'])} tensors, metadata {len(got['metadata'])} keys")

        # pulse writes, in an order of our choosing; Python reads.
        order = sorted((t[0] for t in tensors), reverse=True)
        out = os.path.join(d, "pulse.safetensors")
        with open(os.path.join(d, "order.json"), "w") as f:
            json.dump(order, f)
        run([driver, "rewrite", src, out, os.path.join(d, "order.json")], check=True)
        meta_back, back, raw_header = ref_read(out)
        check(meta_back == metadata, f"metadata read back {meta_back}")
        check([t[0] for t in back] == order, "pulse did not lay tensors out in the given order")
        by_name = {t[0]: t for t in tensors}
        for name, dtype, shape, raw in back:
            check((dtype, shape, raw) == by_name[name][1:], f"{name}: differs after pulse wrote it")
            if name in torch_tensors:
                check(same_bits(from_bytes(dtype, shape, raw), torch_tensors[name]), f"{name}: torch tensor differs")
        padding = len(raw_header) - len(raw_header.rstrip(b" "))
        check(len(raw_header) % 8 == 0 and padding < 8, "header not padded with spaces to 8 bytes")
        pairs = json.loads(raw_header, object_pairs_hook=lambda p: p)
        check([k for k, _ in pairs] == ["__metadata__"] + order, "header keys not in the written order")
        ref = os.path.join(d, "reference.safetensors")
        ref_write(ref, [by_name[n] for n in order], dict(sorted(metadata.items())))
        with open(out, "rb") as a, open(ref, "rb") as b:
            check(a.read() == b.read(), "pulse's file is not byte-identical to the reference writer's")
        print(f"pulse -> python: {len(back)} tensors, header {len(raw_header)} bytes")

        # A file with a hole between tensors is refused with one line naming it.
        bad = os.path.join(d, "hole.safetensors")
        ref_write(bad, [("a", "U8", (2,), b"ab")], {})
        with open(bad, "ab") as f:
            f.write(b"x")
        r = run([driver, "dump", bad])
        check(r.returncode == 1 and "hole.safetensors" in r.stderr and "hole" in r.stderr
              and r.stderr.count("\n") == 1, f"hole not refused clearly: {r.stderr!r}")

    for f in failures:
        print("FAIL", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
