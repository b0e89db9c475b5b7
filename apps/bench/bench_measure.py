"""pulse-measure's read bandwidth per rank against this machine's single-core read bandwidth.

Writes a series of BF16 checkpoints (Hugging Face folders, 2 shards, 1% one-ulp changes per step),
reads them once with dd (single core, page cache warm) as the reference, then runs pulse-measure
at each --np and reports, per rank, checkpoint bytes read / seconds spent measuring them
(/ranks/read_bytes over /ranks/measure_s, and over /ranks/cpu_s, which a machine shared with
other jobs does not inflate; rows after the first checkpoint), the fraction of the dd rate, and
the peak resident memory per rank (/ranks/max_rss_bytes; the k-step history holds up to 33
versions of the share, so a series longer than 33 checkpoints reaches the steady state).
    python3 apps/bench/bench_measure.py --app build/apps/pulse-measure [--size-mb 512] [--np 1,2]
"""
import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "apps"))
import safetensors_ref  # noqa: E402


def write_series(root, size_mb, count, seed=0):
    rng = np.random.default_rng(seed)
    n = size_mb * (1 << 20) // 2 // 8  # 8 tensors of BF16
    state = {f"model.layers.{i // 4}.{'self_attn' if i % 2 else 'mlp'}.w{i}.weight": rng.integers(0x3c00, 0x3f80, n, dtype=np.uint16)
             for i in range(8)}
    paths = []
    for t in range(count):
        path = os.path.join(root, f"checkpoint-{t}")
        os.makedirs(path)
        names = list(state)
        weight_map = {}
        for k in range(2):
            shard = f"model-{k + 1:05d}-of-00002.safetensors"
            part = names[k::2]
            safetensors_ref.write(os.path.join(path, shard), [(m, "BF16", state[m]) for m in part], {"format": "pt"})
            weight_map.update({m: shard for m in part})
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": n * 2 * 8}, "weight_map": weight_map}, f)
        paths.append(path)
        for m in state:
            changed = rng.random(n) < 0.01
            state[m] = state[m] + changed.astype(np.uint16)
    return paths


def dd_rate(paths):
    """Single-core read bandwidth (bytes per wall second, bytes per CPU second) of the checkpoints'
    files from the page cache."""
    files = [os.path.join(p, f) for p in paths for f in sorted(os.listdir(p)) if f.endswith(".safetensors")]
    for f in files:  # warm the page cache as pulse-measure will find it
        subprocess.run(["dd", f"if={f}", "of=/dev/null", "bs=16M"], check=True, capture_output=True)
    t0, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    for f in files:
        subprocess.run(["dd", f"if={f}", "of=/dev/null", "bs=16M"], check=True, capture_output=True)
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = sum(os.path.getsize(f) for f in files)
    cpu = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
    return total / (time.perf_counter() - t0), total / cpu


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--app", required=True)
    parser.add_argument("--mpiexec", default="mpiexec")
    parser.add_argument("--mpi-flags", default="--oversubscribe --allow-run-as-root")
    parser.add_argument("--size-mb", type=int, default=512, help="MiB of BF16 weights per checkpoint")
    parser.add_argument("--checkpoints", type=int, default=5)
    parser.add_argument("--np", default="1,2")
    parser.add_argument("--dir", help="folder for the checkpoints (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        paths = write_series(tmp, args.size_mb, args.checkpoints)
        ref, ref_cpu = dd_rate(paths)
        print(f"single-core read (dd bs=16M, page cache): {ref / 1e9:.2f} GB/s per wall second, "
              f"{ref_cpu / 1e9:.2f} GB/s per CPU second")
        for np_ in [int(x) for x in args.np.split(",")]:
            out = os.path.join(tmp, f"np{np_}.h5")
            cmd = [args.mpiexec] + shlex.split(args.mpi_flags) + ["-n", str(np_), args.app, "--quiet", "--out", out] + paths
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True)
            wall = time.perf_counter() - t0
            with h5py.File(out, "r") as f:
                read, secs = f["ranks/read_bytes"][()], f["ranks/measure_s"][()]
                cpu, rss = f["ranks/cpu_s"][()], f["ranks/max_rss_bytes"][()]
                encode = f["steps/encode_s"][()].sum() / f["steps/measure_s"][()].sum()
            for r in range(np_):
                rate, rate_cpu = read[:, r].sum() / secs[:, r].sum(), read[:, r].sum() / cpu[:, r].sum()
                print(f"np {np_} rank {r}: {rate / 1e9:.2f} GB/s per wall second ({100 * rate / ref:.0f}% of dd), "
                      f"{rate_cpu / 1e9:.2f} GB/s per CPU second ({100 * rate_cpu / ref_cpu:.0f}% of dd); share "
                      f"{read[0, r] / 2**20:.0f} MiB, peak RSS {rss[-1, r] / 2**20:.0f} MiB "
                      f"({rss[-1, r] / read[0, r]:.1f} x share)")
            print(f"np {np_}: {args.checkpoints} checkpoints of {args.size_mb} MiB in {wall:.1f} s wall; "
                  f"patch encoding is {100 * encode:.0f}% of the measuring time")

if __name__ == "__main__":
    main()
