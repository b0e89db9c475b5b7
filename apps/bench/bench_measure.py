"""pulse-measure's read bandwidth per rank against this machine's single-core read bandwidth.

Writes a series of BF16 checkpoints (Hugging Face folders, 2 shards, 1% one-ulp changes per step),
reads them once with read() in one process (single core, page cache warm) as the reference, then runs pulse-measure
at each --np and reports, per rank, checkpoint bytes read / seconds spent measuring them
(/ranks/read_bytes over /ranks/measure_s, and over /ranks/cpu_s, which a machine shared with
other jobs does not inflate; rows after the first checkpoint), the fraction of the read() rate, and
the peak resident memory per rank (/ranks/max_rss_bytes; the k-step history holds up to 33
versions of the share, so a series longer than 33 checkpoints reaches the steady state).
    python3 apps/bench/bench_measure.py --app build/apps/pulse-measure [--size-mb 32] [--checkpoints 40]
        [--np 1,2] [--max-k 1,32]
"""
import argparse
import json
import os
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


def read_rate(paths):
    """Single-core read bandwidth (bytes per wall second, bytes per CPU second) of the checkpoints'
    files from the page cache: read() into one 16 MiB buffer, in this process (as dd bs=16M does,
    without a process start per file)."""
    files = [os.path.join(p, f) for p in paths for f in sorted(os.listdir(p)) if f.endswith(".safetensors")]
    buffer = bytearray(16 << 20)

    def read_all():
        total = 0
        for name in files:
            with open(name, "rb", buffering=0) as f:
                while (n := f.readinto(buffer)):
                    total += n
        return total

    read_all()  # warm the page cache as pulse-measure will find it
    t0, c0 = time.perf_counter(), time.process_time()
    total = read_all()
    return total / (time.perf_counter() - t0), total / (time.process_time() - c0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--app", required=True)
    parser.add_argument("--mpiexec", default="mpiexec")
    parser.add_argument("--mpi-flags", default="--oversubscribe --allow-run-as-root")
    parser.add_argument("--size-mb", type=int, default=32, help="MiB of BF16 weights per checkpoint")
    parser.add_argument("--checkpoints", type=int, default=40)
    parser.add_argument("--np", default="1,2")
    parser.add_argument("--max-k", default="1,32", help="pulse-measure --max-k values to run (history depth)")
    parser.add_argument("--unit-mb", default="4", help="pulse-measure --unit-mb")
    parser.add_argument("--dir", help="folder for the checkpoints (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        paths = write_series(tmp, args.size_mb, args.checkpoints)
        ref, ref_cpu = read_rate(paths)
        print(f"single-core read (read() into 16 MiB, page cache): {ref / 1e9:.2f} GB/s per wall second, "
              f"{ref_cpu / 1e9:.2f} GB/s per CPU second")
        for np_, max_k in [(int(n), int(k)) for k in args.max_k.split(",") for n in args.np.split(",")]:
            out = os.path.join(tmp, f"np{np_}-k{max_k}.h5")
            cmd = [args.mpiexec] + shlex.split(args.mpi_flags) + ["-n", str(np_), args.app, "--quiet", "--out", out,
                                                                  "--max-k", str(max_k), "--unit-mb", args.unit_mb] + paths
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True)
            wall = time.perf_counter() - t0
            with h5py.File(out, "r") as f:
                read, secs = f["ranks/read_bytes"][()], f["ranks/measure_s"][()]
                cpu, rss = f["ranks/cpu_s"][()], f["ranks/max_rss_bytes"][()]
                encode = f["steps/encode_s"][()].sum() / f["steps/measure_s"][()].sum()
            for r in range(np_):
                rate, rate_cpu = read[:, r].sum() / secs[:, r].sum(), read[:, r].sum() / cpu[:, r].sum()
                print(f"np {np_} max-k {max_k} rank {r}: {rate / 1e9:.2f} GB/s per wall second ({100 * rate / ref:.0f}% of read), "
                      f"{rate_cpu / 1e9:.2f} GB/s per CPU second ({100 * rate_cpu / ref_cpu:.0f}% of read); share "
                      f"{read[0, r] / 2**20:.0f} MiB, peak RSS {rss[-1, r] / 2**20:.0f} MiB "
                      f"({rss[-1, r] / read[0, r]:.1f} x share)")
            print(f"np {np_} max-k {max_k}: {args.checkpoints} checkpoints of {args.size_mb} MiB in {wall:.1f} s wall; "
                  f"patch encoding is {100 * encode:.0f}% of the measuring time")

if __name__ == "__main__":
    main()
