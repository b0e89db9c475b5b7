"""pulse-sync on Hugging Face model folders, checked by a pure-Python reader (hf_folder_ref), not
by pulse: encode/apply of a Llama-like folder (BF16, F16, F32) to a target with 1% one-ulp
changes, a metadata change, an added tensor, a changed config.json and 2 -> 3 shards; publish and
pull; bad folders refused in one line with nothing written; a corrupt patch, a failing swap (strace
fault injection), a full disk (a write past the limit, or the preallocation refused) and killed appliers leave the old folder byte for byte, both for
that patch (applied by loading the base) and for one that keeps the layout (streamed shard by
shard: the result is the target's files byte for byte); in place, a shard the patch leaves as it is
is the old file, hard-linked (same inode, one link after), -o copies it.
    test_pulse_sync_folders.py --app build/apps/pulse-sync
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_folder_ref as hf  # noqa: E402

from expect import expect, failures  # noqa: E402


def run(*args, prefix=(), timeout=120, file_size=None):
    def limits():
        if file_size is not None:
            import resource
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG, like a full disk
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
    return subprocess.run([*prefix, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          preexec_fn=limits if file_size is not None else None)


def one_line_error(r):
    return r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1


def snapshot(folder):
    """Every file under folder (names and bytes): 'byte for byte'."""
    out = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            out[os.path.relpath(path, folder)] = open(path, "rb").read()
    return out


def leftovers(parent):
    return [f for f in os.listdir(parent) if ".pulse-new." in f or f.endswith((".pulse-old", ".pulse-swap"))]


def same_folder(a, b):
    """Every tensor (dtype, shape, bytes), every shard's metadata and every other file."""
    return hf.read_folder(a) == hf.read_folder(b)


def make_pair(d, hidden=64, layers=2, vocab=512, intermediate=160):
    base_state = hf.llama_state(hidden, layers, vocab, intermediate, seed=1)
    files = hf.model_files(hidden, layers, vocab, seed=2)
    hf.write_folder(os.path.join(d, "base"), base_state, 2, {"format": "pt"}, files)
    target_state, changed = hf.one_ulp(base_state, 0.01, seed=3)
    target_state["model.layers.0.self_attn.q_norm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
    target_files = dict(files)
    config = json.loads(files["config.json"])
    config["rope_theta"] = 500000.0
    target_files["config.json"] = json.dumps(config, indent=2).encode()
    hf.write_folder(os.path.join(d, "target"), target_state, 3, {"format": "pt", "step": "1"}, target_files)
    return changed


def round_trip(app, p, changed):
    r = run(app, "encode", "--base", p("base"), "--target", p("target"), "-o", p("f.pulse"))
    expect(r.returncode == 0, f"encode folders: {r.stderr}")
    size = os.path.getsize(p("f.pulse"))
    print(f"folder patch: {size} bytes for {changed} one-ulp changes, {8 * size / changed:.2f} bits per change")
    i = json.loads(run(app, "inspect", p("f.pulse"), "--json").stdout)
    expect(i["metadata"] == {"format": "pt", "step": "1"}, f"the shards' common metadata travels: {i.get('metadata')}")
    expect(sorted(t["name"] for t in i["added"]) == ["__file__/config.json", "__file__/model.safetensors.index.json",
                                                      "model.layers.0.self_attn.q_norm.weight"],
           f"added: the new tensor, the changed config and index: {i['added']}")
    sparse = {row["dtype"]: row.get("changed") for row in i["summary"]}
    expect(sum(v for k, v in sparse.items() if k in ("BF16", "F16", "F32")) == changed,
           f"every one-ulp change is coded sparsely: {sparse} vs {changed}")

    shutil.copytree(p("base"), p("work"))
    r = run(app, "apply", "--in-place", p("work"), "--patch", p("f.pulse"))
    expect(r.returncode == 0 and same_folder(p("work"), p("target")), f"apply --in-place onto a copy of the base: {r.stderr}")
    expect(not leftovers(os.path.dirname(p("work"))), f"no leftovers: {leftovers(os.path.dirname(p('work')))}")
    expect(sorted(f for f in os.listdir(p("work")) if f.endswith(".safetensors")) ==
           [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)], "the target's 3 shards, the base's 2 gone")
    r = run(app, "apply", "--base", p("base"), "--patch", p("f.pulse"), "-o", p("out"))
    expect(r.returncode == 0 and same_folder(p("out"), p("target")) and "wrote the folder" in r.stdout,
           f"apply -o a new folder: {r.stdout}{r.stderr}")
    digest = run(app, "verify", p("target")).stdout.split()[0]
    expect(run(app, "verify", p("work"), "--digest", digest).returncode == 0, "verify a folder")
    r = run(app, "diff", p("base"), p("target"), "--json")
    d = json.loads(r.stdout) if r.returncode == 0 else {}
    expect(d.get("metadata_changed") is True and d["totals"]["BF16"]["changed"] + d["totals"]["F16"]["changed"]
           + d["totals"]["F32"]["changed"] == changed, f"diff of folders: {r.stdout[:300]}{r.stderr}")

    # The tensors' digest does not depend on sharding: the target re-sharded into 1 and 5 files
    # (same files, same metadata in every shard) has the target's digest but for the index.
    t, meta, files = hf.read_folder(p("target"))
    state = {n: torch.frombuffer(bytearray(b), dtype={"BF16": torch.bfloat16, "F16": torch.float16,
                                                        "F32": torch.float32}[dt]).reshape(shape)
             for n, (dt, shape, b) in t.items()}
    others = {k: v for k, v in files.items() if k != "model.safetensors.index.json"}
    for shards in (2, 5):
        hf.write_folder(p(f"resharded{shards}"), state, shards, {"format": "pt", "step": "1"}, others)
    r = run(app, "encode", "--base", p("resharded2"), "--target", p("resharded5"), "-o", p("reshard.pulse"))
    i = json.loads(run(app, "inspect", p("reshard.pulse"), "--json").stdout)
    index_bytes = len(open(os.path.join(p("resharded5"), "model.safetensors.index.json"), "rb").read())
    expect(r.returncode == 0 and i["entries"]["whole"] == 1 and not i["added"] and not i["removed"]
           and i["total_changed"] == 0 and "metadata" not in i
           and [s["whole_bytes"] for s in i["summary"] if s["dtype"] == "U8"] == [index_bytes],
           f"re-sharding changes only the index: {i}")
    return digest


def bad_input(app, p):
    """One line naming the file and the problem; no output written."""
    def refused(folder, words, what):
        r = run(app, "encode", "--base", folder, "--target", p("target"), "-o", p("bad.pulse"))
        expect(one_line_error(r) and all(w in r.stderr for w in words) and not os.path.exists(p("bad.pulse")),
               f"{what}: {r.stderr}")
        r = run(app, "verify", folder)
        expect(one_line_error(r), f"verify {what}: {r.stderr}")

    def copy(name):
        shutil.copytree(p("base"), p(name))
        return p(name)

    f = copy("missing-shard")
    os.remove(os.path.join(f, "model-00002-of-00002.safetensors"))
    refused(f, ["model-00002-of-00002.safetensors", "missing"], "a shard named in the index but missing")

    f = copy("twice")
    t, meta, _ = hf.read_folder(f)
    first, _ = hf.read_safetensors(os.path.join(f, "model-00001-of-00002.safetensors"))
    second, m2 = hf.read_safetensors(os.path.join(f, "model-00002-of-00002.safetensors"))
    dup = sorted(first)[0]
    as_torch = lambda dt, shape, b: torch.frombuffer(bytearray(b), dtype={"BF16": torch.bfloat16, "F16": torch.float16,
                                                                            "F32": torch.float32}[dt]).reshape(shape)
    hf.write_safetensors(os.path.join(f, "model-00002-of-00002.safetensors"),
                         [(n, as_torch(*v)) for n, v in second.items()] + [(dup, as_torch(*first[dup]))], m2)
    refused(f, [dup, "also in"], "a tensor in two shards")

    f = copy("both")
    shutil.copy(os.path.join(f, "model-00001-of-00002.safetensors"), os.path.join(f, "model.safetensors"))
    refused(f, ["model.safetensors", "both"], "a folder with both sharded and single files")

    refused(os.path.join(p("base"), "model.safetensors.index.json"), ["index"], "an index given as a checkpoint")
    torch.save({"w": torch.zeros(3)}, p("pytorch_model.bin"))
    refused(p("pytorch_model.bin"), ["pytorch_model.bin", "PyTorch"], "a .bin given as a checkpoint")
    os.makedirs(p("binfolder"))
    shutil.copy(p("pytorch_model.bin"), p("binfolder/pytorch_model.bin"))
    refused(p("binfolder"), ["pytorch_model.bin", "PyTorch"], "a folder of .bin weights")

    f = copy("reserved")
    first, m1 = hf.read_safetensors(os.path.join(f, "model-00001-of-00002.safetensors"))
    hf.write_safetensors(os.path.join(f, "model-00001-of-00002.safetensors"),
                         [(n, as_torch(*v)) for n, v in first.items()] + [("__file__/x", torch.zeros(2))], m1)
    index = json.load(open(os.path.join(f, "model.safetensors.index.json")))
    index["weight_map"]["__file__/x"] = "model-00001-of-00002.safetensors"
    json.dump(index, open(os.path.join(f, "model.safetensors.index.json"), "w"))
    refused(f, ["__file__/x", "reserve"], "a tensor named with the reserved prefix")

    os.makedirs(p("odd-name"))
    hf.write_safetensors(p("odd-name/weights.safetensors"), [("w", torch.zeros(2))], {})
    refused(p("odd-name"), ["weights.safetensors", "model.safetensors"], "an unindexed single file of another name")

    # A patch for another model: refused, the folder untouched.
    hf.write_folder(p("other"), hf.llama_state(32, 1, 64, 48, seed=9), 1, {"format": "pt"}, {"config.json": b"{}"})
    before = snapshot(p("other"))
    r = run(app, "apply", "--in-place", p("other"), "--patch", p("f.pulse"))
    expect(one_line_error(r) and "base" in r.stderr and snapshot(p("other")) == before and not leftovers(p("")),
           f"a patch of another model: {r.stderr}")
    # A folder state is not written into a .safetensors file, nor over a folder holding no model.
    r = run(app, "apply", "--base", p("base"), "--patch", p("f.pulse"), "-o", p("x.safetensors"))
    expect(one_line_error(r) and "folder" in r.stderr and not os.path.exists(p("x.safetensors")),
           f"a folder state into a file: {r.stderr}")
    os.makedirs(p("home"))
    open(p("home/notes.txt"), "w").write("mine")
    r = run(app, "apply", "--base", p("base"), "--patch", p("f.pulse"), "-o", p("home"))
    expect(one_line_error(r) and "refusing" in r.stderr and snapshot(p("home")) == {"notes.txt": b"mine"},
           f"a folder without a model is not replaced: {r.stderr}")


def have_strace():
    """Whether strace is here for the fault injection; a failure where it is not."""
    if shutil.which("strace") is None:
        expect(False, "strace is needed for the fault injection (cmake/debian-deps.sh installs it)")
        return False
    return True


def strace(*inject, calls="renameat,renameat2"):
    """The command prefix that runs an apply under strace with these -e inject= rules on calls."""
    return ["strace", "-f", "-qq", "-o", os.devnull, "-e", f"trace={calls}", *sum((["-e", i] for i in inject), [])]


def failures_leave_old(app, p, target_digest, patch="f.pulse", target="target"):
    """Corrupt patches, failing swaps, a full disk and kills never change the old folder."""
    good = open(p(patch), "rb").read()
    for old in ("victim", "victim2"):
        shutil.rmtree(p(old), ignore_errors=True)
    shutil.copytree(p("base"), p("victim"))
    before = snapshot(p("victim"))
    parent = os.path.dirname(p("victim"))
    for k, bad in enumerate([good[:-1], good[:8] + b"\0" + good[9:],
                             *(good[:i] + bytes([good[i] ^ 0x10]) + good[i + 1:] for i in (20, 140, len(good) // 2, len(good) - 3))]):
        open(p("bad.pulse"), "wb").write(bad)
        r = run(app, "apply", "--in-place", p("victim"), "--patch", p("bad.pulse"))
        expect(one_line_error(r) and snapshot(p("victim")) == before and not leftovers(parent),
               f"corrupt folder patch {k}: rc={r.returncode} {r.stderr}")

    if not have_strace():
        return
    # The swap itself fails: the new folder was complete, the old one stays.
    r = run(app, "apply", "--in-place", p("victim"), "--patch", p(patch), prefix=strace("inject=renameat2:error=EIO"))
    expect(r.returncode != 0 and snapshot(p("victim")) == before and not leftovers(parent),
           f"a failing swap leaves the old folder: {r.returncode} {r.stderr[-300:]}")
    # A filesystem without RENAME_EXCHANGE: two renames, the second failing -> the old folder back.
    r = run(app, "apply", "--in-place", p("victim"), "--patch", p(patch),
            prefix=strace("inject=renameat2:error=EINVAL", "inject=renameat:error=EIO:when=2"))
    expect(r.returncode != 0 and snapshot(p("victim")) == before and not leftovers(parent),
           f"a failing second rename puts the old folder back: {r.stderr[-300:]}")
    # Killed between the two renames: the folder is missing until the next reader puts it back.
    r = run(app, "apply", "--in-place", p("victim"), "--patch", p(patch),
            prefix=strace("inject=renameat2:error=EINVAL", "inject=renameat:error=EIO:signal=SIGKILL:when=2"))
    expect(not os.path.exists(p("victim")) and ".victim.pulse-swap" in os.listdir(parent),
           f"the kill lands between the renames: {sorted(os.listdir(parent))}")
    base_digest = run(app, "verify", p("base")).stdout.split()[0]
    r = run(app, "verify", p("victim"), "--digest", base_digest)
    expect(r.returncode == 0 and snapshot(p("victim")) == before, f"the next reader restores the old folder: {r.stderr}")
    # Without RENAME_EXCHANGE the two renames succeed.
    shutil.copytree(p("victim"), p("victim2"))
    r = run(app, "apply", "--in-place", p("victim2"), "--patch", p(patch), prefix=strace("inject=renameat2:error=EINVAL"))
    expect(r.returncode == 0 and same_folder(p("victim2"), p(target)) and not leftovers(parent),
           f"two renames where RENAME_EXCHANGE is unsupported: {r.stderr[-300:]} {leftovers(parent)}")
    # A full disk while the new folder is written.
    r = run(app, "apply", "--in-place", p("victim"), "--patch", p(patch), file_size=50000)
    expect(one_line_error(r) and snapshot(p("victim")) == before and not leftovers(parent),
           f"a full disk leaves the old folder: {r.stderr}")

    # Killed at random points: the folder is always the old or the new state, never a mix.
    random.seed(5)
    outcomes = {"old": 0, "new": 0}
    for attempt in range(12):
        proc = subprocess.Popen([app, "apply", "--in-place", p("victim"), "--patch", p(patch)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(random.uniform(0, 0.06))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        r = run(app, "verify", p("victim"))
        digest = r.stdout.split()[0] if r.returncode == 0 else r.stderr
        expect(digest in (base_digest, target_digest), f"after a kill the folder is old or new: {digest}")
        if digest == target_digest:
            outcomes["new"] += 1
            shutil.rmtree(p("victim"))
            shutil.copytree(p("base"), p("victim"))
        else:
            outcomes["old"] += 1
            expect(snapshot(p("victim")) == before, "a killed apply leaves the old folder byte for byte")
    print(f"killed appliers: {outcomes}")
    r = run(app, "apply", "--in-place", p("victim"), "--patch", p(patch))
    expect(r.returncode == 0 and same_folder(p("victim"), p(target)) and not leftovers(parent),
           f"the next apply cleans up after killed ones: {r.stderr} {leftovers(parent)}")


def make_same_layout(d):
    """The base with 1% one-ulp changes and a config.json changed at the same size, in the
    base's shards, index and metadata: a patch that keeps the layout, applied streamed."""
    base_state = hf.llama_state(64, 2, 512, 160, seed=1)
    files = hf.model_files(64, 2, 512, seed=2)
    target_state, changed = hf.one_ulp(base_state, 0.01, seed=4)
    config = files["config.json"].replace(b'"llama"', b'"LLAMA"')
    assert len(config) == len(files["config.json"]) and config != files["config.json"]
    hf.write_folder(os.path.join(d, "target_kept"), target_state, 2, {"format": "pt"}, {**files, "config.json": config})
    return changed


def streamed(app, p):
    """A folder patch that keeps the layout streams shard by shard (sync/file_apply.hpp): the
    result is the target byte for byte (every shard file, header included), the changed
    config.json too, -o and --in-place; failures leave the old folder (failures_leave_old, with
    this patch)."""
    r = run(app, "encode", "--base", p("base"), "--target", p("target_kept"), "-o", p("kept.pulse"))
    expect(r.returncode == 0, f"encode a patch that keeps the layout: {r.stderr}")
    i = json.loads(run(app, "inspect", p("kept.pulse"), "--json").stdout)
    expect(not i["added"] and not i["removed"] and "metadata" not in i and i["entries"]["whole"] == 1,
           f"the patch keeps the layout, config.json carried whole: {i}")
    shutil.copytree(p("base"), p("kept_work"))
    for args, folder in ((["--in-place", p("kept_work")], p("kept_work")),
                         (["--base", p("base"), "-o", p("kept_out")], p("kept_out"))):
        r = run(app, "apply", *args, "--patch", p("kept.pulse"))
        expect(r.returncode == 0 and snapshot(folder) == snapshot(p("target_kept")) and "wrote the folder" in r.stdout,
               f"streamed folder apply {args[0]}: {r.stdout}{r.stderr}")
        expect(not leftovers(os.path.dirname(folder)), f"no leftovers: {leftovers(os.path.dirname(folder))}")
    # A full disk found when the streamed apply preallocates a shard (sync/file_apply.cpp): one
    # line that says so, before any byte is written, and every folder as it was.
    if have_strace():
        shutil.copytree(p("base"), p("full_work"))
        before = snapshot(p("full_work"))
        for args, folder in ((["--in-place", p("full_work")], p("full_work")),
                             (["--base", p("base"), "-o", p("full_out")], p("full_out"))):
            r = run(app, "apply", *args, "--patch", p("kept.pulse"),
                    prefix=strace("inject=fallocate:error=ENOSPC", calls="fallocate"))
            expect(one_line_error(r) and "no space" in r.stderr and not leftovers(os.path.dirname(folder)),
                   f"a full disk at the preallocation {args[0]}: rc={r.returncode} {r.stderr[-300:]}")
        expect(snapshot(p("full_work")) == before and not os.path.exists(p("full_out")),
               "a full disk at the preallocation leaves the old folder and writes no new one")
    # As for the patch loaded whole: no folder without a model replaced, no other model patched.
    r = run(app, "apply", "--base", p("base"), "--patch", p("kept.pulse"), "-o", p("home"))
    expect(one_line_error(r) and "refusing" in r.stderr and snapshot(p("home")) == {"notes.txt": b"mine"},
           f"a folder without a model is not replaced by a streamed apply: {r.stderr}")
    before = snapshot(p("other"))
    r = run(app, "apply", "--in-place", p("other"), "--patch", p("kept.pulse"))
    expect(one_line_error(r) and "base" in r.stderr and snapshot(p("other")) == before and not leftovers(p("")),
           f"a streamed patch of another model: {r.stderr}")
    return run(app, "verify", p("target_kept")).stdout.split()[0]


def unchanged_shard_linked(app, p):
    """In place, a shard the patch leaves as it is is hard-linked into the new folder (the old
    file, never written: sync/file_apply.cpp open_link), not copied; -o copies it. Failures before
    the swap leave the old folder's files, inodes and link counts as they were."""
    base_state = hf.llama_state(64, 2, 512, 160, seed=1)
    files = hf.model_files(64, 2, 512, seed=2)
    second = "model-00002-of-00002.safetensors"
    kept, _ = hf.read_safetensors(os.path.join(p("base"), second))
    changed_state, _ = hf.one_ulp(base_state, 0.01, seed=6)
    target = {name: base_state[name] if name in kept else t for name, t in changed_state.items()}
    hf.write_folder(p("target_one"), target, 2, {"format": "pt"}, files)
    shard_bytes = lambda folder: open(os.path.join(folder, second), "rb").read()
    expect(shard_bytes(p("target_one")) == shard_bytes(p("base")), "the target's second shard is the base's")
    r = run(app, "encode", "--base", p("base"), "--target", p("target_one"), "-o", p("one.pulse"))
    expect(r.returncode == 0, f"encode a patch of the first shard only: {r.stderr}")
    work, parent = p("one_work"), os.path.dirname(p("one_work"))
    shutil.copytree(p("base"), work)
    before = snapshot(work)
    inodes = lambda folder: {f: (os.stat(os.path.join(folder, f)).st_ino, os.stat(os.path.join(folder, f)).st_nlink)
                             for f in sorted(os.listdir(folder))}
    old = inodes(work)
    expect(all(n == 1 for _, n in old.values()), f"the copy's files have one link each: {old}")

    good = open(p("one.pulse"), "rb").read()
    middle = len(good) // 2
    open(p("one_bad.pulse"), "wb").write(good[:middle] + bytes([good[middle] ^ 0x10]) + good[middle + 1:])
    r = run(app, "apply", "--in-place", work, "--patch", p("one_bad.pulse"))
    expect(one_line_error(r) and snapshot(work) == before and inodes(work) == old and not leftovers(parent),
           f"a corrupt patch leaves the old files, inodes and link counts: {r.stderr} {inodes(work)}")
    if have_strace():  # the new folder complete, its link made, the swap failing
        r = run(app, "apply", "--in-place", work, "--patch", p("one.pulse"),
                prefix=strace("inject=renameat2:error=EIO"))
        expect(r.returncode != 0 and snapshot(work) == before and inodes(work) == old and not leftovers(parent),
               f"a failing swap leaves the old files, inodes and link counts: {r.stderr[-300:]} {inodes(work)}")

    r = run(app, "apply", "--in-place", work, "--patch", p("one.pulse"))
    new = inodes(work)
    expect(r.returncode == 0 and snapshot(work) == snapshot(p("target_one")) and not leftovers(parent),
           f"apply --in-place of the first shard: {r.stderr}")
    expect(new[second] == old[second], f"the unchanged shard is the old file, one link: {old[second]} -> {new[second]}")
    expect(all(new[f][0] != old[f][0] and new[f][1] == 1 for f in new if f != second),
           f"every other file is new: {old} -> {new}")
    r = run(app, "apply", "--base", p("base"), "--patch", p("one.pulse"), "-o", p("one_out"))
    expect(r.returncode == 0 and snapshot(p("one_out")) == snapshot(p("target_one")),
           f"apply -o of the first shard: {r.stderr}")
    expect(os.stat(os.path.join(p("one_out"), second)).st_ino != os.stat(os.path.join(p("base"), second)).st_ino
           and os.stat(os.path.join(p("base"), second)).st_nlink == 1, "-o copies the unchanged shard: no file shared")


def relay(app, p):
    """publish and pull of folders: the anchor is one safetensors file holding the files."""
    rl = p("relay")
    for v, folder, extra in ((1, p("base"), []), (2, p("target"), ["--previous", p("base")])):
        r = run(app, "publish", "--relay", rl, "--version", v, folder, "--anchor-every", 1, *extra)
        expect(r.returncode == 0, f"publish folder {v}: {r.stderr}")
    anchor, _ = hf.read_safetensors(os.path.join(rl, "anchor-2.safetensors"))
    expect("__file__/config.json" in anchor and "__file__/tokenizer.model" in anchor,
           f"the anchor carries the folder's files: {sorted(anchor)[:5]}")
    r = run(app, "pull", "--relay", rl, "-o", p("pulled"))
    expect(r.returncode == 0 and "slow path" in r.stdout and same_folder(p("pulled"), p("target")),
           f"pull a folder from its anchor: {r.stdout}{r.stderr}")
    r = run(app, "pull", "--relay", rl, "-o", p("fast"), "--have", p("base"), "--have-version", 1)
    expect(r.returncode == 0 and "fast path" in r.stdout and same_folder(p("fast"), p("target")),
           f"pull a folder by patches: {r.stdout}{r.stderr}")
    shutil.copytree(p("base"), p("held"))
    r = run(app, "pull", "--relay", rl, "-o", p("held"), "--have", p("held"), "--have-version", 1)
    expect(r.returncode == 0 and same_folder(p("held"), p("target")) and not leftovers(os.path.dirname(p("held"))),
           f"pull into the folder held: {r.stderr}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--app", required=True)
    app = parser.parse_args().app
    with tempfile.TemporaryDirectory() as d:
        p = lambda name: os.path.join(d, name)
        changed = make_pair(d)
        digest = round_trip(app, p, changed)
        bad_input(app, p)
        failures_leave_old(app, p, digest)
        make_same_layout(d)
        kept_digest = streamed(app, p)
        failures_leave_old(app, p, kept_digest, "kept.pulse", "target_kept")
        unchanged_shard_linked(app, p)
        relay(app, p)
    print(f"{len(failures)} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
