"""pulse-sync's memory and time on a Llama-2-7B or Qwen2-1.5B layout folder pair (issue 26),
beside the weight-update format RL frameworks ship (prime-rl's: per tensor int32 indices + BF16
values + zstd, apply by index_copy_; apps/bench/primerl_peer.py). The pair is numpy-generated
(tests/apps/llama_folder.py: real tensor names and shapes, N(0, 0.02) BF16 values, 1% of the
elements moved by 1-3 ulps) in a temporary folder, deleted after. Measured, each command's wall
time, CPU seconds, peak resident set (tests/apps/peak_rss.py) and patch bytes: verify, diff,
encode (keydiff, expclass) of the folders and of one shard file, apply (-o a new folder,
--in-place a copy of the base, -o a file), the relay (publish with an anchor, publish with a
patch, a fast-path pull, a late joiner's pull), and the peer's encode and apply (-o, in place),
at each of --threads (passed as --threads where `pulse-sync SUB --help` lists it; the peer's
torch threads). Every apply and pull is checked against the target's digest. A command that
fails (e.g. std::bad_alloc) is reported with its error, not fatal. Needs about 4 versions of
disk (base, target, relay anchor, one output); prints one JSON object, the Markdown table on
stderr (and to --table).
    python3 apps/bench/big_folder_bench.py --app build/apps/pulse-sync --layout llama-7b [--threads 1,2]
        [--table T.md] [--dir D --keep] [--baseline-app OTHER/apps/pulse-sync] [--no-peer]
`--layout qwen2-1.5b` runs in minutes. Optional in CI (disk and time): `PULSE_BENCH_BIG=llama-7b
make bench` runs it, plain `make bench` does not.
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "apps"))
import llama_folder  # noqa: E402
import peak_rss  # noqa: E402

GiB = 1 << 30
SHARD = "model-00001-of-00002.safetensors"  # both layouts here come in 2 shards


def measured(*cmd):
    """{wall_s, cpu_s, peak_rss_gib, rc[, error], stdout} of one command."""
    t0 = time.perf_counter()
    rc, stdout, stderr, peak, cpu = peak_rss.run(cmd)
    r = {"wall_s": round(time.perf_counter() - t0, 2), "cpu_s": round(cpu, 2), "peak_rss_gib": round(peak / GiB, 3), "rc": rc}
    if rc != 0:
        r["error"] = stderr.strip()[-300:]
    r["stdout"] = stdout
    return r


def thread_flags(app):
    """{subcommand: True} for those whose --help lists --threads (older builds have fewer)."""
    out = {}
    for sub in ("encode", "apply", "publish", "pull"):
        r = subprocess.run([app, sub, "--help"], capture_output=True, text=True)
        out[sub] = "--threads" in r.stdout
    return out


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def run_app(app, d, digest, threads, file_digest, with_verify=True):
    p = lambda name: os.path.join(d, name)
    flags = thread_flags(app)
    results = {}

    def t(sub):
        return ["--threads", str(threads)] if flags[sub] else []

    def record(name, r):
        r.pop("stdout", None)
        results[name] = r
        print(threads, name, r, file=sys.stderr, flush=True)

    def fresh(*names):
        for name in names:
            (shutil.rmtree if os.path.isdir(p(name)) else os.remove)(p(name)) if os.path.exists(p(name)) else None

    if with_verify:
        # What an apply into a folder is held against: a durable copy of the base folder (after a
        # sync, so that it does not pay for flushing the folders just generated).
        fresh("copy")
        subprocess.run(["sync"], check=True)
        record("durable_copy", measured("sh", "-c", f"cp -r '{p('base')}' '{p('copy')}' && sync"))
        fresh("copy")
        record("verify", measured(app, "verify", p("base")))
        record("diff", measured(app, "diff", p("base"), p("target"), "--json"))
    for values in ("keydiff", "expclass"):
        patch = p(f"{values}.pulse")
        r = measured(app, "encode", *t("encode"), "--base", p("base"), "--target", p("target"), "-o", patch,
                     "--values", values)
        if r["rc"] == 0:
            r["patch_bytes"] = os.path.getsize(patch)
            r["patch_sha256"] = file_sha256(patch)  # the same at every thread count (checked in main)
        record(f"encode_{values}", r)
        if r["rc"] != 0:
            continue
        fresh("out")
        r = measured(app, "apply", *t("apply"), "--base", p("base"), "--patch", patch, "-o", p("out"))
        r["verified"] = r["rc"] == 0 and measured(app, "verify", p("out"), "--digest", digest)["rc"] == 0
        record(f"apply_o_{values}", r)
        fresh("out", "work")
        shutil.copytree(p("base"), p("work"))
        # Synced like the durable copy's source: the apply must not pay for flushing the copy just
        # made (its old pages would be written back while it runs, twice the bytes).
        subprocess.run(["sync"], check=True)
        r = measured(app, "apply", *t("apply"), "--in-place", p("work"), "--patch", patch)
        r["verified"] = r["rc"] == 0 and measured(app, "verify", p("work"), "--digest", digest)["rc"] == 0
        record(f"apply_in_place_{values}", r)
        fresh("work")
        # one shard as a single .safetensors file
        file_patch = p(f"{values}-file.pulse")
        r = measured(app, "encode", *t("encode"), "--base", p("base/" + SHARD), "--target", p("target/" + SHARD),
                     "-o", file_patch, "--values", values)
        if r["rc"] == 0:
            r["patch_bytes"] = os.path.getsize(file_patch)
        record(f"encode_file_{values}", r)
        if r["rc"] == 0:
            r = measured(app, "apply", *t("apply"), "--base", p("base/" + SHARD), "--patch", file_patch,
                         "-o", p("out.safetensors"))
            r["verified"] = r["rc"] == 0 and measured(app, "verify", p("out.safetensors"), "--digest",
                                                      file_digest)["rc"] == 0
            record(f"apply_file_{values}", r)
            fresh("out.safetensors", f"{values}-file.pulse")
    # the relay: the first publish (an anchor), the next (a patch), a fast-path pull from the base
    # and a late joiner's (the anchor and the patch)
    fresh("relay")
    record("publish_anchor", measured(app, "publish", *t("publish"), "--relay", p("relay"), "--version", "1",
                                      p("base")))
    r = measured(app, "publish", *t("publish"), "--relay", p("relay"), "--version", "2", "--previous", p("base"),
                 p("target"))
    if r["rc"] == 0:
        r["patch_bytes"] = os.path.getsize(p("relay/patch-1-2.pulse"))
    record("publish_patch", r)
    for name, args in (("pull_fast", ["--have", p("base"), "--have-version", "1"]), ("pull_late_joiner", [])):
        fresh("out")
        r = measured(app, "pull", *t("pull"), "--relay", p("relay"), "-o", p("out"), *args)
        r["verified"] = r["rc"] == 0 and measured(app, "verify", p("out"), "--digest", digest)["rc"] == 0
        record(name, r)
    fresh("out", "relay")
    return results


def run_peer(app, d, digest, threads):
    """The prime-rl-format peer (apps/bench/primerl_peer.py) on the same folders."""
    p = lambda name: os.path.join(d, name)
    peer = os.path.join(os.path.dirname(os.path.abspath(__file__)), "primerl_peer.py")
    results = {}
    flags = ["--threads", str(threads)]
    r = measured(sys.executable, peer, "encode", p("base"), p("target"), p("peer.patch"), *flags)
    if r["rc"] == 0:
        r["patch_bytes"] = os.path.getsize(p("peer.patch"))
    results["encode"] = r
    if r["rc"] == 0:
        shutil.rmtree(p("out"), ignore_errors=True)
        results["apply_o"] = measured(sys.executable, peer, "apply", p("base"), p("peer.patch"), p("out"), *flags)
        results["apply_o"]["verified"] = measured(app, "verify", p("out"), "--digest", digest)["rc"] == 0
        shutil.rmtree(p("out"), ignore_errors=True)
        shutil.copytree(p("base"), p("work"))
        subprocess.run(["sync"], check=True)  # as for pulse-sync's in-place apply
        results["apply_in_place"] = measured(sys.executable, peer, "apply", p("work"), p("peer.patch"), p("work"),
                                             *flags)
        results["apply_in_place"]["verified"] = measured(app, "verify", p("work"), "--digest", digest)["rc"] == 0
        shutil.rmtree(p("work"), ignore_errors=True)
        os.remove(p("peer.patch"))
    for name, r in results.items():
        r.pop("stdout", None)
        print(threads, "peer", name, r, file=sys.stderr, flush=True)
    return results


def table(out):
    """The results as a Markdown table: one row per command, a column group per thread count."""
    threads = sorted(out["runs"], key=int)
    head = "| command | " + " | ".join(f"wall s ({n}T) | CPU s ({n}T) | peak RSS GiB ({n}T)" for n in threads) + " | bytes |"
    lines = [head, "|" + "---|" * (2 + 3 * len(threads))]
    names = list(out["runs"][threads[0]]["pulse"]) + ["peer " + k for k in out["runs"][threads[0]].get("peer", {})]
    for name in names:
        cells, size = [], ""
        for n in threads:
            group = out["runs"][n]
            r = group["peer"].get(name[5:]) if name.startswith("peer ") else group["pulse"].get(name)
            if not r:
                cells += ["-"] * 3
                continue
            ok = r["rc"] == 0 and r.get("verified", True)
            cells += [f"{r['wall_s']}" if ok else "fail", f"{r['cpu_s']}", f"{r['peak_rss_gib']}"]
            size = r.get("patch_bytes", size)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {size} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--app", required=True)
    ap.add_argument("--baseline-app")
    ap.add_argument("--layout", default="qwen2-1.5b", choices=sorted(llama_folder.LAYOUTS))
    ap.add_argument("--fraction", type=float, default=0.01)
    ap.add_argument("--dir", help="where the folders go (default: a temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the generated pair in --dir for the next run")
    ap.add_argument("--threads", default="1,2", help="thread counts to run at (--threads where pulse-sync has it)")
    ap.add_argument("--no-peer", action="store_true", help="skip the prime-rl-format peer (needs torch, zstandard)")
    ap.add_argument("--table", help="also write the Markdown table here")
    args = ap.parse_args()
    d = args.dir or tempfile.mkdtemp()
    try:
        if not os.path.exists(os.path.join(d, "target", "config.json")):
            t0 = time.perf_counter()
            size, changed, largest = llama_folder.write_pair(os.path.join(d, "base"), os.path.join(d, "target"),
                                                             args.layout, args.fraction, seed=26)
            print(f"generated in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        tensors, _ = llama_folder.layout(args.layout)
        size = sum(llama_folder.nbytes(s) for _, s in tensors)
        largest = max(llama_folder.nbytes(s) for _, s in tensors)
        r = measured(args.app, "verify", os.path.join(d, "target"))
        digest = r["stdout"].split()[0]
        file_digest = measured(args.app, "verify", os.path.join(d, "target", SHARD))["stdout"].split()[0]
        out = {"layout": args.layout, "version_gib": round(size / GiB, 3), "largest_tensor_gib": round(largest / GiB, 3),
               "memory_gib": round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / GiB, 1), "runs": {}}
        for i, n in enumerate(int(x) for x in args.threads.split(",")):
            group = {"pulse": run_app(args.app, d, digest, n, file_digest, with_verify=i == 0)}
            if not args.no_peer:
                group["peer"] = run_peer(args.app, d, digest, n)
            out["runs"][str(n)] = group
        for values in ("keydiff", "expclass"):
            sums = {g["pulse"].get(f"encode_{values}", {}).get("patch_sha256") for g in out["runs"].values()}
            if len(sums) != 1 or None in sums:
                sys.exit(f"big_folder_bench: {values} patches differ across thread counts (or failed)")
        if args.baseline_app:
            out["baseline"] = run_app(args.baseline_app, d, digest, 1, file_digest)
        print(json.dumps(out, indent=1))
        print(table(out), file=sys.stderr)
        if args.table:
            with open(args.table, "w") as f:
                f.write(table(out) + "\n")
    finally:
        if not args.keep:
            for name in ("base", "target", "out", "work", "relay", "copy"):
                shutil.rmtree(os.path.join(d, name), ignore_errors=True)
            for name in ("keydiff.pulse", "expclass.pulse", "out.safetensors", "peer.patch"):
                if os.path.exists(os.path.join(d, name)):
                    os.remove(os.path.join(d, name))
            if not args.dir:
                os.rmdir(d)


if __name__ == "__main__":
    main()
