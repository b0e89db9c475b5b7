"""Reads stats files written by stats_driver (parallel HDF5 at np 1/2/4) with h5py and h5dump.

Checks every value against the formulas the driver documents, the per-rank columns, the
attributes and the "datasets" index; then SIGKILLs the ranks of a run after k appends (idle, and
while appending) and checks that h5py and `h5dump -H` still read the file with all k rows.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np


def check_file(path, rows, nranks):
    """Checks the first `rows` rows of every series (a run killed inside an append may have one more)."""
    with h5py.File(path, "r") as f:
        for name, entry in json.loads(f.attrs["datasets"]).items():
            if entry["kind"] != "array":
                assert rows <= f[name].shape[0] <= rows + 1, (name, f[name].shape, rows)
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

        for nranks, rows in ((1, 3), (2, 5)):
            path = os.path.join(folder, f"killed_np{nranks}.h5")
            run = subprocess.Popen(launch(nranks) + ["write", path, str(rows), "--hang"], stdout=subprocess.PIPE,
                                   text=True)
            pids = []
            deadline = time.time() + 300
            while len(pids) < nranks and time.time() < deadline:
                line = run.stdout.readline()
                assert line, "driver exited before it was ready"
                if line.startswith("ready "):
                    pids.append(int(line.split()[1]))
            assert len(pids) == nranks, "driver not ready in time"
            for pid in pids:
                os.kill(pid, signal.SIGKILL)  # no destructor, no H5Fclose
            try:
                run.wait(timeout=60)
            except subprocess.TimeoutExpired:
                run.kill()
                run.wait()
            check_file(path, rows, nranks)
            check_h5dump(path, rows)
            print(f"np {nranks}: SIGKILL after {rows} appends leaves {rows} readable rows")

        # killed while appending: whatever append was in flight, the rows reported before it stay
        for attempt, wanted in enumerate((5, 40, 300)):
            path = os.path.join(folder, f"killed_busy_{attempt}.h5")
            run = subprocess.Popen([args.driver, "write", path, "1000000", "--progress"], stdout=subprocess.PIPE,
                                   text=True)
            done = 0
            while done < wanted:
                line = run.stdout.readline()
                assert line, "driver exited early"
                done, pid = map(int, line.split()[1:3])
            os.kill(pid, signal.SIGKILL)
            run.wait(timeout=60)
            with h5py.File(path, "r") as f:
                rows = f["/steps/step"].shape[0]
            assert rows >= done, (rows, done)
            check_file(path, rows - 1 if rows > done else rows, 1)
            header = subprocess.run(["h5dump", "-H", path], capture_output=True, text=True, timeout=60)
            assert header.returncode == 0, header.stderr
            print(f"SIGKILL while appending, {done} appends reported: {rows} rows readable")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
