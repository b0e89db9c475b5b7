"""File-to-file `pulse-sync apply` against copying the base file (issue 16: streamed apply
within 1.5x of a copy). Builds a BF16 safetensors base of --elements elements (16 tensors) and
a target with 1 - --sparsity of them changed, encodes the patch once, then times side by side,
--repeat rounds, best kept (the machine is shared): `cp base out` (the page cache, no fsync),
`cp base out && sync out` (durable, as apply is: it fsyncs before the rename), the load-whole
apply (`--no-stream`), the streamed apply (with --threads N when given) and, with
--baseline-app, another build's streamed apply in the same rounds (before/after on a loaded
machine). Checks every apply wrote the target's bytes, and prints one JSON object with the
wall times, the CPU times (user + system: what a loaded machine stretches), the streamed
applies' time before their final fsync (what they print; the rest of the wall time is mostly
that fsync) and the ratios streamed / copy.
    python3 apps/bench/stream_apply_bench.py --app build/apps/pulse-sync [--elements 268435456]
        [--values keydiff|expclass] [--threads N] [--baseline-app OTHER/apps/pulse-sync]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "apps"))
import safetensors_ref  # noqa: E402


def timed(cmd, out):
    """Wall seconds, CPU seconds (user + system, the command's processes) and stdout of one run."""
    if os.path.exists(out):
        os.remove(out)
    c0, t0 = os.times(), time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    seconds, c1 = time.perf_counter() - t0, os.times()
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: {r.stderr}")
    return seconds, (c1.children_user + c1.children_system) - (c0.children_user + c0.children_system), r.stdout


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--app", required=True)
    parser.add_argument("--elements", type=int, default=256 << 20)
    parser.add_argument("--sparsity", type=float, default=0.99)
    parser.add_argument("--values", default="keydiff")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the files go (default: a temporary folder)")
    parser.add_argument("--threads", type=int, default=None, help="apply --threads (default: the app's)")
    parser.add_argument("--baseline-app", default=None, help="another pulse-sync whose streamed apply is timed too")
    args = parser.parse_args()
    rng = np.random.default_rng(16)
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        base, target, patch, out = (os.path.join(d, n) for n in ("base.safetensors", "target.safetensors", "p.pulse", "out.safetensors"))
        per = args.elements // 16
        tensors = [(f"layers.{i}.weight", "BF16", rng.integers(0, 1 << 16, per, dtype=np.uint16)) for i in range(16)]
        safetensors_ref.write(base, tensors)
        for _, _, a in tensors:
            hit = np.flatnonzero(rng.random(per) > args.sparsity)
            a[hit] ^= rng.integers(1, 1 << 16, hit.size, dtype=np.uint16)  # a changed element always differs
        safetensors_ref.write(target, tensors)
        del tensors
        subprocess.run([args.app, "encode", "--base", base, "--target", target, "-o", patch, "--values", args.values],
                       check=True, capture_output=True)
        with open(target, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            f.seek(8 + n)
            target_data = f.read()
        threads = ["--threads", str(args.threads)] if args.threads else []
        runs = {
            "cp": ["cp", base, out],
            "cp_and_sync": ["sh", "-c", f"cp '{base}' '{out}' && sync '{out}'"],
            "apply_load_whole": [args.app, "apply", "--no-stream", "--base", base, "--patch", patch, "-o", out],
            "apply_streamed": [args.app, "apply", "--base", base, "--patch", patch, "-o", out] + threads,
        }
        if args.baseline_app:
            runs["baseline_streamed"] = [args.baseline_app, "apply", "--base", base, "--patch", patch, "-o", out]
        best = {k: float("inf") for k in runs}
        best_cpu, best_before_fsync = dict(best), {}
        for _ in range(args.repeat):
            for name, cmd in runs.items():
                seconds, cpu, stdout = timed(cmd, out)
                best[name], best_cpu[name] = min(best[name], seconds), min(best_cpu[name], cpu)
                applied = re.search(r"^applied .* in ([0-9.]+) s,", stdout, re.M)
                if applied and name.endswith("_streamed"):  # load-whole prints the patching alone
                    best_before_fsync[name] = min(best_before_fsync.get(name, float("inf")), float(applied.group(1)))
                if name.startswith(("apply", "baseline")):
                    with open(out, "rb") as f:
                        m = int.from_bytes(f.read(8), "little")
                        f.seek(8 + m)
                        if f.read() != target_data:
                            sys.exit(f"{name}: the output is not the target")
        result = {
            "elements": args.elements, "base_bytes": os.path.getsize(base), "patch_bytes": os.path.getsize(patch),
            "sparsity": args.sparsity, "values": args.values, "repeat": args.repeat,
            "best_seconds": {k: round(v, 4) for k, v in best.items()},
            "best_cpu_seconds": {k: round(v, 4) for k, v in best_cpu.items()},
            "best_seconds_before_fsync": {k: round(v, 4) for k, v in best_before_fsync.items()},
            "streamed_over_cp": round(best["apply_streamed"] / best["cp"], 3),
            "streamed_over_cp_and_sync": round(best["apply_streamed"] / best["cp_and_sync"], 3),
            "load_whole_over_cp_and_sync": round(best["apply_load_whole"] / best["cp_and_sync"], 3),
        }
        if args.threads:
            result["threads"] = args.threads
        if args.baseline_app:
            result["baseline_over_cp_and_sync"] = round(best["baseline_streamed"] / best["cp_and_sync"], 3)
        print(json.dumps(result))


if __name__ == "__main__":
    main()
