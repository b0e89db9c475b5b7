"""pulse-sync in bounded memory (issue 26): on a numpy-generated Llama-layout folder pair (3
shards, 0.54 GiB per version, the largest tensor 32 MiB; tests/apps/llama_folder.py), verify, diff
and encode (keydiff and expclass) peak at a few times the largest tensor plus the patch, far
below the model (the command's maximum resident set: tests/apps/peak_rss.py), on folders and on single
.safetensors files; their results are those of the checks here (the changed count the generator
made; every apply writes the target byte for byte and reaches its digest); an apply that loads
the base whole holds it once (under the model + that bound); encode runs under a `ulimit -v` of that
bound, and under one too small for two copies of the largest tensor fails with one line that
says how much it needs. The relay's publish (with an anchor, plain or zstd, and with a patch)
and pull (fast path, late joiner, a chain of patches) keep the same bound, into folders and
files; publish and a late joiner's pull from a compressed anchor run under the same `ulimit -v`.
    test_pulse_sync_bounded.py --app build/apps/pulse-sync
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_folder  # noqa: E402
import peak_rss  # noqa: E402

from expect import expect, failures  # noqa: E402

MiB = 1 << 20


def run(app, *args, address_space=None):
    """(returncode, stdout, stderr, peak resident bytes) of one run of the app."""
    return peak_rss.run([app, *args], address_space)[:4]


def snapshot(path):
    """Every file under path (or the file itself): names and bytes."""
    if os.path.isfile(path):
        return open(path, "rb").read()
    out = {}
    for root, _, names in os.walk(path):
        for name in names:
            out[os.path.relpath(os.path.join(root, name), path)] = open(os.path.join(root, name), "rb").read()
    return out


def relay_checks(app, p, snapshot, check_peak, target_digest):
    """publish (the first version with an anchor, plain and zstd; the next with a patch) and pull
    (fast path from the base, late joiner from an anchor and a patch, plain and compressed
    anchors), on folders and on single files: each within the bound, each pull the target byte
    for byte and at its digest, no scratch folder left behind."""
    shard = "model-00001-of-00003.safetensors"
    for kind, a, b in (("folder", p("a"), p("b")), ("file", p("a/" + shard), p("b/" + shard))):
        for zst in (False, True):
            relay = p(f"relay-{kind}-{int(zst)}")
            extra = ["--compress-anchors"] if zst else []
            label = f"({kind}{', .zst anchors' if zst else ''})"
            rc, out, err, rss = run(app, "publish", "--relay", relay, "--version", "1", *extra, a)
            expect(rc == 0, f"publish 1 {label}: {err}")
            check_peak(f"publish with an anchor {label}", rss)
            rc, out, err, rss = run(app, "publish", "--relay", relay, "--version", "2", "--previous", a, *extra, b)
            expect(rc == 0, f"publish 2 {label}: {err}")
            patch_bytes = os.path.getsize(os.path.join(relay, "patch-1-2.pulse")) if rc == 0 else 0
            expect(not [n for n in os.listdir(relay) if n.startswith("anchor-2")], f"publish 2 wrote an anchor {label}")
            check_peak(f"publish with a patch {label}", rss, patch_bytes)
            suffix = ".safetensors" if kind == "file" else ""
            for how, args in (("fast path", ["--have", a, "--have-version", "1"]), ("late joiner", [])):
                out_path = p(f"pulled-{kind}-{int(zst)}-{how.replace(' ', '-')}{suffix}")
                rc, out, err, rss = run(app, "pull", "--relay", relay, "-o", out_path, *args)
                expect(rc == 0 and ("fast path" in out) == (how == "fast path"), f"pull {how} {label}: {out}{err}")
                check_peak(f"pull, {how} {label}", rss, patch_bytes)
                expect(rc == 0 and snapshot(out_path) == snapshot(b), f"pull {how} {label} is not the target byte for byte")
                if kind == "folder":
                    expect(run(app, "verify", out_path, "--digest", target_digest)[0] == 0, f"pull {how} {label}: digest")
                (shutil.rmtree if kind == "folder" else os.remove)(out_path)
            expect(not [n for n in os.listdir(p("")) if ".pulse-pull." in n], f"a pull {label} left its scratch folder")
            shutil.rmtree(relay)
    # a chain of two patches from the base (versions in between go through the scratch folder),
    # and the state at the head version pulled again (written from the anchor, nothing applied)
    relay = p("relay-chain")
    for v, path, prev in ((1, p("a"), None), (2, p("b"), p("a")), (3, p("a"), p("b"))):
        rc, out, err, _ = run(app, "publish", "--relay", relay, "--version", str(v), "--anchor-every", "100",
                              *(["--previous", prev] if prev else []), path)
        expect(rc == 0, f"publish {v} (chain): {err}")
    rc, out, err, rss = run(app, "pull", "--relay", relay, "-o", p("chain"), "--have", p("a"), "--have-version", "1")
    expect(rc == 0 and "2 patches" in out, f"pull over two patches: {out}{err}")
    check_peak("pull over two patches (folder)", rss, os.path.getsize(os.path.join(relay, "patch-1-2.pulse")))
    expect(rc == 0 and snapshot(p("chain")) == snapshot(p("a")), "the pull over two patches is not version 3")
    shutil.rmtree(p("chain"))
    shutil.rmtree(relay)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--app", required=True)
    app = ap.parse_args().app
    with tempfile.TemporaryDirectory() as d:
        def p(name):
            return os.path.join(d, name)
        model, changed, largest = llama_folder.write_pair(p("a"), p("b"), "small", fraction=0.01, seed=26)
        print(f"folders of {model / MiB:.0f} MiB, largest tensor {largest / MiB:.0f} MiB, {changed} changes", flush=True)

        def bound(patch_bytes=0):
            # two tensors in flight and one more of slack, the patch a few times over (its streams,
            # compressed copies, the file), and the process itself (Kokkos, libraries)
            return 3 * largest + 4 * patch_bytes + 64 * MiB
        expect(bound(8 * MiB) < model / 1.5, "the test's folders are not much larger than the bound")

        def check_peak(what, rss, patch_bytes=0, limit=None):
            limit = limit or bound(patch_bytes)
            print(f"{what}: peak RSS {rss / MiB:.0f} MiB (bound {limit / MiB:.0f} MiB, model {model / MiB:.0f} MiB)",
                  flush=True)
            expect(rss <= limit, f"{what} peaked at {rss / MiB:.0f} MiB, over {limit / MiB:.0f} MiB")
        pieces = 64 * MiB  # verify and diff read 8 MiB pieces: the process and a few pieces

        rc, out, err, rss = run(app, "verify", p("b"), "--json")
        expect(rc == 0, f"verify: {err}")
        target_digest = json.loads(out)["state_digest"] if rc == 0 else None
        check_peak("verify", rss, limit=pieces)

        rc, out, err, rss = run(app, "diff", p("a"), p("b"), "--json")
        expect(rc == 0, f"diff: {err}")
        if rc == 0:
            total = json.loads(out)["totals"]["BF16"]["changed"]
            expect(total == changed, f"diff counts {total} changes, the generator made {changed}")
        check_peak("diff", rss, limit=pieces)

        for values in ("keydiff", "expclass"):
            for kind, base, target in (("folder", p("a"), p("b")),
                                       ("file", p("a/model-00001-of-00003.safetensors"),
                                        p("b/model-00001-of-00003.safetensors"))):
                patch = p(f"{values}-{kind}.pulse")
                rc, out, err, rss = run(app, "encode", "--base", base, "--target", target, "-o", patch, "--values", values)
                expect(rc == 0, f"encode {values} {kind}: {err}")
                if rc != 0:
                    continue
                check_peak(f"encode {values} ({kind})", rss, os.path.getsize(patch))
                # apply, streamed: -o a new folder or file, and --in-place onto a copy of the base
                out_path = p(f"out-{values}-{kind}" + (".safetensors" if kind == "file" else ""))
                work = p(f"work-{values}-{kind}" + (".safetensors" if kind == "file" else ""))
                (shutil.copytree if kind == "folder" else shutil.copyfile)(base, work)
                for how, args, result in (("-o", ["--base", base, "-o", out_path], out_path),
                                          ("--in-place", ["--in-place", work], work)):
                    rc, out, err, rss = run(app, "apply", *args, "--patch", patch)
                    expect(rc == 0, f"apply {how} {values} {kind}: {err}")
                    check_peak(f"apply {how} {values} ({kind})", rss, os.path.getsize(patch))
                    expect(snapshot(result) == snapshot(target), f"apply {how} {values} {kind} is not the target byte for byte")
                    if kind == "folder":
                        rc, out, err, _ = run(app, "verify", result, "--digest", target_digest)
                        expect(rc == 0, f"the {values} patch does not reach the target: {err}")
                    (shutil.rmtree if kind == "folder" else os.remove)(result)

        # Loading whole (a patch that changes the layout, `pull`, Python's pulse.load and save):
        # the model once (each tensor read into its own buffer, the folder written read back in
        # pieces), not twice.
        rc, out, err, rss = run(app, "apply", "--no-stream", "--base", p("a"), "--patch", p("keydiff-folder.pulse"),
                                "-o", p("whole"))
        expect(rc == 0 and run(app, "verify", p("whole"), "--digest", target_digest)[0] == 0, f"apply --no-stream: {err}")
        check_peak("apply --no-stream (loads the base)", rss, limit=model + bound())

        relay_checks(app, p, snapshot, check_peak, target_digest)

        # Under `ulimit -v`: V, the least address space in which verify runs (the process and its
        # libraries, found by bisection), and encode on one thread in V + 3 x the largest tensor
        # + 4 x the patch works; in V + 1 x the largest expclass (whose ranker needs a whole segment;
        # keydiff reads 1 MiB pieces of it) cannot hold two segments (a 2^24-element segment of
        # each state: the largest tensor here is 2 segments) and says so in one line.
        # (On more threads each holds its own segments, and its malloc arena takes address space.)
        low, high = 8 * MiB, 2048 * MiB
        while high - low > 4 * MiB:
            mid = (low + high) // 2
            if run(app, "verify", p("a"), address_space=mid)[0] == 0:
                high = mid
            else:
                low = mid
        patch_bytes = os.path.getsize(p("keydiff-folder.pulse"))
        print(f"verify runs in {high / MiB:.0f} MiB of address space", flush=True)
        rc, out, err, _ = run(app, "encode", "--threads", "1", "--base", p("a"), "--target", p("b"), "-o", p("limited.pulse"),
                              address_space=high + 3 * largest + 4 * patch_bytes)
        expect(rc == 0, f"encode in {(high + 3 * largest + 4 * patch_bytes) / MiB:.0f} MiB of address space: {err}")
        rc, out, err, _ = run(app, "encode", "--threads", "1", "--values", "expclass", "--base", p("a"), "--target", p("b"),
                              "-o", p("oom.pulse"), address_space=high + largest)
        lines = err.strip().splitlines()
        expect(rc != 0 and len(lines) == 1 and "out of memory" in err and "GiB" in err,
               f"encode without the memory it needs: rc {rc}, stderr {err!r}")
        expect(not os.path.exists(p("oom.pulse")), "a failed encode left its output")
        # publish in the same space, and pull a late joiner from the compressed anchor (decompressed
        # in pieces, written tensor by tensor). A pull that applies patches is bounded in memory
        # above, not in address space: the streamed folder apply maps its shards (file_apply.hpp).
        limit = high + 3 * largest + 4 * patch_bytes
        base_digest = json.loads(run(app, "verify", p("a"), "--json")[1])["state_digest"]
        for args, digest in ((["publish", "--threads", "1", "--relay", p("vrelay"), "--version", "1", "--compress-anchors", p("a")], None),
                             (["pull", "--relay", p("vrelay"), "-o", p("vpulled")], base_digest),
                             (["publish", "--threads", "1", "--relay", p("vrelay"), "--version", "2", "--previous", p("a"), p("b")], None)):
            rc, out, err, _ = run(app, *args, address_space=limit)
            expect(rc == 0, f"{args[0]} in {limit / MiB:.0f} MiB of address space: {err}")
            if digest:
                expect(run(app, "verify", p("vpulled"), "--digest", digest)[0] == 0,
                       "the pull under ulimit -v does not reach the anchor's state")
        rc, out, err, _ = run(app, "pull", "--relay", p("vrelay"), "-o", p("vpulled2"), address_space=high + largest // 2)
        lines = err.strip().splitlines()
        expect(rc != 0 and len(lines) == 1, f"pull without the memory it needs: rc {rc}, stderr {err!r}")
        expect(not os.path.exists(p("vpulled2")), "a failed pull left its output")
        expect(not [n for n in os.listdir(d) if ".pulse-pull." in n], "a failed pull left its scratch folder")
    if failures:
        sys.exit(f"{len(failures)} failures")
    print("ok")


if __name__ == "__main__":
    main()
