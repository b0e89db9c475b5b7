"""pulse_analysis report figures, read from the matplotlib Figure objects (data, titles, legends,
ticks; not pixels), on statistics files made by a numpy simulation in pulse-train's schema
(synth_runs.py): one seed, and a sweep of 3 seeds + 3 learning rates + 2 model sizes. Also the
paper's numbers (paper.json) against the reference data's text when PULSE_REFERENCE_DIR names the
folder that holds ksparsity_summary.txt (the one-covenant/grail research/sparsity data/).
    python3 tests/analysis/test_figures.py
"""
import os
import re
import sys

import h5py
import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "analysis"))
sys.path.insert(0, HERE)

import synth_runs  # noqa: E402
from pulse_analysis import paper, predict, report, tensor_kinds  # noqa: E402

SEEDS = [1, 2, 3]
LRS = [1e-6, 3e-6, 1e-5]


@pytest.fixture(scope="module")
def one_seed(tmp_path_factory):
    d = tmp_path_factory.mktemp("one")
    path = synth_runs.write(str(d / "run.h5"), seed=1)
    return path, report.write_report([path], str(d / "out"), keep_figures=True), d / "out"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep")
    paths = {("seed", s): synth_runs.write(str(d / f"seed-{s}.h5"), seed=s) for s in SEEDS}
    paths.update({("lr", lr): synth_runs.write(str(d / f"lr-{lr:g}.h5"), seed=7, lr=lr) for lr in LRS if lr != 3e-6})
    paths[("model", "small")] = synth_runs.write(str(d / "small.h5"), seed=8, model="small", scale=3)
    out = report.write_report(list(paths.values()), str(d / "out"), keep_figures=True)
    return paths, out, d / "out"


def legend_texts(ax):
    leg = ax.get_legend()
    return [t.get_text() for t in leg.get_texts()] if leg else []


def bands(ax):
    """fill_between areas (PolyCollections); axhspan is a patch, not one of these."""
    from matplotlib.collections import PolyCollection

    return [c for c in ax.collections if isinstance(c, PolyCollection)]


def lines_by_label(ax):
    return {ln.get_label(): ln for ln in ax.get_lines()}


def check_panels(name, fig):
    """No empty or unlabeled panel; labelled ticks on both axes; integer ticks on step axes."""
    fig.canvas.draw()
    for i, ax in enumerate(fig.axes):
        where = f"{name} panel {i}"
        assert ax.has_data(), f"{where} is empty"
        assert ax.get_title(), f"{where} has no title"
        assert ax.get_xlabel() and ax.get_ylabel(), f"{where} lacks an axis label"
        for axis, lim in ((ax.yaxis, ax.get_ylim()), (ax.xaxis, ax.get_xlim())):
            lo, hi = sorted(lim)
            shown = [t for t in axis.get_major_ticks() if lo <= t.get_loc() <= hi and t.label1.get_text()]
            assert len(shown) >= 2, f"{where}: {len(shown)} labelled ticks on {axis.axis_name}"
        if ax.get_xlabel() in ("step", "num-iterations μ", "async-lag S"):
            lo, hi = sorted(ax.get_xlim())
            ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
            assert all(float(t).is_integer() for t in ticks), f"{where}: fractional ticks {ticks}"


def test_every_panel_is_labelled(one_seed, sweep):
    for _, out, _ in (one_seed, sweep):
        for name, fig in out["figures"].items():
            check_panels(name, fig)


def test_one_seed_draws_no_band_and_says_so(one_seed):
    path, out, _ = one_seed
    figs = out["figures"]
    ax = figs["sparsity"].axes[0]
    assert not bands(ax), "a band with one seed"
    assert "band" not in ax.get_title()
    texts = legend_texts(ax)
    assert any("1 run" in t for t in texts), texts
    with h5py.File(path) as f:
        want = 100 * f["steps/sparsity"][()]
    run_line = [ln for ln in ax.get_lines() if "1 run" in ln.get_label()][0]
    assert np.allclose(run_line.get_ydata(), want)
    left = figs["kstep"].axes[0]
    assert len(bands(left)) == 1 and any("paper" in t for t in legend_texts(left)), "only the paper's range is an area"
    assert [t.get_text() for t in left.get_xticklabels()] == [str(k) for k in synth_runs.K_VALUES]


def test_sweep_figures_only_from_sweeps(one_seed, sweep):
    _, out, d = one_seed
    for name, script in (("staleness", "jobs/staleness.sbatch"), ("lr", "jobs/lr.sbatch"), ("scale", "jobs/scale.sbatch")):
        assert name not in out["figures"] and out["missing"][name] == script
        assert script in (d / "summary.md").read_text()
    paths, out, d = sweep
    assert "lr" in out["figures"] and "scale" in out["figures"] and "staleness" not in out["figures"]
    assert "jobs/staleness.sbatch" in (d / "summary.md").read_text()


def test_three_seeds_make_a_band(sweep):
    paths, out, _ = sweep
    ax = out["figures"]["sparsity"].axes[0]
    assert "min-max over seeds" in ax.get_title()
    seeded = [t for t in legend_texts(ax) if "n=3 seeds" in t]
    assert len(seeded) == 1, legend_texts(ax)
    values = []
    for s in SEEDS:
        with h5py.File(paths[("seed", s)]) as f:
            values.append(100 * f["steps/sparsity"][()])
    values = np.array(values)
    (band,) = [b for b in bands(ax)]
    ys = np.concatenate([p.vertices[:, 1] for p in band.get_paths()])
    assert ys.min() == pytest.approx(values.min()) and ys.max() == pytest.approx(values.max())
    mean_line = [ln for ln in ax.get_lines() if "n=3 seeds" in ln.get_label()][0]
    assert np.allclose(mean_line.get_ydata(), values.mean(axis=0))


def test_lr_and_scale_sweeps_against_the_paper(sweep):
    paths, out, _ = sweep
    ax = out["figures"]["lr"].axes[0]
    k1 = [c for c in ax.containers if c.get_label().startswith("k=1,")]
    assert len(k1) == 1
    x, y = k1[0].lines[0].get_data()
    assert list(x) == LRS
    with h5py.File(paths[("lr", 1e-6)]) as f:
        assert y[0] == pytest.approx(100 * f["steps/sparsity"][()].mean())
    seeds = [100 * h5py.File(paths[("seed", s)])["steps/sparsity"][()].mean() for s in SEEDS]
    assert y[1] == pytest.approx(np.mean(seeds))
    assert "n=1/3 seeds" in k1[0].get_label()
    ref = lines_by_label(ax)[f"paper: {paper.SWEPT_MODEL}, k=1"]
    rows = sorted(paper.kstep_rows(model=paper.SWEPT_MODEL, mu=1, k=1), key=lambda r: r["lr"])
    assert list(ref.get_xdata()) == [r["lr"] for r in rows] and len(rows) == 5
    ax = out["figures"]["scale"].axes[0]
    (k1,) = [c for c in ax.containers if c.get_label().startswith("k=1,")]
    x, _ = k1.lines[0].get_data()
    with h5py.File(paths[("model", "small")]) as f:
        small = int(f.attrs["num_parameters"])
    with h5py.File(paths[("seed", 1)]) as f:
        tiny = int(f.attrs["num_parameters"])
    assert list(x) == [tiny, small]
    assert any(t.startswith("paper: k=1") for t in legend_texts(ax))


def wilson_by_roots(p, n, z=1.959964):
    """The Wilson interval as the two roots of (q - p)^2 = z^2 q (1 - q) / n in q."""
    a = 1 + z * z / n
    return sorted(np.roots([a, -(2 * p + z * z / n), p * p]).real)


def test_pass1_has_wilson_intervals(one_seed):
    path, out, _ = one_seed
    ax = out["figures"]["training"].axes[2]
    (bars,) = ax.containers
    assert "n=128 problems" in bars.get_label() and "Wilson" in bars.get_label()
    with h5py.File(path) as f:
        ev = f["steps/eval_pass1"][()]
    ev = ev[np.isfinite(ev)]
    segs = bars.lines[2][0].get_segments()
    assert len(segs) == len(ev)
    for seg, p in zip(segs, ev):
        lo, hi = wilson_by_roots(p, 128)
        assert seg[0][1] == pytest.approx(100 * lo, rel=1e-6) and seg[1][1] == pytest.approx(100 * hi, rel=1e-6)


def test_grad_sparsity_shows_threshold_zero(one_seed):
    path, out, _ = one_seed
    left = out["figures"]["grad_sparsity"].axes[0]
    with h5py.File(path) as f:
        zero = 100 * f["steps/grad_sparsity"][()][:, 0].mean()
    lines = [ln for ln in left.get_lines() if "exactly zero" in ln.get_label()]
    assert len(lines) == 1 and np.allclose(lines[0].get_ydata(), zero)
    curve = [ln for ln in left.get_lines() if "exactly zero" not in ln.get_label()][0]
    assert all(x > 0 for x in curve.get_xdata()) and len(curve.get_xdata()) == len(synth_runs.THRESHOLDS) - 1


def test_absorption_states_absorbed_vs_unchanged(one_seed):
    path, out, _ = one_seed
    fig = out["figures"]["absorption"]
    text = fig._suptitle.get_text()
    assert "Absorbed" in text and "Unchanged" in text and "FP32 master" in text
    lines = lines_by_label(fig.axes[2])
    with h5py.File(path) as f:
        groups = sorted(f["absorption"])
        steps = [int(g.split("_")[1]) for g in groups]
        absorbed = [100 * f["absorption"][g]["absorbed"][0] / f["absorption"][g]["ratio_counts"][()].sum() for g in groups]
        unchanged = [100 * f["steps/sparsity"][()][s - 1] for s in steps]
    assert np.allclose(lines["run: updates absorbed"].get_ydata(), absorbed)
    assert np.allclose(lines["run: BF16 weights unchanged (measured)"].get_ydata(), unchanged)
    # the two differ, as the title explains: absorbed updates still change weights
    assert min(absorbed) > max(unchanged)


def test_tensor_kinds(one_seed):
    path, out, _ = one_seed
    assert [tensor_kinds.kind(n) for n, _ in synth_runs.TENSORS] == \
        ["embeddings", "norms", "attention", "biases", "MLP", "biases", "norms"]
    assert [tensor_kinds.kind(n) for n in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight",
                                           "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")] == \
        ["attention", "MLP", "embeddings", "norms", "embeddings"]
    left = out["figures"]["tensor_kinds"].axes[0]
    heights = [p.get_height() for p in left.patches]
    labels = [t.get_text().split("\n")[0] for t in left.get_xticklabels()]
    assert labels == ["attention", "MLP", "embeddings", "norms", "biases"]
    with h5py.File(path) as f:
        tc = f["steps/tensor_changed"][()]
        numel = list(f.attrs["tensor_numel"])
    by = {}
    for j, (name, _) in enumerate(synth_runs.TENSORS):
        e, c = by.get(tensor_kinds.kind(name), (0, 0.0))
        by[tensor_kinds.kind(name)] = (e + numel[j], c + tc[:, j].mean())
    assert heights == pytest.approx([100 * by[k][1] / by[k][0] for k in labels])
    assert any("paper" in t for t in legend_texts(left))


def test_bandwidth_labels_its_codec_speeds(one_seed, tmp_path):
    path, out, _ = one_seed
    fig = out["figures"]["bandwidth"]
    assert "measured in run" in fig._suptitle.get_text()
    right = fig.axes[1]
    marks = [ln.get_xdata()[0] for ln in right.get_lines() if ln.get_label().startswith("paper 7B")]
    assert sorted(marks) == [0.2, 20]
    given = report.write_report([path], str(tmp_path), encode_rate=1e10, apply_rate=2e10, keep_figures=True)
    text = given["figures"]["bandwidth"]._suptitle.get_text()
    assert "encode 1e+10 parameters/s (given)" in text and "apply 2e+10 parameters/s (given)" in text


def test_prediction_matches_the_simulation(sweep):
    """The simulated weights follow the model's assumptions (uniform position in the rounding
    cell, sign kept with probability 0.8): the prediction must land within its stated tolerance."""
    paths, out, _ = sweep
    for p in out["predictions"]:
        assert p.within_tolerance, p.statement()
        assert abs(p.relative_error) < 0.1, p.statement()
        assert all(p.kstep_inside()), p.statement()
    fig = out["figures"]["prediction"]
    assert "measured vs predicted" in fig.axes[0].get_title()


def test_prediction_of_a_hand_made_histogram():
    """Ratios 0.5 (half the weights) and 4 (a quarter), zeros (a quarter): P = 0.25 and 1."""
    class A:
        ratio_k = (-2, 4)
        ratio_counts = np.zeros(6 + 4, dtype=np.int64)
        elements = 8
    a = A()
    a.ratio_counts[(-1) - (-2)] = 4     # bin [0.5, 1): centre 2^-0.5
    a.ratio_counts[2 - (-2)] = 2        # bin [4, 8): centre 2^2.5, P = 1
    a.ratio_counts[6] = 2               # zero
    assert predict.changed_fraction(a) == pytest.approx((4 * 2 ** -0.5 / 2 + 2) / 8)
    assert predict.changed_fraction(a, edge="low") == pytest.approx((4 * 0.25 + 2) / 8)
    assert predict.changed_fraction(a, k=4, exponent=1.0) == pytest.approx((4 * 1 + 2) / 8)
    assert predict.changed_fraction(a, k=4, exponent=0.5) == pytest.approx((4 * 2 * 2 ** -0.5 / 2 + 2) / 8)


def test_runs_without_histograms(tmp_path):
    """A pure-BF16 run records no absorption histograms: no absorption or prediction figure, and
    summary.md says why; mixed with a run that has them, only that one is predicted."""
    bf16 = synth_runs.write(str(tmp_path / "bf16.h5"), absorption_every=0)
    out = report.write_report([bf16], str(tmp_path / "alone"), keep_figures=True)
    assert "absorption" not in out["figures"] and "prediction" not in out["figures"] and not out["predictions"]
    assert "--absorption-every" in (tmp_path / "alone" / "summary.md").read_text()
    mixed = synth_runs.write(str(tmp_path / "mixed.h5"), seed=2)
    out = report.write_report([bf16, mixed], str(tmp_path / "both"), keep_figures=True)
    assert [p.run for p in out["predictions"]] == ["mixed"]
    labels = legend_texts(out["figures"]["prediction"].axes[0])
    assert labels and all(lb.startswith("mixed") for lb in labels)


def test_pure_bf16_prediction_against_a_pure_bf16_twin(tmp_path):
    """Same seed, same updates: the mixed run's histograms predict what its pure-BF16 twin measures
    (absorbed updates lost), and the report pairs the two."""
    mixed = synth_runs.write(str(tmp_path / "mixed.h5"), seed=4)
    bf16 = synth_runs.write(str(tmp_path / "bf16.h5"), seed=4, precision="bf16", absorption_every=0)
    other = synth_runs.write(str(tmp_path / "other.h5"), seed=5, precision="bf16", absorption_every=0)
    out = report.write_report([mixed, bf16, other], str(tmp_path / "out"), keep_figures=True)
    (p,) = out["predictions"]
    twins = predict.pure_bf16_twins(p.source, out["runs"])
    assert [q.name for q in twins] == ["bf16"]  # seed 5 is not its twin
    with h5py.File(bf16) as f:
        measured = 1 - f["steps/sparsity"][()].mean()
    assert p.pure_bf16.mean() == pytest.approx(measured, rel=0.1)
    assert p.mean_predicted > 2 * p.pure_bf16.mean()  # the FP32 master is what makes the difference
    assert "`bf16` (pure BF16" in (tmp_path / "out" / "summary.md").read_text()
    assert any(t.startswith("bf16: measured in pure BF16") for t in
               legend_texts(out["figures"]["prediction"].axes[0]))


def test_tables_carry_the_paper_column(one_seed):
    _, out, _ = one_seed
    for row in out["kstep"]:
        want = np.mean([r["mean_pct"] for r in paper.kstep_rows(lr=3e-6, mu=1, k=row["k"])]) / 100
        assert row["paper_mean_sparsity"] == pytest.approx(want) and len(row["paper_models"].split()) == 6
    (row,) = out["summary"]
    assert row["paper_k1_mean_sparsity"] == pytest.approx(out["kstep"][0]["paper_mean_sparsity"])


def test_paper_data_is_complete():
    assert paper.models() == ["Qwen-0.5B", "Gemma-1B", "Qwen-1.5B", "Llama-3B", "Gemma-4B", "Qwen-7B"]
    assert sorted({r["lr"] for r in paper.kstep_rows(model=paper.SWEPT_MODEL, mu=1)}) == [5e-7, 1e-6, 3e-6, 5e-6, 2e-5]
    assert sorted({r["iteration_num"] for r in paper.kstep_rows(model=paper.SWEPT_MODEL, lr=3e-6)}) == [1, 8, 16, 32]
    for r in paper.data()["kstep"]:
        assert 85 < r["min_pct"] <= r["mean_pct"] < 100, r
    for h in paper.data()["headline"]:
        assert h["source"].startswith("arXiv 2602.03839"), h


def test_paper_data_equals_the_reference_text():
    d = os.environ.get("PULSE_REFERENCE_DIR")
    if not d:
        pytest.skip("PULSE_REFERENCE_DIR (the folder with ksparsity_summary.txt) not set")
    with open(os.path.join(d, "ksparsity_summary.txt")) as f:
        text = f.read()
    rows = re.findall(r"\('([^']+)', '(\d+)', '([^']+)', (\d+)\) (\d+) \[([^\]]*)\] \d+ \| ([\d.]+) ([\d.]+) ([\d.]+)", text)
    assert len(rows) == len(paper.data()["kstep"]) == 78
    for model, mu, lr, k, n, seeds, mean, mn, med in rows:
        (r,) = paper.kstep_rows(model=model, mu=int(mu), lr=float(lr), k=int(k))
        assert (r["rows"], r["seeds"]) == (int(n), len(seeds.split(",")))
        assert (r["mean_pct"], r["min_pct"], r["median_pct"]) == (float(mean), float(mn), float(med))


if __name__ == "__main__":
    sys.exit(pytest.main([os.path.abspath(__file__), "-q", "-p", "no:cacheprovider"] + sys.argv[1:]))
