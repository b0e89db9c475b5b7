"""pulse-sync's memory and time on a Llama-7B or Qwen2-1.5B layout folder pair (issue 26, bounded
memory): numpy-generated (tests/apps/llama_folder.py: real tensor names and shapes, N(0, 0.02)
BF16 values, 1% of the elements moved by 1-3 ulps), then verify, diff, encode (keydiff,
expclass) and apply (-o a new folder, --in-place a copy of the base) of each patch, each command
timed (wall, CPU) with its peak resident set (tests/apps/peak_rss.py), for --app and, with --baseline-app,
another build side by side. Every apply is checked against the target's digest. A command that
fails (e.g. std::bad_alloc) is reported with its error, not fatal. Needs about 4x a version of
disk in --dir (base, target, one output, one copy) and prints one JSON object.
    python3 apps/bench/big_folder_bench.py --app build/apps/pulse-sync --layout qwen2-1.5b [--dir D]
        [--baseline-app OTHER/apps/pulse-sync] [--keep] [--threads 1 2]
With --threads 1 2 each encode and apply runs at 1 and 2 threads; "speedups" gives wall and CPU
seconds per count and the wall speedup, and each patch is checked to be the same bytes at every count.
Optional in CI (disk and time): run by hand, `make bench` does not run it.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "apps"))
import llama_folder  # noqa: E402
import peak_rss  # noqa: E402

GiB = 1 << 30


def measured(*cmd):
    """{wall_s, cpu_s, peak_rss_gib, rc[, error], stdout} of one command."""
    t0 = time.perf_counter()
    rc, stdout, stderr, peak, cpu = peak_rss.run(cmd)
    r = {"wall_s": round(time.perf_counter() - t0, 2), "cpu_s": round(cpu, 2), "peak_rss_gib": round(peak / GiB, 3), "rc": rc}
    if rc != 0:
        r["error"] = stderr.strip()[-300:]
    r["stdout"] = stdout
    return r


def run_app(app, d, digest, threads=None):
    p = lambda name: os.path.join(d, name)
    results = {}
    # With threads: every encode and apply at each count (--threads N), the patches compared byte
    # for byte across counts; names get a _tN suffix.
    counts = threads or [None]

    def record(name, r):
        r.pop("stdout", None)
        results[name] = r
        print(name, r, file=sys.stderr, flush=True)

    def flag(n):
        return [] if n is None else ["--threads", str(n)]

    def tag(n):
        return "" if n is None else f"_t{n}"

    record("verify", measured(app, "verify", p("base")))
    record("diff", measured(app, "diff", p("base"), p("target"), "--json"))
    for values in ("keydiff", "expclass"):
        first = None
        for n in counts:
            patch = p(f"{values}{tag(n)}.pulse")
            r = measured(app, "encode", "--base", p("base"), "--target", p("target"), "-o", patch, "--values", values,
                         *flag(n))
            if r["rc"] == 0:
                r["patch_bytes"] = os.path.getsize(patch)
                with open(patch, "rb") as f:
                    data = f.read()
                first = first or data
                r["same_bytes_as_first_count"] = data == first
            record(f"encode_{values}{tag(n)}", r)
            if r["rc"] != 0:
                continue
            shutil.rmtree(p("out"), ignore_errors=True)
            r = measured(app, "apply", "--base", p("base"), "--patch", patch, "-o", p("out"), *flag(n))
            r["verified"] = r["rc"] == 0 and measured(app, "verify", p("out"), "--digest", digest)["rc"] == 0
            record(f"apply_o_{values}{tag(n)}", r)
            shutil.rmtree(p("out"), ignore_errors=True)
            shutil.rmtree(p("work"), ignore_errors=True)
            shutil.copytree(p("base"), p("work"))
            r = measured(app, "apply", "--in-place", p("work"), "--patch", patch, *flag(n))
            r["verified"] = r["rc"] == 0 and measured(app, "verify", p("work"), "--digest", digest)["rc"] == 0
            record(f"apply_in_place_{values}{tag(n)}", r)
            shutil.rmtree(p("work"), ignore_errors=True)
            os.remove(patch)
    return results


def speedups(results, threads):
    """Per command: wall and CPU at each count, and the wall speedup of each count over the first."""
    out = {}
    for name, r in results.items():
        if not name.endswith(f"_t{threads[0]}") or r.get("rc") != 0:
            continue
        stem = name[: -len(f"_t{threads[0]}")]
        row = {f"t{n}": {"wall_s": results[f"{stem}_t{n}"]["wall_s"], "cpu_s": results[f"{stem}_t{n}"]["cpu_s"]}
               for n in threads if results.get(f"{stem}_t{n}", {}).get("rc") == 0}
        for n in threads[1:]:
            if f"t{n}" in row and row[f"t{n}"]["wall_s"] > 0:
                row[f"speedup_t{n}"] = round(r["wall_s"] / row[f"t{n}"]["wall_s"], 2)
        out[stem] = row
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--app", required=True)
    ap.add_argument("--baseline-app")
    ap.add_argument("--layout", default="qwen2-1.5b", choices=sorted(llama_folder.LAYOUTS))
    ap.add_argument("--fraction", type=float, default=0.01)
    ap.add_argument("--dir", help="where the folders go (default: a temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the generated pair in --dir for the next run")
    ap.add_argument("--threads", type=int, nargs="+",
                    help="run each encode and apply with --threads N for each N (e.g. 1 2) and report the speedups")
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
        out = {"layout": args.layout, "version_gib": round(size / GiB, 3), "largest_tensor_gib": round(largest / GiB, 3),
               "memory_gib": round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / GiB, 1),
               "app": run_app(args.app, d, digest, args.threads)}
        if args.threads:
            out["speedups"] = speedups(out["app"], args.threads)
        if args.baseline_app:
            out["baseline"] = run_app(args.baseline_app, d, digest)
        print(json.dumps(out, indent=1))
    finally:
        if not args.keep:
            for name in ("base", "target", "out", "work"):
                shutil.rmtree(os.path.join(d, name), ignore_errors=True)
            for name in ("keydiff.pulse", "expclass.pulse"):
                if os.path.exists(os.path.join(d, name)):
                    os.remove(os.path.join(d, name))
            if not args.dir:
                os.rmdir(d)


if __name__ == "__main__":
    main()
