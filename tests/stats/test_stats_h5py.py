"""Reads stats files written by stats_driver (np 1/2/4) with h5py and h5dump.

Checks every value against the formulas the driver documents, the per-rank columns, the
attributes and the "datasets" index. Then SIGKILLs runs: idle after a flush (every row kept),
idle with unflushed rows (exactly the flushed rows kept), and a random rank at a random moment
while appending, flushing every row or every few rows (so many kills land inside a flush): h5py
and `h5dump -H` must read every row up to the last flush reported before the kill, the file must
hold no partial row, and stats_driver must resume it, append again and leave no temporary file.
"""
import argparse
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np


def check_file(path, rows, nranks):
    """Checks that every series has exactly `rows` rows, with the driver's values."""
    with h5py.File(path, "r") as f:
        for name, entry in json.loads(f.attrs["datasets"]).items():
            if entry["kind"] != "array":
                assert f[name].shape[0] == rows, (name, f[name].shape, rows)
        assert f.attrs["pulse_stats_format"] == 1
        assert f.attrs["program"] == "stats_driver"
        assert f.attrs["ranks"] == nranks
        assert list(f.attrs["tensor_names"]) == ["wte", "h.0.mlp", "lm_head"]
        steps = np.arange(rows)
        np.testing.assert_array_equal(f["/steps/step"][:rows], steps)
        np.testing.assert_array_equal(f["/steps/loss"][:rows], 1.0 / (steps + 1))
        reward = f["/steps/reward"][:rows]
        np.testing.assert_array_equal(reward[0::2], steps[0::2] / 4.0)
        assert np.isnan(reward[1::2]).all()
        changed = f["/steps/tensor_changed"]
        assert changed.shape[1] == 3 and changed.dtype == np.int64
        np.testing.assert_array_equal(changed[:rows], 10 * steps[:, None] + np.arange(3)[None, :])
        assert list(changed.attrs["tensor_names"]) == ["wte", "h.0.mlp", "lm_head"]
        sparsity = f["/kstep/sparsity"]
        np.testing.assert_array_equal(sparsity.attrs["k_values"], [1.0, 4.0])
        np.testing.assert_array_equal(sparsity[:rows], steps[:, None] + np.array([1, 4])[None, :] / 8.0)
        ranks = np.arange(nranks)
        sent = f["/ranks/bytes_sent"]
        assert sent.shape[1] == nranks
        np.testing.assert_array_equal(sent[:rows], 1000 * ranks[None, :] + steps[:, None])
        np.testing.assert_array_equal(f["/ranks/compute_seconds"][:rows], ranks[None, :] + steps[:, None] / 2.0)
        np.testing.assert_array_equal(f["/absorption/step_000000/counts"][:], [[5, 6, 7], [8, 9, 10]])
        # every dataset is documented twice: in its own attributes and in the root index
        index = json.loads(f.attrs["datasets"])
        found = []
        f.visititems(lambda name, obj: found.append("/" + name) if isinstance(obj, h5py.Dataset) else None)
        assert sorted(found) == sorted(index), (found, index)
        for name, entry in index.items():
            assert f[name].attrs["units"] == entry["units"]
            assert f[name].attrs["description"] == entry["description"]
        assert index["/ranks/bytes_sent"]["kind"] == "per_rank"
        assert index["/steps/loss"] == {"kind": "per_step", "units": "nats", "description": "1 / (step + 1)"}
        assert index["/absorption/step_000000/counts"]["kind"] == "array"


def check_h5dump(path, rows):
    header = subprocess.run(["h5dump", "-H", path], capture_output=True, text=True, timeout=60)
    assert header.returncode == 0, header.stderr
    assert f"DATASPACE  SIMPLE {{ ( {rows} ) / ( H5S_UNLIMITED ) }}" in header.stdout, header.stdout


def stop(run):
    """Waits for mpiexec after a kill (it ends the other ranks), killing it if it lingers."""
    try:
        run.wait(timeout=60)
    except subprocess.TimeoutExpired:
        run.kill()
        run.wait()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--driver", required=True)
    parser.add_argument("--mpiexec", required=True)
    parser.add_argument("--mpiexec-flags", default="-n")  # the np flag, then extra flags
    args = parser.parse_args()
    np_flag, *extra = args.mpiexec_flags.split()
    launch = lambda n: [args.mpiexec, np_flag, str(n), *extra, args.driver]
    folder = tempfile.mkdtemp(prefix="pulse_stats_h5py_")
    try:
        for nranks in (1, 2, 4):
            path = os.path.join(folder, f"run_np{nranks}.h5")
            subprocess.run(launch(nranks) + ["write", path, "9"], check=True, timeout=300)
            check_file(path, 9, nranks)
            check_h5dump(path, 9)
            print(f"np {nranks}: 9 rows read back by h5py and h5dump")

        # killed idle: after a flush every row is there; without one, exactly the flushed rows
        for nranks, rows, flush_every, mode, kept in ((1, 3, 0, "--hang", 3), (2, 5, 0, "--hang", 5),
                                                       (2, 10, 4, "--hang-unflushed", 8)):
            path = os.path.join(folder, f"killed_np{nranks}_{mode[2:]}.h5")
            command = launch(nranks) + ["write", path, str(rows), mode]
            if flush_every:
                command += ["--flush-every", str(flush_every)]
            run = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
            pids = []
            deadline = time.time() + 300
            while len(pids) < nranks and time.time() < deadline:
                line = run.stdout.readline()
                assert line, "driver exited before it was ready"
                if line.startswith("ready "):
                    pids.append(int(line.split()[1]))
            assert len(pids) == nranks, "driver not ready in time"
            for pid in pids:
                os.kill(pid, signal.SIGKILL)  # no destructor, no last flush
            stop(run)
            check_file(path, kept, nranks)
            check_h5dump(path, kept)
            print(f"np {nranks}: SIGKILL after {rows} appends ({mode}) leaves {kept} readable rows")

        # killed at a random moment while appending (often inside a flush), a random rank
        rng = random.Random(int(os.environ.get("PULSE_TEST_SEED", "12")))
        for trial in range(8):
            nranks = (1, 2)[trial % 2]
            flush_every = (1, 3)[(trial // 2) % 2]
            path = os.path.join(folder, f"killed_busy_{trial}.h5")
            command = launch(nranks) + ["write", path, "1000000", "--progress", "--flush-every", str(flush_every)]
            run = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
            pids, done, flushed = [], 0, 0
            wanted = rng.randint(1, 60)
            while done < wanted:
                line = run.stdout.readline()
                assert line, "driver exited early"
                if line.startswith("pid "):
                    pids.append(int(line.split()[1]))
                else:
                    done, flushed = int(line.split()[1]), int(line.split()[3])
            assert len(pids) == nranks, pids
            time.sleep(rng.uniform(0, 0.02))
            victim = rng.choice(pids)
            os.kill(victim, signal.SIGKILL)
            stop(run)
            with h5py.File(path, "r") as f:
                rows = f["/steps/step"].shape[0]
            assert rows >= flushed, (rows, flushed)
            assert rows % flush_every == 0, (rows, flush_every)  # only whole flushes reach the file
            check_file(path, rows, nranks)
            check_h5dump(path, rows)
            left = len(glob.glob(path + ".tmp.*"))  # > 0 when the kill landed inside a flush
            keep = rng.randint(0, rows)
            subprocess.run(launch(nranks) + ["resume", path, str(keep), str(rows + 7)], check=True, timeout=120)
            check_file(path, rows + 7, nranks)
            assert not glob.glob(path + ".tmp.*"), glob.glob(path + ".tmp.*")
            print(f"np {nranks}, flush every {flush_every}: SIGKILL of rank pid {victim} after >= {done} appends "
                  f"({flushed} flushed): {rows} rows readable, {left} temporary file(s) left; resumed at {keep} to {rows + 7}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
