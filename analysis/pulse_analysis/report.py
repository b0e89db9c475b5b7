"""`python3 -m pulse_analysis report RUN.h5 [RUN2.h5 ...] -o DIR`: figures (PNG) and tables
(Markdown, CSV) from pulse-train statistics files, side by side with the paper's published numbers
(paper.json, arXiv 2602.03839). Every measured number comes from the files; the definitions of the
summary columns are in SUMMARY_COLUMNS and the tests recompute them with h5py.

Figures (figures.py; drawn only when the files hold their data, otherwise summary.md says why and
which jobs/ script makes it):
  sparsity      per-step BF16 sparsity per variant (band over seeds when >= 2)
  kstep         k-step sparsity against k and over steps
  staleness     sparsity against num-iterations and async-lag (a staleness sweep)
  lr            sparsity against learning rate (an lr sweep)
  scale         sparsity against model size (a model sweep)
  absorption    |w| and |update|/half-ulp histograms; absorbed updates vs unchanged weights
  prediction    per-step and k-step changes predicted from the histograms (predict.py) vs measured
  tensor_kinds  changed per step and share of changes by tensor kind (tensor_kinds.py)
  grad_sparsity gradient sparsity at the recorded thresholds (threshold 0 as a line)
  training      reward, loss and greedy pass@1 with 95% Wilson intervals
  comm          trainer-to-trainer bytes per step and cumulative per trainer-sync method, gate density
  sync          trainer -> inference patch bytes against dense BF16 bytes per step
  bandwidth     sync time and utilisation against link bandwidth (bandwidth.py)
Tables: summary.md (all of them), summary.csv, kstep.csv, comm.csv, regimes.csv (a run in both regimes: FP32
master and pure BF16, side by side with the paper's), bandwidth.csv.
"""
import csv
import math
import os

import numpy as np

from . import bandwidth, paper, predict
from .figures import Figures
from .runs import Run, exchanges, group_runs, trainer_bytes

# column -> definition (what the tests recompute); k-step columns k<K>_mean_sparsity are added
# per k value: mean over the rows where /kstep/sparsity is finite.
SUMMARY_COLUMNS = {
    "run": "file stem",
    "trainer_sync": "root attribute trainer_sync",
    "model": "root attribute model",
    "seed": "config seed",
    "lr": "config lr",
    "num_iterations": "config num-iterations",
    "async_lag": "config async-lag",
    "num_parameters": "root attribute num_parameters",
    "steps": "rows of /steps/step",
    "mean_sparsity": "mean of /steps/sparsity",
    "min_sparsity": "min of /steps/sparsity",
    "mean_patch_bytes": "mean of /steps/patch_bytes",
    "mean_dense_bytes": "mean of /steps/dense_bytes",
    "compression_vs_dense": "sum(/steps/dense_bytes) / sum(/steps/patch_bytes)",
    "bits_per_changed": "8 sum(/steps/patch_bytes) / sum(/steps/changed)",
    "mean_trainer_bytes_sent": "mean over steps of /ranks/trainer_bytes_sent summed over trainer ranks (>= 2 trainers)",
    "outer_steps": "sum of /steps/outer_step (steps on which the trainers synchronised)",
    "mean_gate_density": "mean of the finite /steps/gate_density (outer steps of diloco/pulseloco)",
    "final_reward": "last /steps/reward",
    "mean_reward": "mean of /steps/reward",
    "final_loss": "last /steps/loss",
    "final_eval_pass1": "last finite /steps/eval_pass1 (empty when never evaluated)",
    "mean_step_s": "mean of /steps/step_s",
    "absorbed_fraction": "absorbed / elements at the last /absorption step (empty without one)",
    "measured_changed_at_absorption": "mean of 1 - /steps/sparsity over the /absorption steps",
    "predicted_changed": "mean over the /absorption steps of the changed fraction predicted from the histogram "
                         "(predict.py)",
    "paper_k1_mean_sparsity": "the paper's k=1 mean sparsity at the run's lr and num-iterations, mean over its "
                              "models there (paper.json; empty where the paper has no such run)",
}


def _mean_finite(x):
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else math.nan


def summary_row(run, k_values):
    s = run.steps
    patch, dense = s["patch_bytes"].astype(float), s["dense_bytes"].astype(float)
    evals = s["eval_pass1"][np.isfinite(s["eval_pass1"])]
    row = {
        "run": run.name, "trainer_sync": run.trainer_sync, "model": run.attrs.get("model", ""),
        "seed": run.cfg("seed", ""), "lr": run.cfg("lr", ""), "num_iterations": run.cfg("num-iterations", ""),
        "async_lag": run.cfg("async-lag", ""), "num_parameters": int(run.attrs["num_parameters"]),
        "steps": run.rows,
        "mean_sparsity": float(np.mean(s["sparsity"])), "min_sparsity": float(np.min(s["sparsity"])),
        "mean_patch_bytes": float(np.mean(patch)), "mean_dense_bytes": float(np.mean(dense)),
        "compression_vs_dense": float(dense.sum() / patch.sum()) if patch.sum() else math.nan,
        "bits_per_changed": 8.0 * float(patch.sum()) / float(s["changed"].sum()) if s["changed"].sum() else math.nan,
        "mean_trainer_bytes_sent": float(np.mean(trainer_bytes(run))) if exchanges(run) else math.nan,
        "outer_steps": int(np.sum(s["outer_step"])) if "outer_step" in s else "",
        "mean_gate_density": _mean_finite(s["gate_density"]) if "gate_density" in s else math.nan,
        "final_reward": float(s["reward"][-1]), "mean_reward": float(np.mean(s["reward"])),
        "final_loss": float(s["loss"][-1]),
        "final_eval_pass1": float(evals[-1]) if evals.size else math.nan,
        "mean_step_s": float(np.mean(s["step_s"])),
        "absorbed_fraction": (run.absorption[-1].absorbed / run.absorption[-1].elements
                              if run.absorption else math.nan),
    }
    p = predict.of(run)
    row["measured_changed_at_absorption"] = p.mean_measured if p else math.nan
    row["predicted_changed"] = p.mean_predicted if p else math.nan
    row["paper_k1_mean_sparsity"] = _paper(run, 1)[0]
    for k in k_values:
        row[f"k{k}_mean_sparsity"] = (_mean_finite(run.kstep[:, run.k_values.index(k)])
                                      if k in run.k_values else math.nan)
    return row


def _paper(run, k):
    """The paper's mean k-step sparsity (fraction) at the run's lr and num-iterations, and its models."""
    value, models = paper.matching(float(run.cfg("lr", math.nan)), int(run.cfg("num-iterations", 1)), k)
    return (value if value is not None else math.nan), models


def kstep_rows(runs):
    rows = []
    for r in runs:
        for j, k in enumerate(r.k_values):
            v = r.kstep[:, j]
            v = v[np.isfinite(v)]
            if v.size:
                value, models = _paper(r, k)
                rows.append({"run": r.name, "k": k, "steps": int(v.size), "mean_sparsity": float(v.mean()),
                             "min_sparsity": float(v.min()), "paper_mean_sparsity": value,
                             "paper_models": " ".join(models)})
    return rows


def regime_rows(runs, summary):
    """The default regime beside the paper's: each mixed-precision run (FP32 master) followed by its
    pure-BF16 twins (predict.pure_bf16_twins: the same config, seed included, but the precision),
    with their summary's mean sparsity at k = 1 and the largest k both hold and the paper's at the
    same lr and num-iterations (the paper's table is for pure BF16 weights and Adam state), and
    dense over patch bytes."""
    by_name = {row["run"]: row for row in summary}
    rows = []
    for r in runs:
        twins = predict.pure_bf16_twins(r, runs)
        if not twins:
            continue
        k = max(set(r.k_values).intersection(*(q.k_values for q in twins)))
        for q in [r] + twins:
            row = by_name[q.name]
            rows.append({"pair": r.name, "run": q.name, "precision": q.attrs.get("precision"),
                         "k1_mean_sparsity": row["k1_mean_sparsity"], "paper_k1_mean_sparsity": _paper(q, 1)[0],
                         "k": k, "k_mean_sparsity": row[f"k{k}_mean_sparsity"], "paper_k_mean_sparsity": _paper(q, k)[0],
                         "compression_vs_dense": row["compression_vs_dense"]})
    return rows


def comm_rows(runs):
    """Per trainer-sync method: bytes the trainer ranks send per step and over the run, averaged
    over the method's runs with >= 2 trainers; ratio against DDP when DDP runs are present."""
    by = {}
    for r in runs:
        if exchanges(r):
            by.setdefault(r.trainer_sync, []).append(trainer_bytes(r).astype(float))
    rows = [{"method": m, "runs": len(v), "mean_bytes_per_step": float(np.mean([x.mean() for x in v])),
             "mean_total_bytes": float(np.mean([x.sum() for x in v]))} for m, v in by.items()]
    per_step = {row["method"]: row["mean_bytes_per_step"] for row in rows}
    paper_ratio = {"ddp": paper.headline("loco_vs_ddp")["value"], "diloco": paper.headline("loco_vs_diloco")["value"]}
    for row in rows:
        m, b = row["method"], row["mean_bytes_per_step"]
        row["ddp_over_method"] = per_step["ddp"] / b if "ddp" in per_step and b else math.nan
        row["over_pulseloco"] = b / per_step["pulseloco"] if per_step.get("pulseloco") else math.nan
        row["paper_over_pulseloco"] = paper_ratio.get(m, math.nan)
    return rows


def _fmt(v):
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        return f"{v:.6g}"
    return str(v)


def _write_csv(path, rows):
    if not rows:
        return
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for row in rows:
            w.writerow({k: ("" if isinstance(v, float) and math.isnan(v) else repr(v) if isinstance(v, float) else v)
                        for k, v in row.items()})


def _md_table(rows, columns=None):
    if not rows:
        return "(no data)\n"
    columns = columns or list(rows[0])
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(_fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(out) + "\n"


def write_report(paths, out_dir, params=None, compute_s=None, sparsity=None, bandwidths_gbps=(0.1, 1, 10, 100, 400),
                 encode_rate=None, apply_rate=None, keep_figures=False):
    """Writes every table and figure; returns them (figures as matplotlib Figures when keep_figures)."""
    runs = [Run(p) for p in paths]
    names = [r.name for r in runs]
    for r in runs:
        if names.count(r.name) > 1:  # same stem in different folders: keep them apart
            r.name = os.path.relpath(os.path.splitext(r.path)[0], os.path.commonpath([os.path.abspath(p) for p in paths]))
    os.makedirs(out_dir, exist_ok=True)
    groups = group_runs(runs)
    k_values = sorted({k for r in runs for k in r.k_values})

    summary = [summary_row(r, k_values) for r in runs]
    ksteps = kstep_rows(runs)
    comm = comm_rows(runs)
    regimes = regime_rows(runs, summary)
    predictions = [p for p in map(predict.of, runs) if p]
    # the bandwidth model needs a run that sent patches to inference ranks
    synced = [r for r in runs if r.steps["patch_bytes"].sum() > 0 and r.steps["changed"].sum() > 0
              and np.isfinite(r.steps["apply_s"]).all()]  # pulse-measure files have no apply times
    model = bandwidth.Model(synced[0], params=params, compute_s=compute_s, sparsity=sparsity,
                            encode_rate=encode_rate, apply_rate=apply_rate) if synced else None
    bw = model.table([b * 1e9 for b in bandwidths_gbps]) if model else []
    _write_csv(os.path.join(out_dir, "summary.csv"), summary)
    _write_csv(os.path.join(out_dir, "kstep.csv"), ksteps)
    _write_csv(os.path.join(out_dir, "comm.csv"), comm)
    _write_csv(os.path.join(out_dir, "regimes.csv"), regimes)
    _write_csv(os.path.join(out_dir, "bandwidth.csv"), bw)

    fig = Figures(out_dir, runs, groups, keep=keep_figures)
    for draw in (fig.sparsity, fig.kstep, fig.staleness, fig.lr, fig.scale, fig.absorption, fig.prediction,
                 fig.tensor_kinds, fig.grad_sparsity, fig.training, fig.sync):
        draw()
    fig.comm(comm)
    if model:
        fig.bandwidth(model, np.logspace(-2, 3, 200) * 1e9)
    else:
        fig.missing["bandwidth"] = "no run sent patches to inference ranks (inference-ranks 0)"

    main_cols = ["run", "trainer_sync", "steps", "mean_sparsity", "min_sparsity"] + \
                [f"k{k}_mean_sparsity" for k in k_values] + \
                ["paper_k1_mean_sparsity", "mean_patch_bytes", "compression_vs_dense", "bits_per_changed",
                 "final_reward", "final_eval_pass1"]
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write(f"# pulse-train report: {len(runs)} run(s)\n\n")
        f.write("Runs: " + ", ".join(f"`{r.name}` ({r.rows} steps)" for r in runs) + "\n\n")
        f.write("Variants (runs that differ in seed alone are one variant; a run whose file says nothing of its "
                "settings is one of its own): " +
                "; ".join(f"{label}: {', '.join(r.name for r in rs)}" for label, rs in groups) + "\n\n")
        f.write("## Per run\n\n" + _md_table(summary, main_cols) + "\n")
        f.write("All columns are in summary.csv:\n\n" +
                "\n".join(f"- `{c}`: {d}" for c, d in SUMMARY_COLUMNS.items()) +
                "\n- `k<K>_mean_sparsity`: mean of the finite entries of /kstep/sparsity column k=K\n\n")
        if regimes:
            f.write("## Both regimes: FP32 master (mixed) and pure BF16, the paper's\n\n"
                    "Each mixed-precision run, then the run of the same config in pure BF16 (the regime of the "
                    "paper's sparsity table: BF16 weights and Adam state), with the paper's mean sparsity at the "
                    "same lr and num-iterations (fractions; k: the largest both runs measured):\n\n" +
                    _md_table(regimes) + "\n")
        f.write("## k-step sparsity, with the paper's at the same lr and num-iterations\n\n" + _md_table(ksteps) +
                f"\nPaper numbers: {paper.source()}.\n\n")
        f.write("## Measured explanation: changes predicted from the absorption histograms\n\n")
        if predictions:
            f.write("Each run is held to the model of its precision (pulse_analysis/predict.py). FP32 master (mixed): "
                    "a weight's FP32 master sits uniformly between two BF16 "
                    "rounding boundaries one ulp apart, so an update u changes its BF16 copy with probability "
                    "min(1, |u| / ulp); over k steps the displacement is between sqrt(k) |u| (random walk) and "
                    "k |u| (same sign). Tolerance: the histogram's log2 bins (r at their lower and upper edges). "
                    "Pure BF16: an update changes its weight exactly when it is at least half an ulp (not absorbed)."
                    "\n\n" +
                    "\n".join(f"- {p.statement()}" for p in predictions) + "\n" +
                    "".join(f"- {p.twin_statement(q)}\n" for p in predictions
                            for q in predict.pure_bf16_twins(p.source, runs)) + "\n")
        else:
            f.write("No /absorption histograms in these files (pulse-train --absorption-every N, mixed precision).\n\n")
        f.write("## Communication per trainer-sync method\n\n" + _md_table(comm) + "\n")
        if model:
            f.write(f"## Bandwidth model (from `{model.run}`)\n\n"
                    f"{model.params:.4g} parameters, sparsity {100 * model.sparsity:.3f}%, "
                    f"{model.bits_per_changed:.3g} bits per changed element, codec speeds {model.speed_source}, "
                    f"compute {model.compute_s:.3g} s per step: patch {model.patch_bytes:.4g} B against dense "
                    f"{model.dense_bytes:.4g} B per step; the patch is faster below "
                    f"{model.crossover_bps / 1e9:.4g} Gbit/s.\n\n" + _md_table(bw) + "\n")
        if fig.missing:
            f.write("## Figures not drawn\n\n" + "\n".join(
                f"- `{name}`: " + (f"no {name} sweep in these files; `sbatch {why}` (or `bash {why}` without Slurm) "
                                   f"makes one" if why.startswith("jobs/") else why)
                for name, why in fig.missing.items()) + "\n\n")
        f.write("## Figures\n\n" + "\n".join(f"![{n}]({n})" for n in fig.written) + "\n")
    return {"runs": runs, "summary": summary, "kstep": ksteps, "comm": comm, "regimes": regimes, "bandwidth": bw,
            "predictions": predictions, "figures": fig.figures, "written": fig.written, "missing": fig.missing}
