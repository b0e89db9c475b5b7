"""pulse-measure's threads per rank (--threads) change nothing but its speed: on a series of
single-file checkpoints (BF16, F16 and F32 tensors cut into many units, blocks of several
thousand elements, weights that change by one ulp and some that return to earlier bits), every
dataset except the timings is identical at 1, 2 and 3 threads, at np 1 and np 2, compared as
stored and as the BF16 cast; the changed counts and the k-step sparsity equal a numpy
recomputation from the files; the file records the thread count; --threads 0 (the default)
takes at least one thread.
    test_measure_threads.py --app build/apps/pulse-measure --mpiexec mpiexec [--mpi-flags ...]
"""
import argparse
import os
import shlex
import subprocess
import sys
import tempfile

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_ref  # noqa: E402

from expect import expect, failures  # noqa: E402

# name -> (dtype, element count): large enough for several blocks per unit and several units
TENSORS = {"model.layers.0.mlp.up_proj.weight": ("BF16", 60000), "lm_head.weight": ("F16", 50000),
           "model.layers.0.self_attn.q_proj.weight": ("F32", 30000), "model.norm.weight": ("BF16", 7)}
KSTEP = [1, 2, 4, 8, 16, 32]
CHECKPOINTS = 36  # 35 rows: k = 32 is reached
TIMING = {"steps/encode_s", "steps/measure_s", "ranks/measure_s", "ranks/cpu_s", "ranks/max_rss_bytes"}


def bits(a):
    return a.view(np.uint32) if a.dtype.itemsize == 4 else a.view(np.uint16)


def write_series(root, rng):
    """Checkpoints 0..CHECKPOINTS-1; from one to the next, 1-3% of each tensor's elements move by
    one ulp and 0.5% take back their bits of a random earlier checkpoint."""
    dtypes = {"BF16": np.uint16, "F16": np.uint16, "F32": np.uint32}
    state = {n: rng.integers(0x3c00, 0x3f00, c, dtype=np.uint64).astype(dtypes[d]) << (16 if d == "F32" else 0)
             for n, (d, c) in TENSORS.items()}
    history, paths = [], []
    for t in range(CHECKPOINTS):
        path = os.path.join(root, f"checkpoint-{t}.safetensors")
        arrays = [(n, d, state[n] if d != "F16" else state[n].view(np.float16)) for n, (d, _) in TENSORS.items()]
        arrays = [(n, d, a.view(np.float32) if d == "F32" else a) for n, d, a in arrays]
        safetensors_ref.write(path, arrays, {"format": "pt"})
        paths.append(path)
        history.append({n: a.copy() for n, a in state.items()})
        for n, a in state.items():
            step = (rng.random(a.size) < 0.01 + 0.01 * (t % 3)).astype(a.dtype)
            a += step  # one ulp of the stored bits
            if t > 2:
                back = rng.random(a.size) < 0.005
                a[back] = history[int(rng.integers(0, t))][n][back]
    return paths


def expected(paths):
    """Per row: changed elements and the k-step sparsity (NaN where no checkpoint is k back)."""
    states = [{n: bits(a) for n, (_, a) in safetensors_ref.read(p)[0].items()} for p in paths]
    total = sum(c for _, c in TENSORS.values())
    changed, kstep = [], []
    for t in range(1, len(states)):
        changed.append(sum(int(np.count_nonzero(states[t][n] != states[t - 1][n])) for n in TENSORS))
        kstep.append([sum(int(np.count_nonzero(states[t][n] == states[t - k][n])) for n in TENSORS) / total
                      if t - k >= 0 else np.nan for k in KSTEP])
    return np.array(changed), np.array(kstep)


def read_h5(path):
    data = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: data.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
        return data, dict(f.attrs)


def same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "f" and b.dtype.kind == "f":
        return a.shape == b.shape and bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))
    return a.shape == b.shape and bool(np.all(a == b))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--app", required=True)
    parser.add_argument("--mpiexec", required=True)
    parser.add_argument("--mpi-flags", default="")
    args = parser.parse_args()
    # unbound ranks: a rank's threads may run on any core
    mpi = [args.mpiexec] + shlex.split(args.mpi_flags) + ["--bind-to", "none"]
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_series(tmp, np.random.default_rng(5))
        changed, kstep = expected(paths)
        for as_ in ("raw", "bf16"):
            outs = {}
            for np_, threads in ((1, 1), (1, 2), (1, 3), (2, 1), (2, 2)):
                label = f"--as {as_} np {np_} --threads {threads}"
                out = os.path.join(tmp, f"{as_}-np{np_}-t{threads}.h5")
                p = subprocess.run(mpi + ["-n", str(np_), args.app, "--quiet", "--out", out, "--unit-mb", "0.05",
                                          "--as", as_, "--threads", str(threads)] + paths,
                                   capture_output=True, text=True, timeout=300)
                expect(p.returncode == 0, f"{label}: exit {p.returncode}: {p.stderr.strip()[-800:]}")
                if p.returncode != 0:
                    continue
                outs[(np_, threads)], attrs = read_h5(out)
                expect(int(attrs["threads_per_rank"]) == threads, f"{label}: threads_per_rank {attrs['threads_per_rank']}")
            if (1, 1) not in outs:
                continue
            ref = outs[(1, 1)]
            if as_ == "raw":
                expect(np.array_equal(ref["steps/changed"], changed), f"--as raw: changed\n{ref['steps/changed']}\n{changed}")
                expect(same(np.round(ref["kstep/sparsity"], 12), np.round(kstep, 12)), "--as raw: kstep/sparsity")
            for (np_, threads), data in outs.items():
                label = f"--as {as_} np {np_} --threads {threads}"
                expect(set(data) == set(ref), f"{label}: datasets {sorted(set(data) ^ set(ref))}")
                for key, value in ref.items():
                    if key in TIMING or (key == "ranks/read_bytes" and np_ != 1):
                        continue
                    expect(key in data and same(data[key], value), f"{label}: {key} differs from --threads 1 np 1")
        out = os.path.join(tmp, "default.h5")
        p = subprocess.run(mpi + ["-n", "1", args.app, "--quiet", "--out", out] + paths[:3], capture_output=True,
                           text=True, timeout=300)
        expect(p.returncode == 0, f"default threads: exit {p.returncode}: {p.stderr.strip()[-800:]}")
        if p.returncode == 0:
            expect(int(read_h5(out)[1]["threads_per_rank"]) >= 1, "default threads: threads_per_rank")
    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
