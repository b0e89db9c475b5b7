"""pulse-sync end to end on safetensors files: diff, encode/apply round trips for every coding,
verify, inspect, signatures, rejection of corrupt patches with outputs absent or unchanged, and
the relay: late joiners, the fast path, and publishers killed at random points.
    test_pulse_sync.py --app build/apps/pulse-sync
"""
import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_ref  # noqa: E402

failures = []


def expect(cond, message):
    if not cond:
        failures.append(message)
        print("FAIL", message)


def run(app, *args):
    return subprocess.run([app, *map(str, args)], capture_output=True, text=True)


def bf16_bits(x):
    return torch.from_numpy(np.asarray(x, dtype=np.float32)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def make_weights(rng, n=50000):
    return [("blocks.0.attn.qkv.weight", "BF16", bf16_bits(rng.standard_normal((n // 100, 100)) * 0.02)),
            ("blocks.0.ln.bias", "BF16", bf16_bits(rng.standard_normal(37) * 0.02)),
            ("empty", "BF16", np.zeros((0,), np.uint16)),
            ("scale", "F32", np.array([1.0, 2.0], np.float32)),
            ("step", "I64", np.array(7, np.int64))]


def step(rng, tensors, density):
    out = []
    for name, dtype, a in tensors:
        if dtype == "BF16":
            a = a.copy()
            flat = a.reshape(-1)
            hit = rng.random(flat.size) < density
            flat[hit] = flat[hit] ^ 1  # the lowest mantissa bit: a one-ulp change
        out.append((name, dtype, a))
    return out


def same_tensors(path, tensors):
    got, _ = safetensors_ref.read(path)
    return all(name in got and got[name][0] == dtype and np.array_equal(got[name][1], a) for name, dtype, a in tensors)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--app", required=True)
    app = parser.parse_args().app
    rng = np.random.default_rng(11)
    with tempfile.TemporaryDirectory() as d:
        p = lambda name: os.path.join(d, name)
        base = make_weights(rng)
        target = step(rng, base, 0.01)
        target[3] = ("scale", "F32", np.array([1.0, 3.0], np.float32))
        safetensors_ref.write(p("base.safetensors"), base, {"format": "pt"})
        # another tensor order, and a changed __metadata__, which must travel in the patch
        safetensors_ref.write(p("target.safetensors"), list(reversed(target)), {"format": "pt", "step": "1"})

        r = run(app, "diff", p("base.safetensors"), p("target.safetensors"))
        changed = sum(int(np.count_nonzero(a != b)) for (_, dt, a), (_, _, b) in zip(base, target) if dt == "BF16")
        expect(r.returncode == 0 and f"{changed} changed" in r.stdout, f"diff should report {changed} changed: {r.stdout}{r.stderr}")

        digest = run(app, "verify", p("target.safetensors")).stdout.split()[0]
        for values in ("keydiff", "raw"):
            for indices in ("gap-varint", "gap-fixed"):
                for comp in ("zstd", "lz4", "none"):
                    name = f"{values}-{indices}-{comp}"
                    r = run(app, "encode", "--base", p("base.safetensors"), "--target", p("target.safetensors"),
                            "-o", p(name + ".pulse"), "--values", values, "--indices", indices, "--compressor", comp)
                    expect(r.returncode == 0, f"encode {name}: {r.stderr}")
                    r = run(app, "apply", "--base", p("base.safetensors"), "--patch", p(name + ".pulse"), "-o", p("out.safetensors"))
                    expect(r.returncode == 0 and same_tensors(p("out.safetensors"), target), f"apply {name}: {r.stderr}")
                    expect(safetensors_ref.read(p("out.safetensors"))[1] == {"format": "pt", "step": "1"},
                           "the target's metadata must arrive")
                    r = run(app, "verify", p("out.safetensors"), "--digest", digest)
                    expect(r.returncode == 0, f"verify after {name}: {r.stderr}")
        r = run(app, "verify", p("base.safetensors"), "--digest", digest)
        expect(r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, "verify must fail on another state, in one line")
        r = run(app, "inspect", p("keydiff-gap-varint-zstd.pulse"))
        expect(r.returncode == 0 and "versions 0 -> 1" in r.stdout and f"{changed} changed" in r.stdout
               and "step = 1" in r.stdout,
               f"inspect: {r.stdout}")

        # Corrupt patches: rejected in one line, the output absent, the in-place file unchanged.
        good = open(p("keydiff-gap-varint-zstd.pulse"), "rb").read()
        base_bytes = open(p("base.safetensors"), "rb").read()
        for k, bad in enumerate([good[:-1], good[:100], good[:8] + b"\0" + good[9:],
                                 *(good[:i] + bytes([good[i] ^ 0x10]) + good[i + 1:] for i in (20, 140, len(good) // 2, len(good) - 3))]):
            open(p("bad.pulse"), "wb").write(bad)
            out = p(f"bad-out-{k}.safetensors")
            r = run(app, "apply", "--base", p("base.safetensors"), "--patch", p("bad.pulse"), "-o", out)
            expect(r.returncode != 0 and not os.path.exists(out) and len(r.stderr.strip().splitlines()) == 1,
                   f"corrupt patch {k} must fail in one line with no output: rc={r.returncode} {r.stderr}")
            open(p("inplace.safetensors"), "wb").write(base_bytes)
            r = run(app, "apply", "--in-place", p("inplace.safetensors"), "--patch", p("bad.pulse"))
            expect(r.returncode != 0 and open(p("inplace.safetensors"), "rb").read() == base_bytes,
                   f"corrupt patch {k} must leave the in-place file unchanged")
        r = run(app, "apply", "--base", p("target.safetensors"), "--patch", p("keydiff-gap-varint-zstd.pulse"), "-o", p("wrong.safetensors"))
        expect(r.returncode != 0 and "base" in r.stderr and not os.path.exists(p("wrong.safetensors")), f"wrong base: {r.stderr}")
        open(p("inplace.safetensors"), "wb").write(base_bytes)
        r = run(app, "apply", "--in-place", p("inplace.safetensors"), "--patch", p("keydiff-gap-varint-zstd.pulse"))
        expect(r.returncode == 0 and same_tensors(p("inplace.safetensors"), target), f"in-place apply: {r.stderr}")

        # Signatures.
        run(app, "keygen", "--public", p("k.pub"), "--secret", p("k.sec"))
        run(app, "keygen", "--public", p("x.pub"), "--secret", p("x.sec"))
        expect(oct(os.stat(p("k.sec")).st_mode & 0o777) == "0o600", "secret key file must be 0600")
        run(app, "encode", "--base", p("base.safetensors"), "--target", p("target.safetensors"), "-o", p("signed.pulse"), "--sign", p("k.sec"))
        r = run(app, "apply", "--base", p("base.safetensors"), "--patch", p("signed.pulse"), "-o", p("s.safetensors"), "--public-key", p("k.pub"))
        expect(r.returncode == 0, f"signed apply: {r.stderr}")
        r = run(app, "apply", "--base", p("base.safetensors"), "--patch", p("signed.pulse"), "-o", p("s2.safetensors"), "--public-key", p("x.pub"))
        expect(r.returncode != 0 and "signature" in r.stderr and not os.path.exists(p("s2.safetensors")), "a wrong key must be rejected")

        # Relay: versions 1..12, anchors every 4, keep 2.
        relay = p("relay")
        versions = {1: base}
        for v in range(2, 13):
            versions[v] = step(rng, versions[v - 1], 0.01)
        for v in range(1, 13):
            safetensors_ref.write(p(f"v{v}.safetensors"), versions[v])
            args = ["publish", "--relay", relay, "--version", v, p(f"v{v}.safetensors"), "--anchor-every", 4, "--keep-anchors", 2]
            if v > 1:
                args += ["--previous", p(f"v{v - 1}.safetensors")]
            r = run(app, *args)
            expect(r.returncode == 0, f"publish {v}: {r.stderr}")
        anchors = sorted(f for f in os.listdir(relay) if f.startswith("anchor-"))
        expect(anchors == ["anchor-12.safetensors", "anchor-8.safetensors"], f"retention keeps the last 2 anchors: {anchors}")
        r = run(app, "pull", "--relay", relay, "-o", p("late.safetensors"))
        expect(r.returncode == 0 and "slow path" in r.stdout and same_tensors(p("late.safetensors"), versions[12]),
               f"late joiner: {r.stdout}{r.stderr}")
        r = run(app, "publish", "--relay", relay, "--version", 12, p("v12.safetensors"))
        expect(r.returncode != 0, "republishing an old version must fail")
        safetensors_ref.write(p("v13.safetensors"), step(rng, versions[12], 0.01))
        run(app, "publish", "--relay", relay, "--version", 13, p("v13.safetensors"), "--previous", p("v12.safetensors"), "--anchor-every", 4)
        r = run(app, "pull", "--relay", relay, "-o", p("fast.safetensors"), "--have", p("v12.safetensors"), "--have-version", 12)
        v13 = [(n, dt, a) for n, (dt, a) in safetensors_ref.read(p("v13.safetensors"))[0].items()]
        expect(r.returncode == 0 and "fast path, 1 patches" in r.stdout and same_tensors(p("fast.safetensors"), v13),
               f"fast path: {r.stdout}{r.stderr}")

        # zstd-compressed anchors: the same chain, anchors as .safetensors.zst.
        zrelay = p("zrelay")
        for v in range(1, 7):
            args = ["publish", "--relay", zrelay, "--version", v, p(f"v{v}.safetensors"), "--anchor-every", 3, "--compress-anchors"]
            if v > 1:
                args += ["--previous", p(f"v{v - 1}.safetensors")]
            r = run(app, *args)
            expect(r.returncode == 0, f"publish {v} with compressed anchors: {r.stderr}")
        zanchors = sorted(f for f in os.listdir(zrelay) if f.startswith("anchor-"))
        expect(zanchors == ["anchor-3.safetensors.zst", "anchor-6.safetensors.zst"], f"compressed anchors: {zanchors}")
        r = run(app, "pull", "--relay", zrelay, "-o", p("zlate.safetensors"))
        expect(r.returncode == 0 and same_tensors(p("zlate.safetensors"), versions[6]), f"pull from compressed anchors: {r.stderr}")

        # Publishers killed at random points never leave a partial version visible.
        random.seed(3)
        current = 13
        latest = {13: p("v13.safetensors")}
        for attempt in range(25):
            nxt = current + 1
            path = p(f"k{nxt}.safetensors")
            safetensors_ref.write(path, step(rng, [(n, dt, a) for n, (dt, a) in safetensors_ref.read(latest[current])[0].items()], 0.02))
            proc = subprocess.Popen([app, "publish", "--relay", relay, "--version", str(nxt), path, "--previous", latest[current],
                                     "--anchor-every", "3", "--keep-anchors", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(random.uniform(0, 0.03))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            head = open(os.path.join(relay, "HEAD")).read().split()
            head_version = int(head[1])
            expect(head_version in (current, nxt), f"HEAD names version {head_version}")
            if head_version == nxt:
                latest[nxt] = path
                current = nxt
            r = run(app, "pull", "--relay", relay, "-o", p("reader.safetensors"))
            expect(r.returncode == 0, f"a reader after a killed publisher must reach HEAD: {r.stderr}")
            expect(run(app, "verify", p("reader.safetensors"), "--digest", head[2]).returncode == 0, "reader's weights must match HEAD")
            leftovers = [f for f in os.listdir(relay) if ".tmp." in f]
            for f in leftovers:  # a killed writer leaves its temporary file; readers never look at it
                os.remove(os.path.join(relay, f))
        print(f"relay: {current - 13} of 25 killed publishes completed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
