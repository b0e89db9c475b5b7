#!/usr/bin/env python3
"""PyTorch oracle for the sparsity, absorption and gate kernels.

Writes random and adversarial inputs, runs sparsity_driver on them, and recomputes every result
with torch: bit comparisons as int16 views, nonzero/gather for compaction, cumulative sums for
per-tensor counts, frexp for histogram bins, .to(torch.bfloat16) for the gate. Exits non-zero
naming the case and quantity on any mismatch.

    test_sparsity_torch.py --driver path/to/sparsity_driver
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

KS = [1, 2, 3, 4, 8]
DEPTH = 4
NUM_SNAPSHOTS = 10
TAUS = [0.0, 1e-8, 1e-6, 1e-4]
RATIO_RANGE = [-12, 8]
WEIGHT_RANGE = [-149, 128]  # the kernel's default: every finite float binade

failures = []


def check(case, what, ok, detail=""):
    if not ok:
        failures.append(f"{case}: {what} differs from PyTorch {detail}")


def as_i16(a):
    """uint16 numpy array -> int16 torch tensor of the same bits (torch 1.13 has no uint16)."""
    return torch.from_numpy(np.ascontiguousarray(a).view(np.int16))


# ---------------------------------------------------------------- inputs


def bf16_pair(kind, n, rng):
    old = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    if kind == "random":
        new = np.where(rng.random(n) < 0.02, rng.integers(0, 1 << 16, n, dtype=np.uint16), old)
    elif kind == "all_changed":
        new = old ^ (np.uint16(1) << (np.arange(n) % 16).astype(np.uint16))
    elif kind == "none_changed":
        new = old.copy()
    elif kind == "signed_zeros":  # +0 <-> -0 flips on every third element
        old = np.where(np.arange(n) % 2 == 1, 0x8000, 0x0000).astype(np.uint16)
        new = np.where(np.arange(n) % 3 == 0, old ^ 0x8000, old).astype(np.uint16)
    elif kind == "nan_payloads":  # 0x7FC1 vs 0x7FC0 and sign flips of NaNs
        old = (0x7FC0 | (np.arange(n) & 0x3F)).astype(np.uint16)
        flip = np.where(np.arange(n) % 4 == 1, 0x0001, 0x8000).astype(np.uint16)
        new = np.where(np.arange(n) % 2 == 1, old ^ flip, old).astype(np.uint16)
    else:
        raise ValueError(kind)
    return old, new.astype(np.uint16)


def history(n, rng):
    snaps = [rng.integers(0, 1 << 16, n, dtype=np.uint16)]
    for t in range(1, NUM_SNAPSHOTS):
        prev = snaps[-1]
        nxt = np.where(rng.random(n) < 0.05, rng.integers(0, 1 << 16, n, dtype=np.uint16), prev)
        if n:
            nxt[0] = 0x8000 if t % 2 else 0x0000  # signed-zero flips
            nxt[-1] = 0x7FC0 | (t % 3)  # NaN payload changes
        snaps.append(nxt.astype(np.uint16))
    return np.stack(snaps)


def f32(bits):
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def half_ulp_of(w):
    """Half a BF16 ulp of bf16(w), as float64, for finite w (torch's cast, the exponent field)."""
    b = torch.from_numpy(w).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).astype(np.int64)
    e = (b >> 7) & 0xFF
    h = np.ldexp(1.0, np.maximum(e, 1) - 127 - 8)
    return np.where(e == 0xFF, np.inf, h)


def grads(n, rng):
    g = (10.0 ** rng.uniform(-12, 0, n) * rng.choice([-1, 1], n)).astype(np.float32)
    pick = rng.integers(0, 8, n)
    taus32 = np.array(TAUS, dtype=np.float32)
    at_tau = taus32[rng.integers(0, len(TAUS), n)]
    g = np.where(pick == 0, np.float32(0) * rng.choice([-1, 1], n).astype(np.float32), g)
    g = np.where(pick == 1, at_tau * rng.choice([-1, 1], n).astype(np.float32), g)
    g = np.where(pick == 2, np.nextafter(at_tau, np.float32(1)), g)  # just above tau
    g = np.where(pick == 3, f32(0x7FC00000 | rng.integers(0, 1 << 22, n)), g)  # NaNs
    g = np.where(pick == 4, f32(rng.integers(1, 1 << 23, n)), g)  # subnormals
    return g.astype(np.float32)


def weights_and_updates(n, rng):
    """Weights over many binades; updates around the half-ulp threshold, exactly on it, far off it.
    No NaN in weights (torch's vectorised cast maps NaN to 0xFFFF); inf and overflow are kept."""
    sign = rng.choice([-1.0, 1.0], n).astype(np.float32)
    w = (sign * np.exp2(rng.uniform(-30, 6, n))).astype(np.float32)
    pick = rng.integers(0, 16, n)
    w = np.where(pick == 0, sign * np.float32(0), w)
    w = np.where(pick == 1, f32(rng.integers(1, 1 << 23, n)) * sign, w)  # subnormals
    w = np.where(pick == 2, sign * np.float32(np.inf), w)
    w = np.where(pick == 3, sign * f32(0x7F7F0000 + rng.integers(0, 1 << 16, n)), w)  # near FLT_MAX
    w = w.astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        hu = half_ulp_of(w)
        usign = rng.choice([-1.0, 1.0], n)
        u = usign * hu * np.exp2(rng.uniform(-20, 12, n))
        pick = rng.integers(0, 12, n)
        u = np.where(pick == 0, usign * 0.0, u)
        u = np.where(pick == 1, usign * hu, u)  # ratio exactly 1
        u = np.where(pick == 2, np.where(rng.random(n) < 0.5, np.nan, usign * np.inf), u)
        tie = (usign * hu).astype(np.float32)
        u = np.where(pick == 3, np.nextafter(tie, np.float32(0)), u.astype(np.float32))  # just below
    return w, u.astype(np.float32)


def gate_inputs(n, rng):
    theta = rng.normal(0, 0.05, n).astype(np.float32)
    hu = half_ulp_of(theta).astype(np.float32)
    scale = np.exp2(rng.uniform(-12, 2, n)).astype(np.float32)
    sign = rng.choice([-1, 1], n).astype(np.float32)
    s = hu * scale * sign
    pick = rng.integers(0, 8, n)
    s = np.where(pick == 0, hu * sign, s)  # exact ties
    zeros = rng.choice([-1, 1], n).astype(np.float32) * np.float32(0)
    theta = np.where(pick == 1, zeros, theta)
    s = np.where(pick == 1, rng.choice([-1, 1], n).astype(np.float32) * np.float32(0), s)  # -0 - -0 = +0
    on_grid = torch.from_numpy(theta).to(torch.bfloat16).to(torch.float32).numpy()
    s = np.where(pick == 2, theta - on_grid, s)  # theta - s lands on a BF16 value
    return theta.astype(np.float32), s.astype(np.float32)


# ---------------------------------------------------------------- reference


def log2_histogram(mag, finite, k_min, k_max):
    """mag: float64 magnitudes; bins by frexp (mag = m 2^e, m in [0.5, 1): floor log2 = e - 1)."""
    mag_t = torch.from_numpy(mag)
    fin = torch.from_numpy(finite)
    zero = fin & (mag_t == 0)
    nz = fin & (mag_t != 0)
    _, e = torch.frexp(torch.where(nz, mag_t, torch.ones_like(mag_t)))
    k = e.to(torch.int64) - 1
    inside = nz & (k >= k_min) & (k < k_max)
    bins = torch.bincount(k[inside] - k_min, minlength=k_max - k_min)
    return {
        "k_min": k_min,
        "k_max": k_max,
        "bins": bins.tolist(),
        "zero": int(zero.sum()),
        "below": int((nz & (k < k_min)).sum()),
        "above": int((nz & (k >= k_max)).sum()),
        "non_finite": int((~fin).sum()),
    }


def read(path, dtype):
    return np.fromfile(path, dtype=dtype)


def verify(case, d, inputs, result):
    old, new, offsets, hist, grad, w, u, theta, s = inputs
    n = old.size

    changed = as_i16(old) != as_i16(new)
    count = int(changed.sum())
    check(case, "changed count", result["changed"] == count, f"({result['changed']} vs {count})")
    csum = torch.cat([torch.zeros(1, dtype=torch.int64), changed.cumsum(0)])
    off = torch.tensor(offsets)
    per_tensor = (csum[off[1:]] - csum[off[:-1]]).tolist()
    check(case, "per-tensor counts", result["per_tensor"] == per_tensor)
    check(case, "per-tensor total", result["per_tensor_total"] == count)

    idx = changed.nonzero().flatten()
    vals = as_i16(new)[idx]
    c = result["compact"]
    check(case, "compaction count", c["count"] == count and c["first_attempt_count"] == count)
    got_idx = torch.from_numpy(read(d / "changed_indices.bin", np.int64))
    got_vals = as_i16(read(d / "changed_values.bin", np.uint16))
    check(case, "changed indices", torch.equal(got_idx, idx))
    check(case, "changed values", torch.equal(got_vals, vals))

    h = as_i16(hist.reshape(NUM_SNAPSHOTS, n)) if n else torch.zeros(NUM_SNAPSHOTS, 0, dtype=torch.int16)
    kstep = [[int((h[t] != h[t - k]).sum()) if k <= min(t, DEPTH) else -1 for k in KS] for t in range(NUM_SNAPSHOTS)]
    check(case, "k-step counts", result["kstep"] == kstep, f"\n  driver {result['kstep']}\n  torch  {kstep}")

    g = torch.from_numpy(grad)
    small = [int((g.abs() <= torch.tensor(tau, dtype=torch.float32)).sum()) for tau in TAUS]
    check(case, "gradient threshold counts", result["small"] == small, f"({result['small']} vs {small})")

    with np.errstate(over="ignore", invalid="ignore"):
        hu = half_ulp_of(w)
        finite = np.isfinite(w) & np.isfinite(u) & np.isfinite(hu)
        ratio = np.where(finite, np.abs(u.astype(np.float64)) / np.where(finite, hu, 1.0), 0.0)
    want_ratio = log2_histogram(ratio, finite, *RATIO_RANGE)
    want_weight = log2_histogram(np.abs(w.astype(np.float64)), np.isfinite(w), *WEIGHT_RANGE)
    a = result["absorption"]
    check(case, "ratio histogram", a["ratio"] == want_ratio, f"\n  driver {a['ratio']}\n  torch  {want_ratio}")
    check(case, "|w| histogram", a["weight"] == want_weight)
    absorbed = int((finite & (ratio < 1)).sum())
    check(case, "absorbed count", a["absorbed"] == absorbed, f"({a['absorbed']} vs {absorbed})")

    t, sv = torch.from_numpy(theta), torch.from_numpy(s)
    fire = t.to(torch.bfloat16).view(torch.int16) != (t - sv).to(torch.bfloat16).view(torch.int16)
    check(case, "fired count", result["fired"] == int(fire.sum()))
    check(case, "gate mask", torch.equal(torch.from_numpy(read(d / "mask.bin", np.uint8)).bool(), fire))
    fidx = fire.nonzero().flatten()
    check(case, "fired count (compaction)", result["compact_fired"]["count"] == fidx.numel())
    check(case, "fired indices", torch.equal(torch.from_numpy(read(d / "fired_indices.bin", np.int64)), fidx))
    got_s = torch.from_numpy(read(d / "fired_values.bin", np.float32)).view(torch.int32)
    check(case, "fired values", torch.equal(got_s, sv.view(torch.int32)[fidx]))
    return count, int(fire.sum())


# ---------------------------------------------------------------- driver runs


def run_case(driver, root, case, n, kind, tensor_sizes, max_segment_length, capacity, rng):
    d = Path(root) / case
    d.mkdir()
    old, new = bf16_pair(kind, n, rng)
    offsets = [0] + np.cumsum(tensor_sizes).tolist()
    assert offsets[-1] == n
    hist = history(n, rng)
    grad = grads(n, rng)
    w, u = weights_and_updates(n, rng)
    theta, s = gate_inputs(n, rng)
    for name, a in [("old", old), ("new", new), ("history", hist), ("grad", grad), ("weights", w),
                    ("updates", u), ("theta", theta), ("s", s)]:
        np.ascontiguousarray(a).tofile(d / f"{name}.bin")
    params = {"n": n, "capacity": capacity, "offsets": offsets, "max_segment_length": max_segment_length,
              "num_snapshots": NUM_SNAPSHOTS, "depth": DEPTH, "ks": KS, "taus": TAUS, "ratio_range": RATIO_RANGE}
    (d / "params.json").write_text(json.dumps(params))
    proc = subprocess.run([driver, str(d)], capture_output=True, text=True)
    if proc.returncode != 0:
        failures.append(f"{case}: driver exited {proc.returncode}: {proc.stderr.strip()}")
        return
    result = json.loads((d / "result.json").read_text())
    changed, fired = verify(case, d, (old, new, offsets, hist, grad, w, u, theta, s), result)
    print(f"{case}: n={n} changed={changed} fired={fired} absorbed={result['absorption']['absorbed']}")


def split(n, parts, rng):
    """n elements into `parts` tensors, some empty, some of one element."""
    cuts = np.sort(rng.integers(0, n + 1, parts - 1)) if n else np.zeros(parts - 1, dtype=np.int64)
    sizes = np.diff(np.concatenate([[0], cuts, [n]])).tolist()
    return sizes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--driver", required=True, help="path of the sparsity_driver executable")
    args = parser.parse_args()
    rng = np.random.default_rng(2602)
    start = time.time()
    with tempfile.TemporaryDirectory(prefix="pulse_sparsity_") as root:
        cases = [
            ("random_1000003", 1000003, "random", None, 1 << 15, 1000),  # capacity too small: grow and retry
            ("random_small_segments", 100003, "random", None, 61, 100003),
            ("all_changed_33", 33, "all_changed", [0, 1, 32, 0], 4, 0),
            ("none_changed_1000", 1000, "none_changed", [1000], 7, 5),
            ("signed_zeros_7", 7, "signed_zeros", [3, 0, 4], 1, 2),
            ("nan_payloads_4097", 4097, "nan_payloads", None, 64, 10),
            ("one_element", 1, "random", [1], 1, 0),
            ("empty", 0, "random", [0, 0], 1, 0),
        ]
        for case, n, kind, sizes, max_len, capacity in cases:
            sizes = sizes if sizes is not None else split(n, 9, rng)
            run_case(args.driver, root, case, n, kind, sizes, max_len, capacity, rng)
    print(f"{len(cases)} cases in {time.time() - start:.1f} s")
    if failures:
        print("\n".join(["FAILED:"] + failures), file=sys.stderr)
        return 1
    print("all results match PyTorch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
