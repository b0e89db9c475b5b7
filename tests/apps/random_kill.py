"""Random-kill test of pulse-train: SIGKILL one random rank at a random moment, resume until done.

Per trial: a layout (np 2 = 1 trainer + 1 inference rank, or np 3 = 2 trainers + 1 inference
rank; the smoke config with few steps), then 1-2 attempts each killed at a random moment (a
random delay, or as soon as a checkpoint or statistics temporary file appears, so the kill lands
inside a checkpoint or statistics write), each followed by `--resume` (or a fresh `--overwrite`
run when no checkpoint exists yet), until a run ends with exit 0. The trial passes when the final
`*.weights.safetensors` is bit-identical to an uninterrupted run's and every statistics dataset
(every series and array) equals the uninterrupted run's, except the timing columns (those whose
`units` attribute is "s").
    random_kill.py --app build/apps/pulse-train --sft-app build/apps/pulse-sft --mpiexec mpiexec \\
        --mpi-flags "--oversubscribe" [--trials 3] [--time-limit 0] [--seed 1]
`--trials 100 --time-limit 3000` is the benchmark-style mode: it runs trials until either limit
and prints how many ran and passed.
"""
import argparse
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

# Wall-clock measurements: the only datasets a resumed run may write differently.
STEPS = 24
LAYOUTS = {2: 1, 3: 1}  # ranks -> inference ranks


def run_args(config, init, out, np_):
    return ["--config", config, "--init", init, "--steps", str(STEPS), "--checkpoint-every", "3",
            "--eval-every", "4", "--absorption-every", "3", "--inference-ranks", str(LAYOUTS[np_]), "--quiet",
            "--out", out]


def rank_pids(mpirun_pid):
    """pid -> MPI rank of the processes mpirun started (read from their environment)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                parent = int(fh.read().rsplit(")", 1)[1].split()[1])
            if parent != mpirun_pid:
                continue
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = dict(kv.split(b"=", 1) for kv in fh.read().split(b"\0") if b"=" in kv)
            if b"OMPI_COMM_WORLD_RANK" in env:
                found[int(entry)] = int(env[b"OMPI_COMM_WORLD_RANK"])
        except (OSError, ValueError, IndexError):
            continue
    return found


def writing(folders):
    """True while a checkpoint or statistics temporary file exists (a write is in progress)."""
    for folder in folders:
        try:
            if any(".tmp." in name for name in os.listdir(folder)):
                return True
        except OSError:
            pass
    return False


def attempt(mpi, app, args, np_, rng, kill_within, watch, out):
    """Runs pulse-train; SIGKILLs one random rank at a random moment within kill_within seconds
    (mostly counted from when the statistics file appears, so most kills land in the training
    loop). Without kill_within it runs to the end. Returns (exit code or None if killed, what
    happened, seconds from the file's appearance to the end)."""
    existed = os.path.exists(out)
    started = time.time()
    p = subprocess.Popen(mpi + ["-n", str(np_), app] + args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    if kill_within is None:
        while not existed and p.poll() is None and not os.path.exists(out):
            time.sleep(0.01)
        appeared = time.time()
        _, err = p.communicate(timeout=600)
        return p.returncode, err.strip()[-300:], time.time() - (started if existed else appeared)
    if rng.random() < 0.8:
        while not existed and p.poll() is None and not os.path.exists(out):
            time.sleep(0.005)
    on_write = rng.random() < 0.4
    deadline = time.time() + rng.uniform(0.0, kill_within)
    while time.time() < deadline and p.poll() is None and not (on_write and writing(watch)):
        time.sleep(0.002 if on_write else 0.01)
    ranks = rank_pids(p.pid)
    if p.poll() is not None or not ranks:
        p.communicate()
        return p.returncode, "finished before the kill", 0
    victim_pid = rng.choice(sorted(ranks))
    during_write = writing(watch)
    try:
        os.kill(victim_pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(p.pid, signal.SIGKILL)  # whatever mpirun left behind
    except ProcessLookupError:
        pass
    p.wait()
    return None, f"killed rank {ranks[victim_pid]}{' during a write' if during_write else ''}", 0


def after_kill(out, ckpt, problems):
    """Checks the killed run's statistics file: h5py reads it, and it holds at least the rows of the
    latest checkpoint (pulse-train flushes before each checkpoint). Returns a note for the log."""
    try:
        with open(os.path.join(ckpt, "LATEST")) as fh:
            latest = int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        latest = 0
    if not os.path.exists(out):
        if latest:
            problems.append(f"no statistics file, checkpoint at step {latest}")
        return " (no file yet)"
    try:
        with h5py.File(out, "r") as f:
            rows = f["/steps/step"].shape[0] if "/steps/step" in f else 0
            for name in ("/steps/loss", "/ranks/version", "/kstep/sparsity"):
                if name in f:
                    f[name][()]  # every row reads
    except Exception as e:  # noqa: BLE001 - any failure to read is the finding
        problems.append(f"h5py cannot read the killed run's file: {e}")
        return " (unreadable file)"
    if rows < latest:
        problems.append(f"file holds {rows} rows, checkpoint at step {latest}")
    return f" ({rows} rows readable, checkpoint {latest})"


def datasets(path):
    """({name: values}, the timing columns: datasets whose units are seconds)."""
    out, timing = {}, set()

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            out["/" + name] = obj[()]
            if obj.attrs.get("units") in ("s", b"s"):
                timing.add("/" + name)
    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return out, timing


def timing_columns(path):
    return datasets(path)[1]


def compare(reference, candidate):
    """Names of the datasets (timing columns excepted) that differ, or are missing on one side."""
    (a, timing), (b, _) = datasets(reference), datasets(candidate)
    differ = sorted(set(a) ^ set(b))
    for name in sorted(set(a) & set(b)):
        if name in timing:
            if a[name].shape != b[name].shape:
                differ.append(name + " (shape)")
        elif a[name].shape != b[name].shape or not np.array_equal(a[name], b[name], equal_nan=True):
            differ.append(name)
    return differ


def read_bytes(path):
    with open(path, "rb") as fh:
        return fh.read()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--app", required=True)
    parser.add_argument("--sft-app", required=True)
    parser.add_argument("--mpiexec", required=True)
    parser.add_argument("--mpi-flags", default="")
    parser.add_argument("--config", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                                         "jobs", "configs", "smoke.toml"))
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--time-limit", type=float, default=0, help="seconds; 0: no limit")
    parser.add_argument("--seed", type=int, default=int(os.environ.get("PULSE_TEST_SEED", "1")))
    args = parser.parse_args()
    mpi = [args.mpiexec] + shlex.split(args.mpi_flags)
    rng = random.Random(args.seed)
    start = time.time()
    tmp = tempfile.mkdtemp(prefix="pulse_random_kill_")
    try:
        sft = os.path.join(tmp, "sft")
        subprocess.run([args.sft_app, "--model", "tiny", "--digits", "1", "--steps", "100", "--eval-every", "100",
                        "--out", sft], check=True, stdout=subprocess.DEVNULL)
        init = os.path.join(sft, "model.safetensors")
        reference, seconds = {}, {}
        for np_ in LAYOUTS:
            out = os.path.join(tmp, f"ref_np{np_}.h5")
            code, err, seconds[np_] = attempt(mpi, args.app, run_args(args.config, init, out, np_), np_, rng, None, [],
                                              out)
            assert code == 0, f"np {np_}: uninterrupted run exit {code}: {err}"
            reference[np_] = out
        ran = passed = 0
        for trial in range(args.trials):
            if args.time_limit and time.time() - start > args.time_limit:
                break
            np_ = rng.choice(sorted(LAYOUTS))
            folder = os.path.join(tmp, f"trial{trial}")
            os.makedirs(folder)
            out = os.path.join(folder, "run.h5")
            ckpt = out[:-3] + ".ckpt"
            events, problems = [], []
            base = run_args(args.config, init, out, np_)
            kills = rng.randint(1, 2)
            code = None
            for n in range(kills + 20):
                resume = os.path.exists(os.path.join(ckpt, "LATEST"))
                flags = ["--resume"] if resume else ["--overwrite"]
                code, what, _ = attempt(mpi, args.app, base + flags, np_, rng,
                                        seconds[np_] * 1.1 if n < kills else None, [folder, ckpt], out)
                events.append(("resume: " if resume else "fresh: ") + what)
                if code is None:
                    events[-1] += after_kill(out, ckpt, problems)
                if code == 0:
                    break
                if code is not None:
                    events.append(f"exit {code}")
                    break
            ran += 1
            if code != 0:
                problems.append(f"the run did not end (exit {code})")
            else:
                ref_weights = reference[np_][:-3] + ".weights.safetensors"
                if read_bytes(ref_weights) != read_bytes(out[:-3] + ".weights.safetensors"):
                    problems.append("final weights differ")
                differ = compare(reference[np_], out)
                if differ:
                    problems.append(f"datasets differ: {differ[:8]}")
            ok = not problems
            passed += ok
            print(f"trial {trial} np {np_}: {'; '.join(events)} -> {'ok' if ok else 'FAIL: ' + '; '.join(problems)}",
                  flush=True)
            if ok:
                shutil.rmtree(folder, ignore_errors=True)
        print(f"{passed} of {ran} trials passed ({time.time() - start:.0f} s; timing columns not compared: "
              f"{', '.join(sorted(timing_columns(reference[min(reference)])))})")
        return 0 if ran > 0 and passed == ran else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
