"""The weight-update format RL frameworks ship (prime-rl's: per tensor, the changed elements' flat
indices as int32 and their new BF16 values, zstd-compressed with python3-zstandard), as a PyTorch
user would write it, for apps/bench/big_folder_bench.py to set beside pulse-sync on the same
folders. encode reads each tensor of both versions (one tensor of each in memory; the shards
named alike), keeps `a != b`'s nonzero indices and the target's values; apply copies the base
(unless in place), reads each changed tensor of the output, index_copy_s its changes and writes
it back, then fsyncs. No digest,
signature or transaction: a peer for size and speed only.
    primerl_peer.py encode BASE TARGET PATCH [--threads N] [--level 3]
    primerl_peer.py apply BASE PATCH OUT [--threads N]    (OUT = BASE: in place)
BASE, TARGET and OUT are .safetensors files or model folders (BF16 tensors).
"""
import argparse
import json
import os
import shutil
import struct
import warnings

import numpy as np
import torch
import zstandard

warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def shards(path):
    """[(shard path, relative name)] of a file or folder."""
    if os.path.isfile(path):
        return [(path, os.path.basename(path))]
    return [(os.path.join(path, n), n) for n in sorted(os.listdir(path)) if n.endswith(".safetensors")]


def header(path):
    """{name: (start, end)} byte ranges in the file, and the data offset."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return {k: tuple(v["data_offsets"]) for k, v in h.items() if v["dtype"] == "BF16"}, 8 + n


def read(fd, base, start, end):
    """The tensor's BF16 bit patterns as a flat int16 tensor (its own memory)."""
    data = bytearray(end - start)
    view, done = memoryview(data), 0
    while done < len(data):
        done += os.preadv(fd, [view[done:]], base + start + done)
    return torch.frombuffer(data, dtype=torch.int16)


def encode(base, target, patch, level):
    cctx = zstandard.ZstdCompressor(level=level)
    with open(patch, "wb") as out:
        for (a_path, rel), (b_path, _) in zip(shards(base), shards(target)):
            ranges, a_off = header(a_path)
            b_ranges, b_off = header(b_path)
            fa, fb = os.open(a_path, os.O_RDONLY), os.open(b_path, os.O_RDONLY)
            for name, (s, e) in ranges.items():
                a, b = read(fa, a_off, s, e), read(fb, b_off, *b_ranges[name])
                idx = torch.nonzero(a != b).flatten()
                blob = cctx.compress(idx.to(torch.int32).numpy().tobytes() + b[idx].numpy().tobytes())
                key = name.encode()
                out.write(struct.pack("<IQQ", len(key), idx.numel(), len(blob)) + key + blob)
            os.close(fa)
            os.close(fb)


def apply(base, patch, out):
    if os.path.realpath(out) != os.path.realpath(base):
        (shutil.copytree if os.path.isdir(base) else shutil.copyfile)(base, out)
    where, fds = {}, {}
    for path, _ in shards(out):
        ranges, off = header(path)
        fds[path] = os.open(path, os.O_RDWR)
        for name, r in ranges.items():
            where[name] = (path, off, r)
    dctx = zstandard.ZstdDecompressor()
    with open(patch, "rb") as f:
        while head := f.read(20):
            klen, count, blen = struct.unpack("<IQQ", head)
            name = f.read(klen).decode()
            raw = dctx.decompress(f.read(blen), max_output_size=6 * count)
            if not count:
                continue
            idx = torch.from_numpy(np.frombuffer(raw, np.int32, count)).long()
            values = torch.from_numpy(np.frombuffer(raw, np.int16, count, 4 * count))
            path, off, (s, e) = where[name]
            t = read(fds[path], off, s, e)
            t.index_copy_(0, idx, values)
            os.pwrite(fds[path], t.numpy(), off + s)
    for fd in fds.values():
        os.fsync(fd)
        os.close(fd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("command", choices=["encode", "apply"])
    ap.add_argument("paths", nargs=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--level", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.command == "encode":
        encode(*args.paths, args.level)
    else:
        apply(*args.paths)


if __name__ == "__main__":
    main()
