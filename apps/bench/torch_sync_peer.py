"""The PULSESync pipeline as a PyTorch user would write it, timed on one thread, to set beside
pulse-bench-sync: encode = mask / nonzero / gather of the changed BF16 elements, int32 gaps
and raw BF16 values (the paper's format), python3-zstandard level 1; apply = decompress,
cumulative sum, index_put. Steps follow the same absorption rule as pulse-bench-sync: weights
~ N(0, 0.02), updates lr * N(0, 1) with lr set for the target sparsity.
    python3 torch_sync_peer.py --elements 268435456 --out torch_sync.json
"""
import argparse
import json
import time

import numpy as np
import torch
import zstandard


def make_step(n, sparsity, seed=1):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, generator=g) * 0.02
    noise = torch.randn(n, generator=g)
    sample = slice(0, min(n, 1 << 20))
    lo, hi = 1e-9, 1e-3  # bisection on log lr for the target changed fraction
    for _ in range(40):
        mid = (lo * hi) ** 0.5
        changed = (w[sample].bfloat16() != (w[sample] + mid * noise[sample]).bfloat16()).float().mean().item()
        lo, hi = (mid, hi) if changed < 1 - sparsity else (lo, mid)
    lr = (lo * hi) ** 0.5
    return w.bfloat16(), (w + lr * noise).bfloat16()


def encode(base, target):
    mask = base.view(torch.int16) != target.view(torch.int16)
    idx = mask.nonzero().squeeze(1)
    vals = target.view(torch.int16)[idx]
    gaps = torch.diff(idx, prepend=torch.zeros(1, dtype=idx.dtype)).to(torch.int32)
    raw = gaps.numpy().tobytes() + vals.numpy().tobytes()
    return zstandard.ZstdCompressor(level=1).compress(raw), len(idx)


def apply(weights, payload, count):
    raw = zstandard.ZstdDecompressor().decompress(payload)
    gaps = torch.from_numpy(np.frombuffer(raw[:4 * count], dtype=np.int32).copy())
    vals = torch.from_numpy(np.frombuffer(raw[4 * count:], dtype=np.int16).copy())
    idx = torch.cumsum(gaps.to(torch.int64), 0)
    weights.view(torch.int16)[idx] = vals


def best_of(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--elements", type=int, default=1 << 28)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = []
    for sparsity in (0.99, 0.999):
        base, target = make_step(args.elements, sparsity)
        payload, count = encode(base, target)
        encode_s = best_of(lambda: encode(base, target), args.repeats)
        receiver = base.clone()
        apply(receiver, payload, count)
        assert torch.equal(receiver.view(torch.int16), target.view(torch.int16)), "PyTorch pipeline is not bit-exact"
        # Applying again to weights already at the target is the same work: time it in place.
        apply_s = best_of(lambda: apply(receiver, payload, count), args.repeats)
        results.append({"sparsity": 1 - count / args.elements, "elements": args.elements, "changed": count,
                        "patch_bytes": len(payload), "bits_per_changed": 8 * len(payload) / max(count, 1),
                        "encode_seconds": encode_s, "apply_seconds": apply_s})
        print(json.dumps(results[-1]))
    json.dump({"torch_version": torch.__version__, "zstandard_version": zstandard.__version__, "results": results},
              open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
