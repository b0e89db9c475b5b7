"""Errors found after MPI has started end the job as one line: bad input that one rank or every rank
meets once the run is under way (folders where the ranks' checkpoints, the final weights or the
statistics file go) is agreed on by every rank, rank 0 prints it, and
every rank finalizes: no MPI_ABORT banner, no line per rank, a non-zero exit. pulse-train and
pulse-measure are the MPI apps (pulse-sft, pulse-sync and pulse-absorb are single processes).
    test_mpi_errors.py --train build/apps/pulse-train --measure build/apps/pulse-measure \
        --mpiexec mpiexec --mpi-flags "--oversubscribe"
"""
import argparse
import os
import shlex
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_ref as st  # noqa: E402

from expect import expect, failures  # noqa: E402

TIMEOUT = 300  # a rank left waiting in a collective call would hang: far more than a run needs


# An OpenMP Kokkos (make test-openmp) warns on stderr about thread binding and oversubscription
# unless each rank runs one thread, unbound: the apps' own lines are what is counted here.
QUIET_OPENMP = {"OMP_NUM_THREADS": "1", "OMP_PROC_BIND": "false", "OMP_WAIT_POLICY": "passive"}


def run(mpi, np_, app, args):
    try:
        p = subprocess.run(mpi + ["-n", str(np_), app] + [str(a) for a in args], capture_output=True, text=True,
                           timeout=TIMEOUT, env={**os.environ, **QUIET_OPENMP})
        return p.returncode, p.stderr
    except subprocess.TimeoutExpired:
        return None, "timed out (a rank left waiting)"


def one_line(code, err, *words):
    """Exited non-zero with exactly one stderr line, holding every word, and no MPI banner."""
    lines = err.strip().splitlines()
    return (code not in (None, 0) and len(lines) == 1 and all(w in lines[0] for w in words)
            and "MPI_ABORT" not in err and "mpirun" not in err)


def show(code, err):
    return f"exit {code}: {err.strip()[-600:]!r}"


def checkpoint(path, step, elements=1 << 16):
    """A BF16 checkpoint whose weights move a little from step to step."""
    rng = np.random.default_rng(step)
    w = (rng.standard_normal(elements).astype(np.float32) * 0.02).view(np.uint32)
    bf16 = (w >> 16).astype(np.uint16)
    st.write(path, [("blocks.0.w", "BF16", bf16), ("blocks.1.w", "BF16", bf16[::-1])])


def check_measure(app, mpi, d):
    """--overwrite --out naming a folder: the statistics file, which every rank opens together once
    the checkpoints are checked, is refused on every rank."""
    paths = [os.path.join(d, f"step{s}.safetensors") for s in range(3)]
    for s, p in enumerate(paths):
        checkpoint(p, s)
    out = os.path.join(d, "measure.h5")
    os.makedirs(os.path.join(out, "kept"))
    code, err = run(mpi, 2, app, ["--quiet", "--overwrite", "--out", out] + paths)
    expect(one_line(code, err, "pulse-measure:", "measure.h5", "not a regular file"),
           f"pulse-measure, a folder for --out: {show(code, err)}")
    expect(os.path.isdir(os.path.join(out, "kept")), "pulse-measure, a folder for --out: the folder is kept")


TRAIN = ["--model", "tiny", "--digits", "1", "--steps", "2", "--prompts-per-step", "2", "--group-size", "4",
         "--eval-every", "0", "--absorption-every", "0", "--quiet", "--sft-steps", "0"]


def check_train(app, mpi, d):
    # Where the final weights go, a folder: rank 0 alone fails, after training.
    out = os.path.join(d, "a.h5")
    os.makedirs(os.path.join(d, "a.weights.safetensors"))
    code, err = run(mpi, 2, app, TRAIN + ["--inference-ranks", "1", "--checkpoint-every", "0", "--out", out])
    expect(one_line(code, err, "pulse-train:", "a.weights.safetensors"), f"pulse-train, a folder for the weights: {show(code, err)}")
    # Where rank 1's checkpoint of step 1 goes, a folder: rank 1 alone fails, after training step 1.
    out = os.path.join(d, "b.h5")
    os.makedirs(os.path.join(d, "b.ckpt", "rank-1-step-1.safetensors"))
    code, err = run(mpi, 2, app, TRAIN + ["--inference-ranks", "0", "--checkpoint-every", "1", "--out", out])
    expect(one_line(code, err, "pulse-train:", "rank-1-step-1.safetensors"),
           f"pulse-train, a folder for rank 1's checkpoint: {show(code, err)}")
    # The same for both ranks: each fails, one line says so.
    out = os.path.join(d, "c.h5")
    for rank in (0, 1):
        os.makedirs(os.path.join(d, "c.ckpt", f"rank-{rank}-step-1.safetensors"))
    code, err = run(mpi, 2, app, TRAIN + ["--inference-ranks", "1", "--checkpoint-every", "1", "--out", out])
    expect(one_line(code, err, "pulse-train:", "rank-0-step-1.safetensors"),
           f"pulse-train, a folder for every rank's checkpoint: {show(code, err)}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--train", required=True)
    parser.add_argument("--measure", required=True)
    parser.add_argument("--mpiexec", required=True)
    parser.add_argument("--mpi-flags", default="")
    args = parser.parse_args()
    mpi = [args.mpiexec] + shlex.split(args.mpi_flags)
    # Open MPI's mpirun adds its own notice when a process exits non-zero ("Primary job terminated
    # normally, but 1 process returned a non-zero exit code"); -q leaves the app's stderr alone.
    version = subprocess.run([args.mpiexec, "--version"], capture_output=True, text=True).stdout
    if "Open MPI" in version or "OpenRTE" in version:
        mpi.append("-q")
    with tempfile.TemporaryDirectory() as tmp:
        for name, check, app in [("measure", check_measure, args.measure), ("train", check_train, args.train)]:
            d = os.path.join(tmp, name)
            os.makedirs(d)
            check(app, mpi, d)
    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
