"""pulse-sft and pulse-train give the same bits whatever BLAS kernel set and BLAS thread count the
machine runs: the model computes every product with pulse::gemm (kernels/gemm.hpp), whose result
does not depend on the CPU's vector width, on threads, or on how many rows share a call.

Each run is repeated under every OpenBLAS kernel set this CPU can execute (Haswell = AVX2 on any
x86-64 with AVX2, SkylakeX = AVX-512 where the CPU has it) and at 1 and 2 OpenBLAS threads, and
compared with the first, every tensor byte for byte and the metadata but rank 0's random run
id: the SFT warm start's weights, and pulse-train's final checkpoint (FP32 master, Adam moments, BF16 versions on every rank) at np 2 (1 trainer + 1
inference rank fed by patches) and np 4 (2 DDP trainers + 2 inference ranks), so rollouts, their
logprobs, the gradients and every patch enter. Before pulse::gemm, the AVX-512 kernels made the
split rollouts' logprobs differ in their last bits (test_train_roles_np4 failed).
    test_blas_independence.py --app build/apps/pulse-train --sft-app build/apps/pulse-sft --mpiexec mpiexec
"""
import argparse
import glob
import os
import shlex
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_ref  # noqa: E402
from expect import expect, failures  # noqa: E402


def kernel_sets():
    """The OPENBLAS_CORETYPE values this CPU can run (none off x86-64)."""
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((line.split(":", 1)[1].split() for line in fh if line.startswith("flags")), [])
    except OSError:
        flags = []
    sets = []
    if "avx2" in flags:
        sets.append("Haswell")
    if "avx512f" in flags:
        sets.append("SkylakeX")
    return sets or [None]


def environments():
    for coretype in kernel_sets():
        for threads in ("1", "2"):
            env = dict(os.environ, OPENBLAS_NUM_THREADS=threads, OMP_NUM_THREADS="1")
            if coretype:
                env["OPENBLAS_CORETYPE"] = coretype
            yield f"OPENBLAS_CORETYPE={coretype} OPENBLAS_NUM_THREADS={threads}", env


# Metadata that differs between any two runs by design: rank 0's random run id, and the
# checkpoint's checksum, which covers it.
PER_RUN_METADATA = {"run_id", "checksum"}


def file_contents(paths):
    """Per file: every tensor's dtype, shape and bytes, and the metadata but for PER_RUN_METADATA."""
    out = {}
    for path in sorted(paths):
        tensors, metadata = safetensors_ref.read(path)
        out[os.path.basename(path)] = (
            {name: (dtype, array.shape, array.tobytes()) for name, (dtype, array) in tensors.items()},
            {k: v for k, v in (metadata or {}).items() if k not in PER_RUN_METADATA})
    return out


def run_sft(app, out, env):
    subprocess.run([app, "--model", "tiny", "--digits", "1", "--steps", "40", "--eval-every", "40", "--out", out],
                   check=True, stdout=subprocess.DEVNULL, env=env, timeout=300)
    return file_contents([os.path.join(out, "model.safetensors")])


def run_train(app, mpi, np_, init, folder, env):
    """The checkpoint files of a run in folder (named alike in every folder: the checkpoints carry
    the config, --out included)."""
    os.makedirs(folder)
    inference = np_ // 2
    args = ["--model", "tiny", "--digits", "1", "--lr", "3e-4", "--warmup-steps", "2", "--group-size", "4",
            "--prompts-per-step", "4", "--steps", "6", "--inference-ranks", str(inference), "--eval-every", "0",
            "--absorption-every", "3", "--checkpoint-every", "0", "--quiet", "--init", init, "--out", "run.h5"]
    p = subprocess.run(mpi + ["-n", str(np_), app] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env=env, cwd=folder, timeout=300)
    expect(p.returncode == 0, f"pulse-train np {np_} failed: {p.stderr.strip()[-500:]}")
    return file_contents(glob.glob(os.path.join(folder, "run.ckpt", "rank-*.safetensors")) +
                      [os.path.join(folder, "run.weights.safetensors")])


def compare(what, runs):
    (first_name, first), rest = runs[0], runs[1:]
    expect(len(first) > 0, f"{what}: no files under {first_name}")
    for name, files in rest:
        expect(files.keys() == first.keys(), f"{what}: {name} wrote {sorted(files)}, {first_name} {sorted(first)}")
        for f in first:
            expect(files.get(f) == first[f], f"{what}: {f} differs between {first_name} and {name}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--app", required=True)
    parser.add_argument("--sft-app", required=True)
    parser.add_argument("--mpiexec", required=True)
    parser.add_argument("--mpi-flags", default="")
    args = parser.parse_args()
    mpi = [args.mpiexec] + shlex.split(args.mpi_flags)
    envs = list(environments())
    print("kernel sets and threads:", ", ".join(name for name, _ in envs))
    with tempfile.TemporaryDirectory() as tmp:
        sft = []
        for i, (name, env) in enumerate(envs):
            sft.append((name, run_sft(args.sft_app, os.path.join(tmp, f"sft{i}"), env)))
        compare("pulse-sft", sft)
        init = os.path.join(tmp, "sft0", "model.safetensors")
        for np_ in (2, 4):
            runs = []
            for i, (name, env) in enumerate(envs):
                runs.append((name, run_train(args.app, mpi, np_, init, os.path.join(tmp, f"np{np_}-{i}"), env)))
            compare(f"pulse-train np {np_}", runs)
    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
