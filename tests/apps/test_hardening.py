"""Issue 27's attacks and operator mistakes, each as it was found, against the apps: special files
(FIFOs, devices) refused in one line without blocking; tree walks that stay in the folder; the
Hugging Face cache layout (files are symlinks into ../blobs) read through its links and written as
real files; outputs that are inputs, relays or other folders refused; key files kept when keygen
fails; killed writers' temporary files removed by the next writer; signed relays bound to their
relay and model; clear errors (non-UTF-8 paths with --json).
    test_hardening.py --sync build/apps/pulse-sync --measure build/apps/pulse-measure
"""
import argparse
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_ref as st  # noqa: E402

from expect import expect, failures  # noqa: E402

# A blocked open would hang: every command gets this long, far more than any of them needs.
TIMEOUT = 60


def run(*args, timeout=TIMEOUT, env=None):
    try:
        return subprocess.run([str(a) if not isinstance(a, bytes) else a for a in args], capture_output=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None


def text(b):
    return b.decode("utf-8", "replace")


def one_line_error(r, *words):
    """Finished (no hang), non-zero, one stderr line holding every word."""
    if r is None:
        return False
    err = text(r.stderr).strip()
    return r.returncode not in (0, -6) and len(err.splitlines()) == 1 and all(w in err for w in words)


def show(r):
    return "timed out (blocked)" if r is None else f"exit {r.returncode}: {text(r.stderr).strip()[:400]}"


def snapshot(folder):
    out = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            out[os.path.relpath(path, folder)] = open(path, "rb").read()
    return out


def bf16(seed, n=4096):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def checkpoint(path, seed, names=("a", "b")):
    st.write(path, [(n, "BF16", bf16(seed + i)) for i, n in enumerate(names)])


def changed(src, dst, seed):
    """dst: src with a few elements of each tensor one ulp away."""
    tensors, metadata = st.read(src)
    rng = np.random.default_rng(seed)
    out = []
    for name, (dtype, array) in tensors.items():
        a = array.copy()
        a[rng.choice(a.size, 8, replace=False)] ^= 1
        out.append((name, dtype, a))
    st.write(dst, out, metadata)


def hf_folder(folder, seed):
    os.makedirs(folder)
    checkpoint(os.path.join(folder, "model.safetensors"), seed)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"hidden_size": 64, "seed": seed}, f)


# ---- class 3: special files and tree walks ----

def check_special_files(sync, measure, d):
    p = lambda *n: os.path.join(d, *n)  # noqa: E731
    checkpoint(p("a.safetensors"), 1)
    changed(p("a.safetensors"), p("b.safetensors"), 2)
    r = run(sync, "encode", "--base", p("a.safetensors"), "--target", p("b.safetensors"), "-o", p("ab.pulse"))
    expect(r.returncode == 0, f"encode: {show(r)}")
    os.mkfifo(p("fifo.safetensors"))
    os.mkfifo(p("fifo.pulse"))
    os.mkfifo(p("fifo.key"))
    fifo = p("fifo.safetensors")
    cases = {
        "verify FIFO": (sync, "verify", fifo),
        "diff FIFO B": (sync, "diff", fifo, p("b.safetensors")),
        "encode --base FIFO": (sync, "encode", "--base", fifo, "--target", p("b.safetensors"), "-o", p("x.pulse")),
        "apply --base FIFO": (sync, "apply", "--base", fifo, "--patch", p("ab.pulse"), "-o", p("x.safetensors")),
        "apply --patch FIFO": (sync, "apply", "--base", p("a.safetensors"), "--patch", p("fifo.pulse"), "-o",
                               p("x.safetensors")),
        "inspect FIFO": (sync, "inspect", p("fifo.pulse")),
        "publish FIFO": (sync, "publish", "--relay", p("relay"), "--version", "0", fifo),
        "publish --sign FIFO": (sync, "publish", "--relay", p("relay"), "--version", "0", p("a.safetensors"),
                                "--sign", p("fifo.key")),
        "pulse-measure FIFO": (measure, "--out", p("m.h5"), p("a.safetensors"), fifo),
        "verify /dev/zero": (sync, "verify", "/dev/zero"),
    }
    for what, args in cases.items():
        r = run(*args)
        expect(one_line_error(r, "not a regular file"), f"{what}: refused in one line without blocking: {show(r)}")
    expect(not os.path.exists(p("relay", "HEAD")), "a refused publish publishes nothing")
    expect(not os.path.exists(p("m.h5")), "a refused pulse-measure leaves no statistics file")

    # A FIFO inside a model folder (where config.json would be) is refused, not skipped or read.
    hf_folder(p("folder"), 3)
    os.mkfifo(p("folder", "tokenizer.json"))
    r = run(sync, "verify", p("folder"))
    expect(one_line_error(r, "tokenizer.json", "not a regular file"), f"verify a folder holding a FIFO: {show(r)}")

    # A relay whose anchor or HEAD is a FIFO: the pull ends with one line, it does not hang.
    r = run(sync, "publish", "--relay", p("relay2"), "--version", "0", p("a.safetensors"))
    expect(r.returncode == 0, f"publish: {show(r)}")
    os.remove(p("relay2", "anchor-0.safetensors"))
    os.mkfifo(p("relay2", "anchor-0.safetensors"))
    r = run(sync, "pull", "--relay", p("relay2"), "-o", p("pulled.safetensors"))  # a FIFO is not the relay's anchor
    expect(one_line_error(r, "no anchor"), f"pull with a FIFO anchor: {show(r)}")
    os.remove(p("relay2", "HEAD"))
    os.mkfifo(p("relay2", "HEAD"))
    r = run(sync, "pull", "--relay", p("relay2"), "-o", p("pulled.safetensors"))
    expect(one_line_error(r, "HEAD", "not a regular file"), f"pull with a FIFO HEAD: {show(r)}")


def check_tree_walks(sync, d):
    p = lambda *n: os.path.join(d, *n)  # noqa: E731
    hf_folder(p("model"), 4)
    os.makedirs(p("outside"))
    with open(p("outside", "secret.txt"), "w") as f:
        f.write("not part of the model")
    # A symlink to a folder outside (here: to its parent, a loop) is not followed: refused in one line.
    os.symlink(p("outside"), p("model", "linked"))
    r = run(sync, "verify", p("model"))
    expect(one_line_error(r, "linked", "symbolic link to a folder"), f"verify a folder with a folder symlink: {show(r)}")
    os.remove(p("model", "linked"))
    os.symlink("..", p("model", "loop"))
    r = run(sync, "verify", p("model"))
    expect(one_line_error(r, "loop", "symbolic link to a folder"), f"verify a folder with a symlink loop: {show(r)}")
    os.remove(p("model", "loop"))
    # A folder that holds no .safetensors at its top level is refused before its subfolders are
    # walked (`--init /tmp`): here a walk that followed links would loop through sub/up.
    deep = p("deep")
    os.makedirs(os.path.join(deep, "sub"))
    os.symlink(os.path.join("..", ".."), os.path.join(deep, "sub", "up"))
    r = run(sync, "verify", deep)
    expect(one_line_error(r, "holds no .safetensors"), f"verify a folder without a checkpoint: {show(r)}")


def check_hf_cache(sync, d):
    """models--org--name/{blobs/<hash>, snapshots/<rev>/<file> -> ../../blobs/<hash>}: read through the
    links, carried under the link names, written as real files."""
    p = lambda *n: os.path.join(d, *n)  # noqa: E731
    repo = p("models--org--tiny")
    os.makedirs(os.path.join(repo, "blobs"))
    snap = os.path.join(repo, "snapshots", "0123abcd")
    os.makedirs(os.path.join(snap, "tokenizer"))
    hf_folder(p("plain"), 5)
    with open(p("plain", "tokenizer.json"), "w") as f:
        f.write('{"vocab": 1}')
    files = {"model.safetensors": "b1", "config.json": "b2", "tokenizer.json": "b3"}
    for name, blob in files.items():
        shutil.copy(p("plain", name), os.path.join(repo, "blobs", blob))
        os.symlink(os.path.join("..", "..", "blobs", blob), os.path.join(snap, name))
    shutil.copy(p("plain", "config.json"), os.path.join(repo, "blobs", "b4"))
    os.symlink(os.path.join("..", "..", "..", "blobs", "b4"), os.path.join(snap, "tokenizer", "special.json"))
    os.makedirs(p("plain", "tokenizer"))
    shutil.copy(p("plain", "config.json"), p("plain", "tokenizer", "special.json"))

    def digest(path):
        r = run(sync, "verify", path, "--json")
        return json.loads(text(r.stdout))["state_digest"] if r is not None and r.returncode == 0 else None

    expect(digest(snap) is not None and digest(snap) == digest(p("plain")),
           "a cache snapshot has the digest of the same folder with real files")
    r = run(sync, "publish", "--relay", p("relay"), "--version", "0", snap)
    expect(r.returncode == 0, f"publish a cache snapshot: {show(r)}")
    r = run(sync, "pull", "--relay", p("relay"), "-o", p("pulled"))
    expect(r.returncode == 0, f"pull a published cache snapshot: {show(r)}")
    if r.returncode == 0:
        got, want = snapshot(p("pulled")), snapshot(p("plain"))
        expect(sorted(got) == sorted(want), f"pulled: the link names {sorted(got)}")
        expect(all(got[n] == want[n] for n in want if not n.endswith(".safetensors")) and
               digest(p("pulled")) == digest(p("plain")), "pulled: the files' bytes and the tensors")
        links = [n for n in snapshot(p("pulled")) if os.path.islink(p("pulled", n))]
        expect(not links, f"pulled files are real files: {links}")
    # A patch between two snapshots applies to the snapshot and writes real files.
    snap2 = os.path.join(repo, "snapshots", "4567ef01")
    shutil.copytree(snap, snap2, symlinks=True)
    os.remove(os.path.join(snap2, "model.safetensors"))
    changed(p("plain", "model.safetensors"), os.path.join(repo, "blobs", "b5"), 6)
    os.symlink(os.path.join("..", "..", "blobs", "b5"), os.path.join(snap2, "model.safetensors"))
    r = run(sync, "encode", "--base", snap, "--target", snap2, "-o", p("snap.pulse"))
    expect(r.returncode == 0, f"encode between snapshots: {show(r)}")
    r = run(sync, "apply", "--base", snap, "--patch", p("snap.pulse"), "-o", p("applied"))
    expect(r.returncode == 0 and digest(p("applied")) == digest(snap2), f"apply to a snapshot: {show(r)}")


# ---- class 4: operator mistakes that delete data ----

def check_outputs_over_inputs(sync, measure, d):
    p = lambda *n: os.path.join(d, *n)  # noqa: E731
    checkpoint(p("a.safetensors"), 7)
    changed(p("a.safetensors"), p("b.safetensors"), 8)
    before = snapshot(d)
    r = run(measure, "--overwrite", "--out", p("b.safetensors"), p("a.safetensors"), p("b.safetensors"))
    expect(one_line_error(r, "is the input"), f"pulse-measure --overwrite --out naming an input: {show(r)}")
    r = run(sync, "encode", "--base", p("a.safetensors"), "--target", p("b.safetensors"), "-o", p("a.safetensors"))
    expect(one_line_error(r, "is the input"), f"encode -o naming its base: {show(r)}")
    expect(snapshot(d) == before, "refused outputs change nothing")

    # A relay pulled into itself, into a folder holding other files, into an HF folder whose
    # config the relay's single-file state lacks: refused, everything kept; --replace says so.
    r = run(sync, "publish", "--relay", p("relay"), "--version", "0", p("a.safetensors"))
    expect(r.returncode == 0, f"publish: {show(r)}")
    hf_folder(p("hf"), 9)
    os.makedirs(p("home"))
    checkpoint(p("home", "x.safetensors"), 10)
    with open(p("home", "notes.txt"), "w") as f:
        f.write("my notes")
    before = snapshot(d)
    for out, words in [(p("relay"), ("is the input",)), (p("hf"), ("config.json", "would be deleted")),
                       (p("home"), ("notes.txt", "would be deleted"))]:
        r = run(sync, "pull", "--relay", p("relay"), "-o", out)
        expect(one_line_error(r, *words), f"pull -o {os.path.basename(out)}: {show(r)}")
        expect(snapshot(d) == before, f"pull -o {os.path.basename(out)} refused: nothing changed")
    r = run(sync, "apply", "--base", p("a.safetensors"), "--patch", p("relay", "HEAD"), "-o", p("relay"))
    expect(one_line_error(r, "holds the input"), f"apply -o a folder holding its patch: {show(r)}")
    r = run(sync, "pull", "--relay", p("relay"), "-o", p("home"), "--replace")
    expect(r.returncode == 0 and not os.path.exists(p("home", "notes.txt")), f"pull --replace: {show(r)}")
    # The receiver's own folder is updated in place: its files are the new state's to drop.
    r = run(sync, "pull", "--relay", p("relay"), "--have", p("home"), "-o", p("home"))
    expect(one_line_error(r, "--have-version"), f"pull --have without --have-version: {show(r)}")
    r = run(sync, "pull", "--relay", p("relay"), "--have", p("home"), "--have-version", "0", "-o", p("home"))
    expect(r.returncode == 0, f"pull --have DIR -o DIR: {show(r)}")


def check_keygen_keeps_keys(sync, d):
    p = lambda *n: os.path.join(d, *n)  # noqa: E731
    r = run(sync, "keygen", "--public", p("k.pub"), "--secret", p("k.sec"))
    expect(r.returncode == 0, f"keygen: {show(r)}")
    before = snapshot(d)
    r = run(sync, "keygen", "--force", "--public", p("missing", "k.pub"), "--secret", p("k.sec"))
    expect(one_line_error(r, "k.pub"), f"keygen --force with an unwritable --public: {show(r)}")
    expect(snapshot(d) == before, "keygen that fails keeps the existing secret key (and leaves no temporary file)")
    r = run(sync, "keygen", "--force", "--public", p("k.pub"), "--secret", p("k.sec"))
    after = snapshot(d)
    expect(r.returncode == 0 and after["k.sec"] != before["k.sec"] and sorted(after) == sorted(before),
           f"keygen --force replaces both: {show(r)}")
    expect(stat.S_IMODE(os.stat(p("k.sec")).st_mode) == 0o600, "the secret key is mode 0600")
    # A secret key others can read is used, with a warning.
    checkpoint(p("a.safetensors"), 14)
    os.chmod(p("k.sec"), 0o644)
    r = run(sync, "publish", "--relay", p("relay"), "--version", "0", p("a.safetensors"), "--sign", p("k.sec"))
    expect(r.returncode == 0 and "readable by other users" in text(r.stderr), f"a world-readable secret key: {show(r)}")
    # Group-readable is warned of too, in one line naming the file and its mode; 0600 is not.
    checkpoint(p("b.safetensors"), 15)
    for mode, warned in ((0o640, True), (0o600, False)):
        os.chmod(p("k.sec"), mode)
        r = run(sync, "encode", "--base", p("a.safetensors"), "--target", p("b.safetensors"), "-o", p("ab-signed.pulse"),
                "--sign", p("k.sec"))
        lines = text(r.stderr).strip().splitlines()
        expect(r.returncode == 0 and os.path.exists(p("ab-signed.pulse")), f"encode --sign, key mode {mode:o}: {show(r)}")
        expect((lines == [f"pulse: warning: secret key {p('k.sec')} is readable by other users (mode {mode:04o}); "
                          "chmod 600 it"]) if warned else lines == [],
               f"encode --sign, key mode {mode:o}: stderr {lines}")
        os.remove(p("ab-signed.pulse"))


def check_killed_writers(sync, d):
    """A killed writer's FILE.tmp.XXXXXX (as large as the file) goes at the next write of FILE; a
    live writer's (locked) stays."""
    import fcntl
    p = lambda *n: os.path.join(d, *n)  # noqa: E731
    checkpoint(p("a.safetensors"), 11)
    changed(p("a.safetensors"), p("b.safetensors"), 12)
    r = run(sync, "encode", "--base", p("a.safetensors"), "--target", p("b.safetensors"), "-o", p("ab.pulse"))
    expect(r.returncode == 0, f"encode: {show(r)}")
    shutil.copy(p("a.safetensors"), p("a.safetensors.tmp.Kill3d"))  # what a SIGKILLed apply leaves
    live = open(p("a.safetensors.tmp.Live42"), "wb")
    fcntl.flock(live, fcntl.LOCK_EX)
    r = run(sync, "apply", "--in-place", p("a.safetensors"), "--patch", p("ab.pulse"))
    expect(r.returncode == 0, f"apply --in-place: {show(r)}")
    expect(not os.path.exists(p("a.safetensors.tmp.Kill3d")), "the killed writer's temporary file is removed")
    expect(os.path.exists(p("a.safetensors.tmp.Live42")), "a live writer's temporary file stays")
    live.close()
    # The same where a real kill happens: an apply SIGKILLed while writing, then a rerun.
    big = p("big.safetensors")
    st.write(big, [("w", "BF16", bf16(13, 32 << 20))])
    st.write(p("big2.safetensors"), [("w", "BF16", bf16(13, 32 << 20) ^ 1)])
    r = run(sync, "encode", "--base", big, "--target", p("big2.safetensors"), "-o", p("big.pulse"))
    expect(r.returncode == 0, f"encode big: {show(r)}")
    kills = 0
    for _ in range(5):
        proc = subprocess.Popen([sync, "apply", "--in-place", big, "--patch", p("big.pulse"), "--threads", "1"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while proc.poll() is None and not [n for n in os.listdir(d) if n.startswith("big.safetensors.tmp.")]:
            pass
        proc.kill()
        proc.wait()
        kills += proc.returncode == -9
    left = [n for n in os.listdir(d) if n.startswith("big.safetensors.tmp.")]
    r = run(sync, "apply", "--in-place", p("a.safetensors"), "--patch", p("ab.pulse"))  # another file: its own leftovers only
    expect(sorted(n for n in os.listdir(d) if n.startswith("big.safetensors.tmp.")) == sorted(left),
           "a writer removes the leftovers of its own path only")
    st.write(big, [("w", "BF16", bf16(13, 32 << 20))])  # the base again (a kill after the rename moved it on)
    r = run(sync, "apply", "--in-place", big, "--patch", p("big.pulse"))
    expect(r.returncode == 0, f"apply after the kills: {show(r)}")
    left_after = [n for n in os.listdir(d) if n.startswith("big.safetensors.tmp.")]
    print(f"killed writers: {kills} SIGKILLs left {len(left)} temporary files; the next apply left {len(left_after)}")
    expect(not left_after, f"the next apply removes every killed writer's temporary file: {left_after}")


# ---- class 1: signed records bind the relay and the model ----

def check_signed_relays(sync, d):
    p = lambda *n: os.path.join(d, *n)  # noqa: E731
    r = run(sync, "keygen", "--public", p("k.pub"), "--secret", p("k.sec"))
    r2 = run(sync, "keygen", "--public", p("o.pub"), "--secret", p("o.sec"))
    expect(r.returncode == 0 and r2.returncode == 0, f"keygen: {show(r)}")
    # Relay A: model a (tensors a, b) versions 0..4; relay B: model c (tensors c, d) 0..6; one key.
    for relay, names, last in (("A", ("a", "b"), 4), ("B", ("c", "d"), 6)):
        checkpoint(p(f"{relay}0.safetensors"), 20, names)
        for v in range(last + 1):
            if v:
                changed(p(f"{relay}{v - 1}.safetensors"), p(f"{relay}{v}.safetensors"), 20 + v)
            prev = ["--previous", p(f"{relay}{v - 1}.safetensors")] if v else []
            r = run(sync, "publish", "--relay", p(relay), "--version", v, p(f"{relay}{v}.safetensors"),
                    "--sign", p("k.sec"), "--anchor-every", "3", *prev)
            expect(r.returncode == 0, f"publish {relay} {v}: {show(r)}")
    keyed = ("--public-key", p("k.pub"))
    have = ("--have", p("A4.safetensors"), "--have-version", "4")
    # Publishing unsigned, or with another key, into the signed relay: refused, HEAD stays.
    head = open(p("A", "HEAD"), "rb").read()
    r = run(sync, "publish", "--relay", p("A"), "--version", "5", p("A4.safetensors"))
    expect(one_line_error(r, "is signed"), f"publish unsigned into a signed relay: {show(r)}")
    r = run(sync, "publish", "--relay", p("A"), "--version", "5", p("A4.safetensors"), "--sign", p("o.sec"))
    expect(one_line_error(r, "another key"), f"publish with another key: {show(r)}")
    expect(open(p("A", "HEAD"), "rb").read() == head, "refused publishes leave HEAD")
    # B's files copied over A's: the records left of A name another relay.
    shutil.copytree(p("A"), p("A+B"))
    for name in os.listdir(p("B")):
        shutil.copy(p("B", name), p("A+B", name))
    r = run(sync, "pull", "--relay", p("A+B"), *have, *keyed, "-o", p("out.safetensors"))
    expect(one_line_error(r, "not all its own"), f"pull from A with B's files copied in: {show(r)}")
    # A replaced by B whole: the receiver's model has no patch chain to B's.
    r = run(sync, "pull", "--relay", p("B"), *have, *keyed, "-o", p("out.safetensors"))
    expect(one_line_error(r, "another tensor layout"), f"pull another model with --have: {show(r)}")
    expect(not os.path.exists(p("out.safetensors")), "refused pulls write nothing")
    # A rollback (an old signed HEAD put back) is refused by the version the receiver holds.
    shutil.copytree(p("A"), p("A-old"))
    r = run(sync, "pull", "--relay", p("A"), *keyed, "-o", p("A-now.safetensors"))
    expect(r.returncode == 0, f"pull A: {show(r)}")
    r = run(sync, "pull", "--relay", p("A"), "--have", p("A-now.safetensors"), "--have-version", "5", *keyed,
            "-o", p("out.safetensors"))
    expect(one_line_error(r, "refusing to move back"), f"pull an older HEAD: {show(r)}")
    # An unsigned anchor record in a signed relay: the relay is refused, not partly trusted.
    record = [n for n in os.listdir(p("A")) if n.endswith(".record")][0]
    text = open(p("A", record)).read()
    with open(p("A", record), "w") as f:
        f.write(text[:text.index("signature ")])
    r = run(sync, "pull", "--relay", p("A"), *have, *keyed, "-o", p("out.safetensors"))
    expect(one_line_error(r, "not all its own", "not signed"), f"pull a relay with an unsigned record: {show(r)}")


# ---- class 7: clear errors ----

def check_json_non_utf8_paths(sync, d):
    """A path that is not UTF-8 (Linux allows any bytes) in --json output: replaced, not an abort."""
    p = lambda *n: os.path.join(d, *n)  # noqa: E731
    checkpoint(p("a.safetensors"), 30)
    changed(p("a.safetensors"), p("b.safetensors"), 31)
    odd = os.fsencode(d) + b"/caf\xe9.pulse"
    for args in [(sync, "encode", "--base", p("a.safetensors"), "--target", p("b.safetensors"), "-o", odd, "--json"),
                 (sync, "inspect", odd, "--json"),
                 (sync, "apply", "--base", p("a.safetensors"), "--patch", odd, "-o", os.fsencode(d) + b"/\xff.st",
                  "--json")]:
        r = run(*args)
        ok = r is not None and r.returncode == 0
        if ok:
            line = json.loads(text(r.stdout).strip().splitlines()[-1])
            ok = isinstance(line, dict)
        expect(ok, f"{text(args[1].encode() if isinstance(args[1], str) else args[1])} --json with a non-UTF-8 path: "
                   f"{show(r)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sync", required=True)
    ap.add_argument("--measure", required=True)
    a = ap.parse_args()
    checks = [("special files", lambda d: check_special_files(a.sync, a.measure, d)),
              ("tree walks", lambda d: check_tree_walks(a.sync, d)),
              ("Hugging Face cache layout", lambda d: check_hf_cache(a.sync, d)),
              ("outputs over inputs", lambda d: check_outputs_over_inputs(a.sync, a.measure, d)),
              ("keygen keeps keys", lambda d: check_keygen_keeps_keys(a.sync, d)),
              ("killed writers", lambda d: check_killed_writers(a.sync, d)),
              ("signed relays", lambda d: check_signed_relays(a.sync, d)),
              ("--json with non-UTF-8 paths", lambda d: check_json_non_utf8_paths(a.sync, d))]
    for name, check in checks:
        with tempfile.TemporaryDirectory() as d:
            before = len(failures)
            check(d)
            print(f"{name}: {'ok' if len(failures) == before else 'FAILED'}", flush=True)
    if failures:
        print(f"{len(failures)} failures")
        return 1
    print("all hardening checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
