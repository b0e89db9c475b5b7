"""pulse-sync end to end on safetensors files: diff, encode/apply round trips for every coding,
verify, inspect, signatures, rejection of corrupt patches with outputs absent or unchanged, and
the relay: late joiners, the fast path, and publishers killed at random points.
    test_pulse_sync.py --app build/apps/pulse-sync
"""
import argparse
import json
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

from expect import expect, failures  # noqa: E402


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


def run_limited(app, *args, timeout=30, address_space=None, file_size=None):
    """run() under a timeout and optional limits: a hang or a runaway allocation is a failure."""
    def limits():
        import resource
        if address_space:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
        if file_size is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG, like a full disk
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
    try:
        return subprocess.run([app, *map(str, args)], capture_output=True, text=True, timeout=timeout, preexec_fn=limits)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, -1, "", f"timed out after {timeout} s")


def one_line_error(r):
    return r.returncode not in (0, -1) and len(r.stderr.strip().splitlines()) == 1


def publish_chain(app, relay, paths, *extra, first=1):
    for v in range(first, first + len(paths)):
        args = ["publish", "--relay", relay, "--version", v, paths[v - first], *extra]
        if v > first:
            args += ["--previous", paths[v - first - 1]]
        r = run(app, *args)
        expect(r.returncode == 0, f"publish {v} to {relay}: {r.stderr}")


def hardening(app, p, rng, versions):
    """Issue 12: signed relay state, exact relay names, fallbacks, the publish lock, temporary
    files, bounded reads, keys, and command-line checks."""
    chain = [p(f"v{v}.safetensors") for v in range(1, 6)]

    # Signed relay: HEAD, anchor records and patches signed; a reader with the key accepts
    # nothing else, never moves back, and falls back to an older anchor when one is bad.
    for name in ("t", "evil"):
        r = run(app, "keygen", "--public", p(f"{name}.pub"), "--secret", p(f"{name}.sec"))
        expect(r.returncode == 0, f"keygen {name}: {r.stderr}")
    signed = p("signed-relay")
    publish_chain(app, signed, chain, "--anchor-every", 2, "--keep-anchors", 2, "--sign", p("t.sec"))
    head5 = open(os.path.join(signed, "HEAD"), "rb").read()
    r = run(app, "pull", "--relay", signed, "-o", p("sp.safetensors"), "--public-key", p("t.pub"))
    expect(r.returncode == 0 and same_tensors(p("sp.safetensors"), versions[5]), f"signed pull: {r.stdout}{r.stderr}")
    fake = step(rng, versions[5], 0.5)
    safetensors_ref.write(p("fake.safetensors"), fake)
    for attacker_key in (None, "evil.sec"):
        evil = p(f"evil-relay-{attacker_key}")
        extra = ["--sign", p(attacker_key)] if attacker_key else []
        r = run(app, "publish", "--relay", evil, "--version", 6, p("fake.safetensors"), *extra)
        expect(r.returncode == 0, f"attacker publish: {r.stderr}")
        for f in os.listdir(evil):
            if f != "publish.lock":
                open(os.path.join(signed, f), "wb").write(open(os.path.join(evil, f), "rb").read())
        r = run(app, "pull", "--relay", signed, "-o", p("attacked.safetensors"), "--public-key", p("t.pub"))
        expect(one_line_error(r) and not os.path.exists(p("attacked.safetensors")),
               f"a HEAD and anchor not signed by the key must be refused ({attacker_key}): rc={r.returncode} {r.stdout}{r.stderr}")
        os.remove(os.path.join(signed, "anchor-6.safetensors"))
        os.remove(os.path.join(signed, "anchor-6.record")) if os.path.exists(os.path.join(signed, "anchor-6.record")) else None
        open(os.path.join(signed, "HEAD"), "wb").write(head5)
    # A replaced anchor (its signed record kept): the reader falls back to the older anchor.
    open(os.path.join(signed, "anchor-4.safetensors"), "wb").write(open(p("fake.safetensors"), "rb").read())
    r = run(app, "pull", "--relay", signed, "-o", p("fb.safetensors"), "--public-key", p("t.pub"))
    expect(r.returncode == 0 and same_tensors(p("fb.safetensors"), versions[5]) and "anchor 4" in r.stderr,
           f"a bad newest anchor must fall back to the older one: {r.stdout}{r.stderr}")
    # Rollback: an older HEAD, validly signed, is refused by a reader that holds a newer version.
    old = p("old-signed-relay")
    publish_chain(app, old, chain[:3], "--sign", p("t.sec"))
    open(os.path.join(signed, "HEAD"), "wb").write(open(os.path.join(old, "HEAD"), "rb").read())
    r = run(app, "pull", "--relay", signed, "-o", p("rb.safetensors"), "--public-key", p("t.pub"),
            "--have", chain[4], "--have-version", 5)
    expect(one_line_error(r) and "older" in r.stderr and not os.path.exists(p("rb.safetensors")),
           f"--have-version must refuse a rollback: {r.stderr}")
    r = run(app, "pull", "--relay", signed, "-o", p("rb.safetensors"), "--public-key", p("t.pub"), "--min-version", 4)
    expect(one_line_error(r) and "older" in r.stderr, f"--min-version must refuse a rollback: {r.stderr}")
    open(os.path.join(signed, "HEAD"), "wb").write(head5)
    # Unsigned relays keep working without a key; with a key they are refused.
    r = run(app, "pull", "--relay", old, "-o", p("u.safetensors"))
    expect(r.returncode == 0, f"a signed relay read without a key: {r.stderr}")

    # Exact names: stray files are neither read nor deleted.
    g = p("grammar-relay")
    os.makedirs(g)
    strays = ["anchor--3.safetensors", "patch-1-2.pulse.bak", "anchor-0002.safetensors", "notes.txt", "HEAD.tmp.keep"]
    for f in strays:
        open(os.path.join(g, f), "wb").write(open(chain[0], "rb").read())
    publish_chain(app, g, chain[:4], "--anchor-every", 2, "--keep-anchors", 2)
    expect(all(os.path.exists(os.path.join(g, f)) for f in strays), f"stray files must be kept: {sorted(os.listdir(g))}")
    expect({"anchor-2.safetensors", "anchor-4.safetensors", "patch-2-3.pulse", "patch-3-4.pulse"} <= set(os.listdir(g))
           and "anchor-1.safetensors" not in os.listdir(g) and "patch-1-2.pulse" not in os.listdir(g),
           f"retention by exact names: {sorted(os.listdir(g))}")
    r = run(app, "pull", "--relay", g, "-o", p("g.safetensors"))
    expect(r.returncode == 0 and same_tensors(p("g.safetensors"), versions[4]), f"pull past stray files: {r.stderr}")
    # Fast path failing (a corrupt patch) -> slow path.
    patch = os.path.join(g, "patch-3-4.pulse")
    expect(os.path.exists(patch), "retention must keep the patch after the kept anchor")
    data = bytearray(open(patch, "rb").read() if os.path.exists(patch) else b"")
    if data:
        data[len(data) // 2] ^= 0x40
    open(patch, "wb").write(bytes(data))
    r = run(app, "pull", "--relay", g, "-o", p("g2.safetensors"), "--have", chain[2], "--have-version", 3)
    expect(r.returncode == 0 and "slow path" in r.stdout and same_tensors(p("g2.safetensors"), versions[4]),
           f"a failing fast path must fall back to the slow path: {r.stdout}{r.stderr}")

    # The publish lock: a live holder makes a second publisher fail in one line, HEAD unchanged;
    # a dead holder's lock is broken.
    holder = subprocess.Popen(["sleep", "60"])
    open(os.path.join(g, "publish.lock"), "w").write(f"host {os.uname().nodename}\npid {holder.pid}\ntoken 1\n")
    head_before = open(os.path.join(g, "HEAD"), "rb").read()
    r = run(app, "publish", "--relay", g, "--version", 5, chain[4], "--previous", chain[3])
    expect(one_line_error(r) and "publish" in r.stderr and open(os.path.join(g, "HEAD"), "rb").read() == head_before,
           f"a second publisher must be refused: rc={r.returncode} {r.stderr}")
    holder.kill()
    holder.wait()
    for f in ("HEAD.tmp.a1B2c3", "anchor-5.safetensors.tmp.ZZZZZZ", "anchor-5.safetensors.uncompressed", "mine.tmp.abcdef"):
        open(os.path.join(g, f), "wb").write(b"x")
    r = run(app, "publish", "--relay", g, "--version", 5, chain[4], "--previous", chain[3])
    left = sorted(os.listdir(g))
    expect(r.returncode == 0 and "publish.lock" not in left, f"a dead holder's lock must be broken: {r.stderr} {left}")
    expect("mine.tmp.abcdef" in left and "HEAD.tmp.keep" in left and not any(
        f in left for f in ("HEAD.tmp.a1B2c3", "anchor-5.safetensors.tmp.ZZZZZZ", "anchor-5.safetensors.uncompressed")),
        f"the next publisher removes exactly the relay's temporary files: {left}")

    # Two publishers at once, ten times: at most one publishes each version, a loser fails in one
    # line, and a reader always reaches exactly HEAD's weights.
    race = p("race-relay")
    publish_chain(app, race, chain[:1])
    for v in range(2, 12):
        procs = []
        for k in range(2):
            path = p(f"race-{v}-{k}.safetensors")
            safetensors_ref.write(path, step(rng, versions[1], 0.3))
            procs.append(subprocess.Popen([app, "publish", "--relay", race, "--version", str(v), path, "--anchor-every", "3"],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        results = [(q.wait(), q.stderr.read()) for q in procs]
        expect(sum(rc == 0 for rc, _ in results) == 1, f"exactly one of two racing publishers wins version {v}: {results}")
        expect(all(rc == 0 or len(err.strip().splitlines()) == 1 for rc, err in results), f"the loser fails in one line: {results}")
        r = run(app, "pull", "--relay", race, "-o", p("race.safetensors"))
        state = dict(line.split(" ", 1) for line in open(os.path.join(race, "HEAD")).read().splitlines()[1:])["state"]
        expect(r.returncode == 0 and run(app, "verify", p("race.safetensors"), "--digest", state).returncode == 0,
               f"after racing publishers a reader reaches HEAD: {r.stderr}")

    # Version flags: canonical decimals in range only.
    for bad in ("-1", "18446744073709551616", "007", "+6", "6x"):
        r = run(app, "publish", "--relay", g, "--version", bad, chain[4])
        expect(r.returncode != 0 and "HEAD" in os.listdir(g) and "anchor-6.safetensors" not in os.listdir(g),
               f"--version {bad} must be refused: {r.stdout}{r.stderr}")
        r = run(app, "encode", "--base", chain[0], "--target", chain[1], "-o", p("vv.pulse"), "--target-version", bad)
        expect(r.returncode != 0 and not os.path.exists(p("vv.pulse")), f"--target-version {bad} must be refused")

    # Bounded, safe reads: FIFOs, devices, lying .zst anchors.
    os.mkfifo(p("fifo.pulse"))
    r = run_limited(app, "inspect", p("fifo.pulse"))
    expect(one_line_error(r) and "FIFO" in r.stderr, f"a FIFO as a patch: {r.stderr}")
    r = run_limited(app, "apply", "--base", chain[0], "--patch", "/dev/zero", "-o", p("z.safetensors"),
                    address_space=4 << 30)
    expect(one_line_error(r) and "regular file" in r.stderr, f"/dev/zero as a patch: {r.stderr}")
    f = p("fifo-relay")
    publish_chain(app, f, chain[:1])
    os.remove(os.path.join(f, "HEAD"))
    os.mkfifo(os.path.join(f, "HEAD"))
    r = run_limited(app, "pull", "--relay", f, "-o", p("f.safetensors"))
    expect(one_line_error(r) and "FIFO" in r.stderr, f"a FIFO as HEAD: {r.stderr}")
    zr = p("zbomb-relay")
    publish_chain(app, zr, chain[:1], "--compress-anchors")
    # 20 bytes: a zstd frame declaring 2 GiB with one 4-byte raw block.
    bomb = bytes.fromhex("28b52ffd") + bytes([0xE0]) + (2 << 30).to_bytes(8, "little") + bytes([0x21, 0, 0]) + b"abcd"
    open(os.path.join(zr, "anchor-1.safetensors.zst"), "wb").write(bomb)
    os.remove(os.path.join(zr, "anchor-1.record")) if os.path.exists(os.path.join(zr, "anchor-1.record")) else None
    r = run_limited(app, "pull", "--relay", zr, "-o", p("zb.safetensors"), address_space=1536 << 20)
    expect(one_line_error(r) and "zstd" in r.stderr and "bad_alloc" not in r.stderr,
           f"a .zst anchor declaring 2 GiB must be refused before allocating it: {r.stderr}")

    # Keys: an existing key kept unless --force, symbolic links refused, a full disk an error.
    sec = open(p("t.sec"), "rb").read()
    r = run(app, "keygen", "--public", p("t.pub"), "--secret", p("t.sec"))
    expect(one_line_error(r) and open(p("t.sec"), "rb").read() == sec, f"an existing key must be kept: {r.stderr}")
    r = run(app, "keygen", "--public", p("t.pub"), "--secret", p("t.sec"), "--force")
    expect(r.returncode == 0 and open(p("t.sec"), "rb").read() != sec and oct(os.stat(p("t.sec")).st_mode & 0o777) == "0o600",
           f"--force replaces the key: {r.stderr}")
    open(p("victim"), "wb").write(b"precious")
    os.symlink(p("victim"), p("link.sec"))
    r = run(app, "keygen", "--public", p("l.pub"), "--secret", p("link.sec"), "--force")
    expect(one_line_error(r) and open(p("victim"), "rb").read() == b"precious" and not os.path.exists(p("l.pub")),
           f"a symbolic link as the secret key must be refused: {r.stderr}")
    r = run_limited(app, "keygen", "--public", p("full.pub"), "--secret", p("full.sec"), file_size=16)
    expect(one_line_error(r) and "wrote" not in r.stdout and not os.path.exists(p("full.sec")),
           f"a full disk must fail keygen: rc={r.returncode} {r.stdout}{r.stderr}")

    # encode -o BASE (or a link to it) is refused and leaves the base as it was.
    base_bytes = open(chain[0], "rb").read()
    os.link(chain[0], p("base-link.safetensors"))
    for out in (chain[0], p("base-link.safetensors"), chain[1]):
        r = run(app, "encode", "--base", chain[0], "--target", chain[1], "-o", out)
        expect(one_line_error(r) and open(chain[0], "rb").read() == base_bytes, f"encode -o {out} must be refused: {r.stderr}")


def json_matches_text(app, p, changed, digest):
    """--json of diff, verify and inspect: one JSON object with the numbers the text prints."""
    r, t = run(app, "diff", p("base.safetensors"), p("target.safetensors"), "--json"), run(app, "diff", p("base.safetensors"), p("target.safetensors"))
    expect(r.returncode == 0 and len(r.stdout.strip().splitlines()) == 1, f"diff --json: one line: {r.stdout}{r.stderr}")
    d = json.loads(r.stdout)
    bf16 = d["totals"]["BF16"]
    expect(bf16["changed"] == changed, f"diff --json BF16 changed {bf16['changed']}, expected {changed}")
    expect(f"total BF16: {bf16['elements']} elements, {bf16['changed']} changed, sparsity {bf16['sparsity_percent']:.4f}%" in t.stdout,
           f"diff --json totals must be the text's: {bf16} vs {t.stdout}")
    for row in d["tensors"]:
        if "elements" in row:
            line = f"{row['name']:<48} {row['dtype']:>8} {row['elements']:>12} {row['changed']:>12} {row['sparsity_percent']:9.4f}%"
            expect(line in t.stdout, f"diff --json row {row} must be a text line")
    expect(d["metadata_changed"] is True and "metadata: changed" in t.stdout, "diff --json: metadata changed")

    r = run(app, "verify", p("target.safetensors"), "--json")
    expect(r.returncode == 0 and json.loads(r.stdout) == {"file": p("target.safetensors"), "state_digest": digest},
           f"verify --json: {r.stdout}{r.stderr}")
    r = run(app, "verify", p("base.safetensors"), "--digest", digest, "--json")
    v = json.loads(r.stdout)
    expect(r.returncode == 1 and v["verified"] is False and v["expected"] == digest and v["state_digest"] != digest,
           f"verify --json of another state: {r.stdout}")

    patch = p("keydiff-gap-varint-zstd.pulse")
    r, t = run(app, "inspect", patch, "--json"), run(app, "inspect", patch).stdout
    i = json.loads(r.stdout)
    bf16 = [row for row in i["summary"] if row["dtype"] == "BF16"]
    expect(r.returncode == 0 and i["bytes"] == os.path.getsize(patch) and bf16 and bf16[0]["changed"] == changed,
           f"inspect --json: {r.stdout}")
    expect(f"versions {i['base_version']} -> {i['target_version']}" in t and f"target state {i['target_state']}" in t
           and f"index {i['streams']['index']['coded']}/{i['streams']['index']['raw']}" in t
           and f"entry table: {i['table_bytes']} bytes for {i['entries']['tensors']} tensors" in t
           and f"changed elements in sparse-coded tensors: {i['total_changed']}" in t
           and i["metadata"] == {"format": "pt", "step": "1"}, f"inspect --json must hold the text's numbers: {i} vs {t}")


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
        json_matches_text(app, p, changed, digest)

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
        anchors = sorted(f for f in os.listdir(relay) if f.startswith("anchor-") and not f.endswith(".record"))
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

        # A file's __metadata__ is part of the state the relay carries: HEAD names the digest
        # verify prints, and a reader gets the metadata by patch and from an anchor.
        mrelay = p("mrelay")
        safetensors_ref.write(p("m1.safetensors"), versions[1], {"format": "pt"})
        safetensors_ref.write(p("m2.safetensors"), versions[2], {"format": "pt", "step": "2"})
        run(app, "publish", "--relay", mrelay, "--version", 1, p("m1.safetensors"))
        r = run(app, "publish", "--relay", mrelay, "--version", 2, p("m2.safetensors"), "--previous", p("m1.safetensors"))
        head = dict(line.split(" ", 1) for line in open(os.path.join(mrelay, "HEAD")).read().splitlines()[1:])
        expect(r.returncode == 0 and head["state"] == run(app, "verify", p("m2.safetensors")).stdout.split()[0],
               f"HEAD's digest includes the metadata: {r.stderr}")
        for extra in ([], ["--have", p("m1.safetensors"), "--have-version", 1]):
            r = run(app, "pull", "--relay", mrelay, "-o", p("m.safetensors"), *extra)
            expect(r.returncode == 0 and safetensors_ref.read(p("m.safetensors"))[1] == {"format": "pt", "step": "2"},
                   f"pull {extra} carries the metadata: {r.stderr}")

        # zstd-compressed anchors: the same chain, anchors as .safetensors.zst.
        zrelay = p("zrelay")
        for v in range(1, 7):
            args = ["publish", "--relay", zrelay, "--version", v, p(f"v{v}.safetensors"), "--anchor-every", 3, "--compress-anchors"]
            if v > 1:
                args += ["--previous", p(f"v{v - 1}.safetensors")]
            r = run(app, *args)
            expect(r.returncode == 0, f"publish {v} with compressed anchors: {r.stderr}")
        zanchors = sorted(f for f in os.listdir(zrelay) if f.startswith("anchor-") and not f.endswith(".record"))
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
            head = dict(line.split(" ", 1) for line in open(os.path.join(relay, "HEAD")).read().splitlines()[1:])
            head_version = int(head["version"])
            expect(head_version in (current, nxt), f"HEAD names version {head_version}")
            if head_version == nxt:
                latest[nxt] = path
                current = nxt
            r = run(app, "pull", "--relay", relay, "-o", p("reader.safetensors"))
            expect(r.returncode == 0, f"a reader after a killed publisher must reach HEAD: {r.stderr}")
            expect(run(app, "verify", p("reader.safetensors"), "--digest", head["state"]).returncode == 0, "reader's weights must match HEAD")
        print(f"relay: {current - 13} of 25 killed publishes completed")
        # The next publisher breaks the killed publisher's lock and removes its temporary files.
        nxt = current + 1
        safetensors_ref.write(p(f"k{nxt}.safetensors"), step(rng, [(n, dt, a) for n, (dt, a) in safetensors_ref.read(latest[current])[0].items()], 0.02))
        r = run(app, "publish", "--relay", relay, "--version", nxt, p(f"k{nxt}.safetensors"), "--previous", latest[current])
        leftovers = [f for f in os.listdir(relay) if ".tmp." in f or f.endswith(".uncompressed") or f == "publish.lock"]
        expect(r.returncode == 0 and not leftovers, f"publish after killed publishers: {r.stderr} leftovers {leftovers}")

        hardening(app, p, rng, versions)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
