#!/usr/bin/env python3
"""The reference decoder (pulse_ref_decode.py, written from FORMAT.md alone) against pulse:
every checked-in vector, a fresh set of vectors from random states (make_test_vectors --seed),
and patches pulse-sync encodes now from random states in every coding and compressor must
decode to exactly their targets, digests checked; corrupt patches are refused.

    test_reference_decoder.py --vectors DIR --make-vectors EXE --pulse-sync EXE
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pulse_ref_decode as ref  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def decode_vectors(folder, label):
    with open(os.path.join(folder, "manifest.json")) as f:
        m = json.load(f)
    states = {k: ref.read_safetensors(os.path.join(folder, s["file"])) for k, s in m["states"].items()}
    for k, s in m["states"].items():
        check(ref.state_digest(*states[k]).hex() == s["state_digest"], f"{label} state {k} digest")
    base = states["base"][0]
    history = ref.read_history(os.path.join(folder, m["history"]["file"]), m["history"]["digest"], base)
    count = 0
    for v in m["vectors"]:
        with open(os.path.join(folder, v["patch"]), "rb") as f:
            patch = f.read()
        check(ref.xxh3(patch).hex() == v["patch_xxh3"], f"{label} {v['name']} patch digest")
        base_state, base_metadata = states[v["base"]]
        try:
            target, metadata = ref.decode(patch, base_state, base_metadata, history if v["history"] else None)
        except ref.RefError as e:
            check(False, f"{label} {v['name']} refused: {e}")
            continue
        want, want_metadata = states[v["target"]]
        check(target == {k: (d, list(s), bytes(b)) for k, (d, s, b) in want.items()}, f"{label} {v['name']} target")
        check(metadata == want_metadata, f"{label} {v['name']} metadata")
        count += 1
    print(f"{label}: {count} of {len(m['vectors'])} vectors decode to their targets")
    return m, states, history


def refused(patch, base, metadata, history=None):
    try:
        ref.decode(patch, base, metadata, history)
    except ref.RefError:
        return True
    return False


def random_state(rng, seed):
    """Tensors of every sparse-coded dtype (weights near one magnitude) and an I32 tensor."""
    state = {}
    for k, (dtype, w) in enumerate([("BF16", 2), ("F16", 2), ("F32", 4), ("F8_E4M3", 1), ("F8_E5M2", 1),
                                    ("F8_E8M0", 1)]):
        n = rng.randrange(0, 900)
        bits = np.random.default_rng(seed + k).integers(0, 1 << (8 * w), n, dtype=np.uint64)
        if w > 1:
            top = np.uint64(8 * w - 8)
            bits = (bits & ~(np.uint64(0x3F) << top)) | (np.uint64(0x3C) << top)
        state[f"t{k}.{dtype.lower()}"] = (dtype, [n], bits.astype(ref.UINT[w]).tobytes())
    state["ints"] = ("I32", [4], bytes(16))
    return state


def changed(rng, state, seed):
    out = {}
    for name, (dtype, shape, data) in state.items():
        if dtype not in ref.SPARSE:
            out[name] = (dtype, shape, bytes([1]) + data[1:])
            continue
        f = ref.Fmt(dtype)
        a = np.frombuffer(data, dtype=ref.UINT[f.w]).copy()
        g = np.random.default_rng(seed + 77)
        for i in np.nonzero(g.random(len(a)) < rng.choice([0.001, 0.03, 0.3]))[0]:
            k = f.key(int(a[i])) + int(g.integers(-3, 4))
            if 0 <= k <= f.M:
                a[i] = f.from_key(k)
        out[name] = (dtype, shape, a.tobytes())
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vectors", required=True)
    ap.add_argument("--make-vectors", required=True)
    ap.add_argument("--pulse-sync", required=True)
    ap.add_argument("--seed", type=int, default=None)
    a = ap.parse_args()
    if ref.xxhash is None:
        print("the reference decoder needs python3-xxhash to check digests", file=sys.stderr)
        return 1
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1, 1 << 30)
    print(f"seed {seed}")
    rng = random.Random(seed)

    # 1. The checked-in vectors; corrupt ones are refused.
    m, states, history = decode_vectors(a.vectors, "checked-in")
    base, base_metadata = states["base"]
    for v in m["vectors"]:
        with open(os.path.join(a.vectors, v["patch"]), "rb") as f:
            patch = f.read()
        h = history if v["history"] else None
        bad = bytearray(patch)
        bad[-1] ^= 1  # checksum
        check(refused(bytes(bad), base, base_metadata, h), f"{v['name']}: a bad checksum is refused")
        check(refused(patch, base, base_metadata, None) if v["history"] else True,
              f"{v['name']}: refused without the history")
        check(refused(patch[:-1], base, base_metadata, h), f"{v['name']}: a truncated patch is refused")
        if v["target"] == "target":  # applied to the target instead of the base: refused by its digest
            check(refused(patch, *states["target"], h), f"{v['name']}: refused on another base")

    with tempfile.TemporaryDirectory() as tmp:
        # 2. A fresh set of vectors from other random states.
        fresh = os.path.join(tmp, "fresh")
        os.mkdir(fresh)
        subprocess.run([a.make_vectors, fresh, "--seed", str(seed)], check=True)
        decode_vectors(fresh, f"fresh (seed {seed})")

        # 3. Patches pulse-sync encodes now, in every coding and compressor.
        codings = [("raw", "gap-fixed"), ("raw", "gap-varint"), ("keydiff", "gap-fixed"), ("keydiff", "gap-varint"),
                   ("expclass", "expclass")]
        decoded = 0
        for trial in range(4):
            s = seed * 10 + trial
            base = random_state(rng, s)
            target = changed(rng, base, s)
            base_metadata = {"format": "pt"}
            target_metadata = base_metadata if trial % 2 else {"format": "pt", "step": str(trial)}
            bp, tp = os.path.join(tmp, "b.safetensors"), os.path.join(tmp, "t.safetensors")
            ref.write_safetensors(bp, base, base_metadata)
            ref.write_safetensors(tp, target, target_metadata)
            for values, indices in codings:
                for compressor in ("none", "zstd", "lz4"):
                    pp = os.path.join(tmp, "p.pulse")
                    subprocess.run([a.pulse_sync, "encode", "--base", bp, "--target", tp, "-o", pp, "--values", values,
                                    "--indices", indices, "--compressor", compressor, "--threads", "2"],
                                   check=True, stdout=subprocess.DEVNULL)
                    with open(pp, "rb") as f:
                        patch = f.read()
                    what = f"pulse-sync seed {s} {values}/{indices}/{compressor}"
                    try:
                        got, got_metadata = ref.decode(patch, base, base_metadata)
                    except ref.RefError as e:
                        check(False, f"{what} refused: {e}")
                        continue
                    check(got == target and got_metadata == target_metadata, f"{what}: target")
                    decoded += 1
        print(f"pulse-sync: {decoded} fresh patches decode to their targets")

    failures[:] = [f for f in failures if f]
    print(f"{0 if failures else 1} passed, {1 if failures else 0} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
