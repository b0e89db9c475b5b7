"""The report's rules for describing runs, one test each, on statistics files made by the numpy
simulation (synth_runs.py) and then edited as pulse-measure or the recorder would write them:
- runs are grouped by config without the seed, and "n seeds" only where they differ in seed alone
  (runs without a config, or repeating a seed, are never grouped; different lr never);
- a --label names its group;
- the prediction follows each run's precision (mixed: FP32-master model; bf16: 1 - absorbed, exact;
  anything else: none), and a mixed run is paired with a pure-BF16 twin only of its own config;
- a figure whose series no file holds is not drawn (training without reward, loss, pass@1);
- trainer-to-trainer communication only for runs with >= 2 trainer ranks;
- a run in both regimes (mixed and its pure-BF16 twin) side by side with the paper's numbers;
- the k-step figure's legend lies outside its axes (it covered the paper's band).
    python3 tests/analysis/test_run_rules.py
"""
import os
import sys

import h5py
import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "analysis"))
sys.path.insert(0, HERE)

import synth_runs  # noqa: E402
from pulse_analysis import predict, report  # noqa: E402
from pulse_analysis.runs import Run, group_runs  # noqa: E402


def edit(path, attrs=None, drop_attrs=(), drop=()):
    with h5py.File(path, "a") as f:
        f.attrs.update(attrs or {})
        for a in drop_attrs:
            del f.attrs[a]
        for d in drop:
            del f[d]
    return path


def groups_of(paths):
    return [(label, [r.name for r in rs]) for label, rs in group_runs([Run(p) for p in paths])]


def sparsity_legend(out):
    leg = out["figures"]["sparsity"].axes[0].get_legend()
    return [t.get_text() for t in leg.get_texts()]


def test_seeds_of_one_config_form_one_group(tmp_path):
    paths = [synth_runs.write(str(tmp_path / f"s{s}.h5"), seed=s, steps=12) for s in (1, 2, 3)]
    paths.append(synth_runs.write(str(tmp_path / "lr.h5"), seed=1, lr=1e-5, steps=12))
    assert groups_of(paths) == [("lr=3e-06", ["s1", "s2", "s3"]), ("lr=1e-05", ["lr"])]
    out = report.write_report(paths, str(tmp_path / "out"), keep_figures=True)
    legend = sparsity_legend(out)
    assert any("lr=3e-06" in t and "n=3 seeds" in t for t in legend), legend
    assert any("lr=1e-05 (1 run)" in t for t in legend), legend


def test_runs_without_a_config_are_never_seeds(tmp_path):
    """pulse-measure files without --set: four different runs must not become "n=4 seeds"."""
    paths = [edit(synth_runs.write(str(tmp_path / f"m{i}.h5"), seed=i, lr=lr, steps=12), drop_attrs=["config"])
             for i, lr in enumerate((3e-6, 1e-4, 3e-6, 1e-4))]
    groups = groups_of(paths)
    assert [rs for _, rs in groups] == [["m0"], ["m1"], ["m2"], ["m3"]]
    out = report.write_report(paths, str(tmp_path / "out"), keep_figures=True)
    assert not any("seeds" in t for t in sparsity_legend(out)), sparsity_legend(out)


def test_a_repeated_seed_is_not_a_second_seed(tmp_path):
    a = synth_runs.write(str(tmp_path / "a.h5"), seed=1, steps=12)
    b = synth_runs.write(str(tmp_path / "b.h5"), seed=1, steps=12)
    assert [rs for _, rs in groups_of([a, b])] == [["a"], ["b"]]
    no_seed = [edit(synth_runs.write(str(tmp_path / f"n{s}.h5"), seed=s, steps=12),
                    {"config": 'model = "tiny"\nlr = 3e-06\n'}) for s in (1, 2)]
    assert [rs for _, rs in groups_of(no_seed)] == [["n1"], ["n2"]]


def test_a_label_names_the_group(tmp_path):
    paths = [edit(synth_runs.write(str(tmp_path / f"s{s}.h5"), seed=s, steps=12), {"label": "bf16, lr 3e-6"})
             for s in (1, 2)]
    assert groups_of(paths) == [("bf16, lr 3e-6", ["s1", "s2"])]


def test_prediction_follows_the_precision(tmp_path):
    mixed = synth_runs.write(str(tmp_path / "mixed.h5"), seed=1, steps=12, absorption_every=3)
    pure = synth_runs.write(str(tmp_path / "pure.h5"), seed=1, steps=12, absorption_every=3, precision="bf16",
                            lr=1e-5)
    measured = edit(synth_runs.write(str(tmp_path / "ckpt.h5"), seed=1, steps=12, absorption_every=3),
                    {"precision": "checkpoint"})
    p_mixed, p_pure = predict.of(Run(mixed)), predict.of(Run(pure))
    assert predict.of(Run(measured)) is None
    assert p_mixed.model == "FP32 master" and p_pure.model == "pure BF16"
    r = Run(pure)
    absorbed = np.array([a.absorbed / a.elements for a in r.absorption])
    np.testing.assert_array_equal(p_pure.predicted, 1 - absorbed)
    assert p_pure.kstep_bounds is None and "pure BF16" in p_pure.statement()
    np.testing.assert_allclose(p_mixed.predicted, [predict.changed_fraction(a) for a in Run(mixed).absorption])
    # the pure run has another lr: not the mixed run's twin
    assert predict.pure_bf16_twins(Run(mixed), [Run(mixed), Run(pure)]) == []
    twin = synth_runs.write(str(tmp_path / "twin.h5"), seed=1, steps=12, absorption_every=0, precision="bf16")
    assert [q.name for q in predict.pure_bf16_twins(Run(mixed), [Run(mixed), Run(pure), Run(twin)])] == ["twin"]
    out = report.write_report([mixed, pure, measured], str(tmp_path / "out"), keep_figures=True)
    summary = open(tmp_path / "out" / "summary.md").read()
    statements = [line for line in summary.splitlines() if line.startswith("- `")]
    assert any(line.startswith("- `pure` (pure BF16") for line in statements), statements
    assert any(line.startswith("- `mixed` (FP32 master)") for line in statements), statements
    assert not any(line.startswith("- `ckpt`") for line in statements), statements
    assert "prediction.png" in out["written"]


def test_figures_of_absent_series_are_not_drawn(tmp_path):
    weights_only = edit(synth_runs.write(str(tmp_path / "w.h5"), seed=1, steps=12),
                        drop=["steps/reward", "steps/loss", "steps/eval_pass1"])
    out = report.write_report([weights_only], str(tmp_path / "out"), keep_figures=True)
    assert "training.png" not in out["written"] and "training" in out["missing"]
    loss_only = edit(synth_runs.write(str(tmp_path / "l.h5"), seed=1, steps=12), drop=["steps/reward", "steps/eval_pass1"])
    out = report.write_report([loss_only], str(tmp_path / "out2"), keep_figures=True)
    axes = out["figures"]["training"].axes
    assert [ax.get_ylabel() for ax in axes] == ["loss"]


def _with_trainers(path, trainers, per_rank=820_000):
    steps = 12
    with h5py.File(path, "a") as f:
        f.attrs["roles"] = ["trainer"] * trainers + ["inference"]
        for name in ("ranks/bytes_sent", "ranks/trainer_bytes_sent"):
            del f[name]
            data = np.zeros((steps, trainers + 1), np.int64)
            data[:, :trainers] = per_rank
            f[name] = data
    return path


def test_communication_only_between_two_or_more_trainers(tmp_path):
    one = _with_trainers(synth_runs.write(str(tmp_path / "one.h5"), seed=1, steps=12), 1)
    out = report.write_report([one], str(tmp_path / "out"), keep_figures=True)
    assert "comm.png" not in out["written"] and out["comm"] == []
    assert np.isnan(out["summary"][0]["mean_trainer_bytes_sent"])
    two = _with_trainers(synth_runs.write(str(tmp_path / "two.h5"), seed=2, steps=12), 2)
    out = report.write_report([one, two], str(tmp_path / "out2"), keep_figures=True)
    assert "comm.png" in out["written"]
    assert [row["runs"] for row in out["comm"]] == [1]
    assert out["comm"][0]["mean_bytes_per_step"] == 2 * 820_000


def test_both_regimes_side_by_side(tmp_path):
    mixed = synth_runs.write(str(tmp_path / "default.h5"), seed=1, steps=34, absorption_every=0)
    pure = synth_runs.write(str(tmp_path / "paper-regime.h5"), seed=1, steps=34, absorption_every=0, precision="bf16")
    other = synth_runs.write(str(tmp_path / "other-seed.h5"), seed=2, steps=34, absorption_every=0, precision="bf16")
    out = report.write_report([mixed, pure, other], str(tmp_path / "out"))
    rows = out["regimes"]
    assert [(r["pair"], r["run"], r["precision"]) for r in rows] == [("default", "default", "mixed"),
                                                                    ("default", "paper-regime", "bf16")]
    for row in rows:
        run = Run(str(tmp_path / f"{row['run']}.h5"))
        assert row["k"] == 32
        assert row["k1_mean_sparsity"] == pytest.approx(float(np.mean(run.kstep[:, 0])), rel=1e-12)
        k32 = run.kstep[:, run.k_values.index(32)]
        assert row["k_mean_sparsity"] == pytest.approx(float(np.mean(k32[np.isfinite(k32)])), rel=1e-12)
        paper_k1 = [r["mean_pct"] for r in report.paper.kstep_rows(lr=3e-6, mu=1, k=1)]
        assert row["paper_k1_mean_sparsity"] == pytest.approx(sum(paper_k1) / len(paper_k1) / 100, rel=1e-12)
    summary = open(tmp_path / "out" / "summary.md").read()
    assert "## Both regimes" in summary and os.path.exists(tmp_path / "out" / "regimes.csv")
    alone = report.write_report([mixed, other], str(tmp_path / "alone"))
    assert alone["regimes"] == [] and "## Both regimes" not in open(tmp_path / "alone" / "summary.md").read()


def test_kstep_legend_leaves_the_paper_band_visible(tmp_path):
    paths = [synth_runs.write(str(tmp_path / f"s{s}.h5"), seed=s, steps=34) for s in (1, 2)]
    out = report.write_report(paths, str(tmp_path / "out"), keep_figures=True)
    fig = out["figures"]["kstep"]
    fig.canvas.draw()
    ax = fig.axes[0]
    legend, axes = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert legend.y1 <= axes.y0, (legend, axes)  # wholly below the axes
    assert any("paper" in t.get_text() for t in ax.get_legend().get_texts())


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
