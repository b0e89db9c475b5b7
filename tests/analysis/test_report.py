"""pulse_analysis report on statistics files pulse-train writes at test time (smoke config from a
short pulse-sft warm start on 1-digit addition, so rewards vary and weights change: two seeds of one
variant, a num-iterations = 2 and an async-lag = 1 variant, and DDP, DiLoCo and PULSELoCo without
inference ranks): every figure and table is built, every number in the tables equals the value
recomputed here, independently, from the datasets, and every figure panel has data, labels and
labelled ticks, for the whole set and for one seed alone (figure details: test_figures.py).
    python3 tests/analysis/test_report.py --app build/apps/pulse-train --sft build/apps/pulse-sft
"""
import csv
import math
import os
import subprocess
import sys
import tomllib

import h5py
import numpy as np
import pytest

from conftest import launcher

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOKE = os.path.join(ROOT, "jobs", "configs", "smoke.toml")
EXTRA = ["--digits", "1", "--absorption-every", "3", "--eval-every", "3", "--quiet"]
LOCO = ["--seed", "1", "--inference-ranks", "0", "--inner-steps", "2", "--trainer-sync"]
RUNS = {  # name: (ranks, flags)
    "seed-1": (3, ["--seed", "1"]), "seed-2": (3, ["--seed", "2"]),
    "mu2-seed-1": (3, ["--seed", "1", "--num-iterations", "2"]), "lag1-seed-1": (3, ["--seed", "1", "--async-lag", "1"]),
    "ddp": (2, LOCO + ["ddp"]), "diloco": (2, LOCO + ["diloco"]), "pulseloco": (2, LOCO + ["pulseloco"])}
# the staleness sweep is here (μ 1, 2 and lag 0, 1); lr and model sweeps are not
FIGURES = ["sparsity", "kstep", "staleness", "absorption", "prediction", "tensor_kinds", "grad_sparsity", "training",
           "comm", "sync", "bandwidth"]
REL = 1e-12


sys.path.insert(0, os.path.join(ROOT, "analysis"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_figures import check_panels  # noqa: E402
from pulse_analysis import report as report_module  # noqa: E402


def run_report(files, out, *extra):
    return subprocess.run([sys.executable, "-m", "pulse_analysis", "report", *map(str, files), "-o", str(out), *extra],
                          cwd=os.path.join(ROOT, "analysis"), capture_output=True, text=True)


@pytest.fixture(scope="session")
def runs(pytestconfig, tmp_path_factory):
    d = tmp_path_factory.mktemp("runs")
    # without a warm start no rollout is ever rewarded and no weight changes
    sft = [os.path.abspath(pytestconfig.getoption("--sft")), "--model", "tiny", "--digits", "1", "--steps", "100", "--eval-every", "100",
           "--out", str(d / "sft")]
    p = subprocess.run(sft, capture_output=True, text=True)
    assert p.returncode == 0, f"{' '.join(sft)} failed:\n{p.stdout}\n{p.stderr}"
    paths = []
    for name, (ranks, flags) in RUNS.items():
        out = d / f"{name}.h5"
        cmd = launcher(pytestconfig, ranks) + [os.path.abspath(pytestconfig.getoption("--app")), "--config", SMOKE, "--out", str(out)]
        p = subprocess.run(cmd + EXTRA + ["--init", str(d / "sft" / "model.safetensors")] + flags, cwd=d,
                           capture_output=True, text=True)
        assert p.returncode == 0, f"{' '.join(cmd)} failed:\n{p.stdout}\n{p.stderr}"
        paths.append(out)
    return paths


@pytest.fixture(scope="session")
def report(runs, tmp_path_factory):
    d = tmp_path_factory.mktemp("report")
    out = d / "out"
    p = run_report(runs, out)
    assert p.returncode == 0, p.stderr
    return out


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def close(got, want, what):
    g = math.nan if got == "" else float(got)
    if math.isnan(want):
        assert math.isnan(g), f"{what}: table {got!r}, expected no value"
    else:
        assert g == pytest.approx(want, rel=REL, abs=1e-300), f"{what}: table {got}, recomputed {want}"


def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def config(f):
    c = tomllib.loads(text(f.attrs["config"]))
    return lambda key, default: c.get(key, c.get(key.replace("-", "_"), default))


def test_files_have_one_row_per_step(runs):
    for path in runs:
        with h5py.File(path, "r") as f:
            steps = config(f)("steps", None)
            assert steps, f"{path}: no steps in the config attribute"
            for group in ("steps", "kstep", "ranks"):
                for name, d in f[group].items():
                    assert d.shape[0] == steps, f"{path}:/{group}/{name} has {d.shape[0]} rows, config steps {steps}"
            assert list(f["steps/step"][()]) == list(range(1, steps + 1))
            assert len(f["absorption"]) >= 1, f"{path}: --absorption-every 3 wrote no /absorption group"


def test_every_figure_and_table_is_built(report, runs):
    for name in FIGURES:
        with open(report / f"{name}.png", "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n", f"{name}.png is not a PNG image"
        assert os.path.getsize(report / f"{name}.png") > 10_000, f"{name}.png is suspiciously small"
    md = (report / "summary.md").read_text()
    for name in FIGURES:
        assert f"]({name}.png)" in md
    for path in runs:
        assert f"| {path.stem} |" in md, f"{path.stem} has no row in summary.md"
    for table in ("summary", "kstep", "comm", "bandwidth"):
        assert read_csv(report / f"{table}.csv"), f"{table}.csv is empty"
    for script in ("jobs/lr.sbatch", "jobs/scale.sbatch"):  # the sweeps these runs lack
        assert script in md


def test_figure_panels(runs, tmp_path):
    """Every panel of every figure has data, a title, axis labels and labelled ticks, for all the
    runs (two seeds of one variant: a band) and for one seed alone (no band)."""
    for files, out in ((runs, tmp_path / "all"), (runs[:1], tmp_path / "one")):
        got = report_module.write_report([str(f) for f in files], str(out), keep_figures=True)
        for name, fig in got["figures"].items():
            check_panels(name, fig)
        ax = got["figures"]["sparsity"].axes[0]
        assert ("min-max over seeds" in ax.get_title()) == (len(files) > 1)
    # the prediction from the absorption histograms is stated for each run that has them
    md = (out / "summary.md").read_text()
    assert "predicted" in md and "measured" in md


def expected_summary(path):
    """Each summary column recomputed from the datasets (definitions: report.SUMMARY_COLUMNS)."""
    with h5py.File(path, "r") as f:
        s = {k: d[()] for k, d in f["steps"].items()}
        cfg = config(f)
        trainers = [r for r, role in enumerate(f.attrs["roles"]) if text(role) == "trainer"]
        sent = f["ranks/trainer_bytes_sent"][()][:, trainers].sum(axis=1)
        gate = s["gate_density"][~np.isnan(s["gate_density"])]
        last = f["absorption"][sorted(f["absorption"])[-1]]
        recorded = [int(g.split("_")[1]) for g in f["absorption"]]
        absorbed = last["absorbed"][0] / last["ratio_counts"][()].sum()
        kv = [int(k) for k in f["kstep/sparsity"].attrs["k_values"]]
        ks = f["kstep/sparsity"][()]
        ev = s["eval_pass1"][~np.isnan(s["eval_pass1"])]
        want = {
            "steps": len(s["step"]), "num_parameters": int(f.attrs["num_parameters"]),
            "trainer_sync": text(f.attrs["trainer_sync"]), "model": text(f.attrs["model"]),
            "seed": cfg("seed", ""), "num_iterations": cfg("num-iterations", ""), "async_lag": cfg("async-lag", ""),
            "lr": float(cfg("lr", math.nan)),
            "mean_sparsity": s["sparsity"].sum() / len(s["sparsity"]), "min_sparsity": s["sparsity"].min(),
            "mean_patch_bytes": s["patch_bytes"].sum() / len(s["step"]),
            "mean_dense_bytes": s["dense_bytes"].sum() / len(s["step"]),
            "compression_vs_dense": s["dense_bytes"].sum() / s["patch_bytes"].sum(),
            "bits_per_changed": 8 * s["patch_bytes"].sum() / s["changed"].sum(),
            "mean_trainer_bytes_sent": sent.sum() / len(sent), "outer_steps": int(s["outer_step"].sum()),
            "mean_gate_density": gate.sum() / len(gate) if len(gate) else math.nan,
            "final_reward": s["reward"][-1], "mean_reward": s["reward"].sum() / len(s["step"]),
            "final_loss": s["loss"][-1], "final_eval_pass1": ev[-1] if len(ev) else math.nan,
            "mean_step_s": s["step_s"].sum() / len(s["step"]), "absorbed_fraction": absorbed,
            "measured_changed_at_absorption": sum(1 - s["sparsity"][t - 1] for t in recorded) / len(recorded),
        }
        for j, k in enumerate(kv):
            col = ks[:, j][~np.isnan(ks[:, j])]
            want[f"k{k}_mean_sparsity"] = col.sum() / len(col) if len(col) else math.nan
        return want


def test_summary_equals_the_datasets(report, runs):
    table = {r["run"]: r for r in read_csv(report / "summary.csv")}
    assert set(table) == {p.stem for p in runs}
    for path in runs:
        row = table[path.stem]
        for col, want in expected_summary(path).items():
            if isinstance(want, str) or isinstance(want, int) and not isinstance(want, bool):
                assert row[col] == str(want), f"{path.stem} {col}: table {row[col]!r}, file {want!r}"
            else:
                close(row[col], float(want), f"{path.stem} {col}")
    # the variants: the runs really differ where the flags say so
    assert table["seed-1"]["seed"] != table["seed-2"]["seed"]
    assert table["mu2-seed-1"]["num_iterations"] == "2" and table["lag1-seed-1"]["async_lag"] == "1"
    # the warm start works: weights change, so sparsity, patch sizes and the bandwidth model mean something
    assert all(float(r["min_sparsity"]) < 1 for r in table.values())
    # the LoCo runs synchronise every --inner-steps 2 steps, DDP every step
    assert int(table["diloco"]["outer_steps"]) == int(table["diloco"]["steps"]) // 2
    assert int(table["ddp"]["outer_steps"]) == int(table["ddp"]["steps"])


def test_kstep_table(report, runs):
    table = read_csv(report / "kstep.csv")
    for path in runs:
        with h5py.File(path, "r") as f:
            ks = f["kstep/sparsity"][()]
            for j, k in enumerate(int(k) for k in f["kstep/sparsity"].attrs["k_values"]):
                col = ks[:, j][~np.isnan(ks[:, j])]
                rows = [r for r in table if r["run"] == path.stem and int(r["k"]) == k]
                if not len(col):
                    assert not rows, f"{path.stem} k={k}: no data but a row"
                    continue
                assert len(rows) == 1 and int(rows[0]["steps"]) == len(col)
                close(rows[0]["mean_sparsity"], col.sum() / len(col), f"{path.stem} k={k} mean")
                close(rows[0]["min_sparsity"], col.min(), f"{path.stem} k={k} min")


def test_comm_table(report, runs):
    per_method = {}
    for path in runs:
        with h5py.File(path, "r") as f:
            trainers = [r for r, role in enumerate(f.attrs["roles"]) if text(role) == "trainer"]
            sent = f["ranks/trainer_bytes_sent"][()][:, trainers].sum(axis=1).astype(float)
            per_method.setdefault(text(f.attrs["trainer_sync"]), []).append(sent)
    table = {r["method"]: r for r in read_csv(report / "comm.csv")}
    assert set(table) == set(per_method) == {"ddp", "diloco", "pulseloco"}
    for m, series in per_method.items():
        assert int(table[m]["runs"]) == len(series)
        close(table[m]["mean_bytes_per_step"], sum(s.mean() for s in series) / len(series), f"{m} bytes/step")
        close(table[m]["mean_total_bytes"], sum(s.sum() for s in series) / len(series), f"{m} total bytes")


def expected_bandwidth(path, bandwidths_gbps, params=None, compute_s=None):
    with h5py.File(path, "r") as f:
        s = {k: d[()] for k, d in f["steps"].items()}
        n_run = int(f.attrs["num_parameters"])
    n = params or n_run
    c = 1 - s["sparsity"].mean()
    patch = c * n * (8 * s["patch_bytes"].sum() / s["changed"].sum()) / 8
    dense = s["dense_bytes"].sum() / (len(s["step"]) * n_run) * n
    codec = n * s["encode_s"].mean() / n_run + n * s["apply_s"].mean() / n_run
    tc = compute_s or (s["step_s"] - s["sync_s"]).mean()
    rows = []
    for g in bandwidths_gbps:
        td, tp = 8 * dense / (g * 1e9), codec + 8 * patch / (g * 1e9)
        rows.append({"dense_s": td, "patch_s": tp, "winner": "patch" if tp < td else "dense",
                     "utilisation": tc / (tc + min(td, tp))})
    return rows


def check_bandwidth(table, want):
    assert len(table) == len(want)
    for row, w in zip(table, want):
        assert row["winner"] == w["winner"], f"{row['bandwidth_gbps']} Gbit/s: winner {row['winner']}, expected {w}"
        for col in ("dense_s", "patch_s", "utilisation"):
            assert float(row[col]) == pytest.approx(w[col], rel=1e-9), f"{row['bandwidth_gbps']} Gbit/s {col}"


def test_bandwidth_table(report, runs):
    check_bandwidth(read_csv(report / "bandwidth.csv"), expected_bandwidth(runs[0], [0.1, 1, 10, 100, 400]))


def test_bandwidth_options(runs, tmp_path):
    bws = [0.001, 0.01, 1, 1000]
    p = run_report(runs[:1], tmp_path, "--params", "7e9", "--compute-s", "12", "--bandwidth-gbps", ",".join(map(str, bws)))
    assert p.returncode == 0, p.stderr
    want = expected_bandwidth(runs[0], bws, params=7e9, compute_s=12)
    check_bandwidth(read_csv(tmp_path / "bandwidth.csv"), want)
    # at 7e9 parameters and 1 Mbit/s the patch must beat dense BF16 (its bytes are far smaller)
    assert want[0]["winner"] == "patch"


def test_bad_inputs_fail_with_one_line(runs, tmp_path):
    bogus = tmp_path / "bogus.h5"
    bogus.write_text("not HDF5")
    p = run_report([bogus], tmp_path / "out")
    assert p.returncode != 0 and "bogus.h5" in p.stderr and "Traceback" not in p.stderr, p.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([os.path.abspath(__file__), "-q", "-p", "no:cacheprovider"] + sys.argv[1:]))
