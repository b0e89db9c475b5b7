"""`python3 -m pulse_analysis report RUN.h5 [RUN2.h5 ...] -o DIR`: figures (PNG) and tables
(Markdown, CSV) from pulse-train statistics files. Every number comes from the files; the
definitions of the summary columns are in SUMMARY_COLUMNS and the tests recompute them with h5py.

Figures (the paper's figure in brackets):
  sparsity.png      per-step BF16 sparsity, mean and min-max band over the seeds of a variant [2a, 8]
  kstep.png         k-step sparsity against k and over steps [2b]
  staleness.png     sparsity against num-iterations and async-lag, and k-step curves per setting [4b]
  absorption.png    |w| and |update|/half-ulp histograms with the ratio = 1 line, absorbed fraction [3]
  grad_sparsity.png gradient sparsity at the recorded thresholds [11]
  training.png      reward, loss and greedy pass@1
  comm.png          trainer-to-trainer bytes per step and cumulative per trainer-sync method, gate density
  sync.png          trainer -> inference patch bytes against dense BF16 bytes per step
  bandwidth.png     sync time and GPU utilisation against link bandwidth (bandwidth.py) [1, 13]
Tables: summary.md (all of them), summary.csv, kstep.csv, comm.csv, bandwidth.csv and, with
--reference, reference.csv (the paper's numbers per model, μ, lr and k).
"""
import csv
import math
import os

import numpy as np

from . import bandwidth
from .runs import Run, group_runs

REFERENCE_COLUMNS = ["model_family", "model_size", "seed", "step", "k", "sparsity", "iteration_num",
                     "learning_rate", "experiment_type"]

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
    "verified_fraction": "mean of /steps/verify_ok",
    "mean_trainer_bytes_sent": "mean over steps of /ranks/trainer_bytes_sent summed over trainer ranks",
    "outer_steps": "sum of /steps/outer_step (steps on which the trainers synchronised)",
    "mean_gate_density": "mean of the finite /steps/gate_density (outer steps of diloco/pulseloco)",
    "final_reward": "last /steps/reward",
    "mean_reward": "mean of /steps/reward",
    "final_loss": "last /steps/loss",
    "final_eval_pass1": "last finite /steps/eval_pass1 (empty when never evaluated)",
    "mean_step_s": "mean of /steps/step_s",
    "absorbed_fraction": "absorbed / elements at the last /absorption step (empty without one)",
}


def _mean_finite(x):
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else math.nan


def trainer_bytes(run):
    """Trainer-to-trainer bytes (gradients or pseudo-gradients) the trainer ranks hand to MPI in
    each step (row), summed over trainer ranks; files without /ranks/trainer_bytes_sent (written
    before it existed) give all bytes the trainer ranks sent."""
    name = "trainer_bytes_sent" if "trainer_bytes_sent" in run.ranks else "bytes_sent"
    return run.ranks[name][:, run.trainer_ranks].sum(axis=1)


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
        "verified_fraction": float(np.mean(s["verify_ok"])),
        "mean_trainer_bytes_sent": float(np.mean(trainer_bytes(run))) if "bytes_sent" in run.ranks else math.nan,
        "outer_steps": int(np.sum(s["outer_step"])) if "outer_step" in s else "",
        "mean_gate_density": _mean_finite(s["gate_density"]) if "gate_density" in s else math.nan,
        "final_reward": float(s["reward"][-1]), "mean_reward": float(np.mean(s["reward"])),
        "final_loss": float(s["loss"][-1]),
        "final_eval_pass1": float(evals[-1]) if evals.size else math.nan,
        "mean_step_s": float(np.mean(s["step_s"])),
        "absorbed_fraction": (run.absorption[-1].absorbed / run.absorption[-1].elements
                              if run.absorption else math.nan),
    }
    for k in k_values:
        row[f"k{k}_mean_sparsity"] = (_mean_finite(run.kstep[:, run.k_values.index(k)])
                                      if k in run.k_values else math.nan)
    return row


def kstep_rows(runs):
    rows = []
    for r in runs:
        for j, k in enumerate(r.k_values):
            v = r.kstep[:, j]
            v = v[np.isfinite(v)]
            if v.size:
                rows.append({"run": r.name, "k": k, "steps": int(v.size), "mean_sparsity": float(v.mean()),
                             "min_sparsity": float(v.min())})
    return rows


def comm_rows(runs):
    """Per trainer-sync method: bytes the trainer ranks send per step and over the run, averaged
    over the method's runs; ratio against DDP when DDP runs are present."""
    by = {}
    for r in runs:
        if "bytes_sent" in r.ranks:
            by.setdefault(r.trainer_sync, []).append(trainer_bytes(r).astype(float))
    rows = [{"method": m, "runs": len(v), "mean_bytes_per_step": float(np.mean([x.mean() for x in v])),
             "mean_total_bytes": float(np.mean([x.sum() for x in v]))} for m, v in by.items()]
    ddp = [row["mean_bytes_per_step"] for row in rows if row["method"] == "ddp"]
    for row in rows:
        row["ddp_over_method"] = ddp[0] / row["mean_bytes_per_step"] if ddp and row["mean_bytes_per_step"] else math.nan
    return rows


def read_reference(path):
    """The paper's k-step sparsity CSV (sparsity in percent) -> list of dicts with fraction values."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in REFERENCE_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: reference CSV lacks column(s) {', '.join(missing)}")
        rows = []
        for i, r in enumerate(reader, start=2):
            try:
                rows.append({"label": f"{r['model_family']} {r['model_size']}", "seed": r["seed"],
                             "step": int(r["step"]), "k": int(r["k"]), "sparsity": float(r["sparsity"]) / 100.0,
                             "iteration_num": int(r["iteration_num"]), "lr": float(r["learning_rate"])})
            except ValueError as e:
                raise ValueError(f"{path}:{i}: {e}") from None
    return rows


def _reference_series(ref):
    """(label, iteration_num, lr) -> rows; label gets μ and lr when they are not the common ones."""
    groups = {}
    for r in ref:
        groups.setdefault((r["label"], r["iteration_num"], r["lr"]), []).append(r)
    return groups


def reference_rows(ref):
    """Paper numbers per model, μ, lr and k: mean and min sparsity over seeds and steps."""
    rows = []
    for (label, mu, lr), rs in _reference_series(ref).items():
        for k in sorted({r["k"] for r in rs}):
            v = np.array([r["sparsity"] for r in rs if r["k"] == k])
            rows.append({"reference": label, "iteration_num": mu, "learning_rate": lr, "k": k, "rows": int(v.size),
                         "mean_sparsity": float(v.mean()), "min_sparsity": float(v.min())})
    return rows


def _ref_name(key):
    label, mu, lr = key
    return f"paper {label}, μ={mu}, lr={lr:g}"


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


class Figures:
    def __init__(self, out_dir, runs, groups, ref):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        self.plt, self.out_dir, self.runs, self.groups, self.ref = plt, out_dir, runs, groups, ref
        self.written = []

    def save(self, fig, name):
        fig.tight_layout()
        path = os.path.join(self.out_dir, name)
        fig.savefig(path, dpi=110)
        self.plt.close(fig)
        self.written.append(name)

    def _band(self, ax, label, runs, get, scale=1.0):
        n = min(r.rows for r in runs)
        steps = runs[0].steps["step"][:n]
        values = np.array([get(r)[:n] for r in runs], dtype=float) * scale
        (line,) = ax.plot(steps, values.mean(axis=0), label=f"{label} (mean of {len(runs)})" if len(runs) > 1 else label)
        if len(runs) > 1:
            ax.fill_between(steps, values.min(axis=0), values.max(axis=0), color=line.get_color(), alpha=0.25)

    def sparsity(self):
        fig, ax = self.plt.subplots(figsize=(8, 4.5))
        for label, runs in self.groups:
            self._band(ax, label, runs, lambda r: r.steps["sparsity"], 100)
        if self.ref:
            for key, rows in _reference_series(self.ref).items():
                by_step = {}
                for r in rows:
                    if r["k"] == 1:
                        by_step.setdefault(r["step"], []).append(r["sparsity"])
                if by_step:
                    st = sorted(by_step)
                    ax.plot(st, [100 * np.mean(by_step[t]) for t in st], "--.", lw=0.8, ms=3, label=_ref_name(key))
        ax.set_xlabel("step")
        ax.set_ylabel("per-step sparsity S1 (%)")
        ax.set_title("BF16 weights unchanged per step (band: min-max over seeds)")
        ax.legend(fontsize=7)
        self.save(fig, "sparsity.png")

    def kstep(self):
        fig, (left, right) = self.plt.subplots(1, 2, figsize=(12, 4.5))
        for label, runs in self.groups:
            ks = runs[0].k_values
            means = np.array([[_mean_finite(r.kstep[:, j]) for j in range(len(ks))] for r in runs])
            (line,) = left.plot(ks, 100 * means.mean(axis=0), "o-", label=label)
            if len(runs) > 1:
                left.fill_between(ks, 100 * means.min(axis=0), 100 * means.max(axis=0), color=line.get_color(), alpha=0.25)
            r = runs[0]
            for j, k in enumerate(ks):
                right.plot(r.steps["step"], 100 * r.kstep[:, j], lw=0.8, label=f"{r.name} k={k}")
        if self.ref:
            for key, rows in _reference_series(self.ref).items():
                by_k = {}
                for r in rows:
                    by_k.setdefault(r["k"], []).append(r["sparsity"])
                ks = sorted(by_k)
                left.plot(ks, [100 * np.mean(by_k[k]) for k in ks], "s--", lw=0.8, ms=3, label=_ref_name(key))
        left.set_xscale("log", base=2)
        left.set_xlabel("k (steps apart)")
        left.set_ylabel("mean k-step sparsity (%)")
        left.set_title("k-step sparsity (band: min-max over seeds)")
        left.legend(fontsize=7)
        right.set_xlabel("step")
        right.set_ylabel("k-step sparsity (%)")
        right.set_title("k-step sparsity over steps (first run of each variant)")
        right.legend(fontsize=6, ncol=2)
        self.save(fig, "kstep.png")

    def staleness(self):
        fig, axes = self.plt.subplots(1, 3, figsize=(15, 4.5))
        points = {}
        for r in self.runs:
            points.setdefault((int(r.cfg("num-iterations", 1)), int(r.cfg("async-lag", 0))), []).append(r)
        for ax, xi, name, other in ((axes[0], 0, "num-iterations μ", "lag"), (axes[1], 1, "async-lag S", "μ")):
            series = {}
            for key, runs in points.items():
                series.setdefault(key[1 - xi], []).append((key[xi], np.mean([r.steps["sparsity"].mean() for r in runs])))
            for fixed, pts in sorted(series.items()):
                pts.sort()
                ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], "o-", label=f"{other}={fixed}")
            ax.set_xlabel(name)
            ax.set_ylabel("mean per-step sparsity (%)")
            ax.legend(fontsize=7)
        if self.ref:
            by_mu = {}
            for r in self.ref:
                if r["k"] == 1:
                    by_mu.setdefault(r["iteration_num"], []).append(r["sparsity"])
            mus = sorted(by_mu)
            axes[0].plot(mus, [100 * np.mean(by_mu[m]) for m in mus], "s--", label="paper (iteration_num)")
            axes[0].legend(fontsize=7)
        for (mu, lag), runs in sorted(points.items()):
            ks = runs[0].k_values
            axes[2].plot(ks, [100 * np.mean([_mean_finite(r.kstep[:, j]) for r in runs]) for j in range(len(ks))],
                         "o-", label=f"μ={mu}, S={lag}")
        axes[2].set_xscale("log", base=2)
        axes[2].set_xlabel("k")
        axes[2].set_ylabel("mean k-step sparsity (%)")
        axes[2].legend(fontsize=7)
        fig.suptitle("sparsity against staleness (num-iterations, async-lag) and k")
        self.save(fig, "staleness.png")

    def absorption(self):
        runs = [r for r in self.runs if r.absorption]
        if not runs:
            return
        fig, axes = self.plt.subplots(1, 3, figsize=(15, 4.5))
        for r in runs:
            a = r.absorption[-1]
            for ax, counts, (k0, k1) in ((axes[0], a.weight_counts, a.weight_k), (axes[1], a.ratio_counts, a.ratio_k)):
                edges = 2.0 ** np.arange(k0, k1 + 1)
                ax.stairs(counts[: k1 - k0] / a.elements, edges, label=f"{r.name} step {a.step}")
            axes[2].plot([x.step for x in r.absorption], [100 * x.absorbed / x.elements for x in r.absorption], "o-",
                         label=r.name)
        axes[1].axvline(1.0, color="k", ls="--", lw=1, label="ratio = 1 (half a BF16 ulp)")
        for ax, xl in ((axes[0], "|w|"), (axes[1], "|update| / half-ulp(bf16(w))")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel(xl)
            ax.set_ylabel("fraction of weights")
            ax.legend(fontsize=7)
        axes[0].set_title("weight magnitudes")
        axes[1].set_title("update size in half-ulps (left of the line: absorbed)")
        axes[2].set_xlabel("step")
        axes[2].set_ylabel("absorbed updates (%)")
        axes[2].set_title("updates rounded away by the BF16 cast")
        axes[2].legend(fontsize=7)
        self.save(fig, "absorption.png")

    def grad_sparsity(self):
        if any("grad_sparsity" not in r.steps for r in self.runs):
            return
        fig, (left, right) = self.plt.subplots(1, 2, figsize=(12, 4.5))
        for label, runs in self.groups:
            th = runs[0].step_attrs["grad_sparsity"]["thresholds"]
            means = np.array([r.steps["grad_sparsity"].mean(axis=0) for r in runs])
            left.plot(th, 100 * means.mean(axis=0), "o-", label=label)
        r = self.runs[0]
        for j, t in enumerate(r.step_attrs["grad_sparsity"]["thresholds"]):
            right.plot(r.steps["step"], 100 * r.steps["grad_sparsity"][:, j], label=f"|g| <= {t:g}")
        left.set_xscale("log")
        left.set_xlabel("threshold")
        left.set_ylabel("mean fraction of |g| <= threshold (%)")
        left.set_title("gradient sparsity")
        left.legend(fontsize=7)
        right.set_xlabel("step")
        right.set_ylabel("%")
        right.set_title(f"gradient sparsity over steps ({r.name})")
        right.legend(fontsize=7)
        self.save(fig, "grad_sparsity.png")

    def training(self):
        fig, axes = self.plt.subplots(1, 3, figsize=(15, 4.5))
        for label, runs in self.groups:
            self._band(axes[0], label, runs, lambda r: r.steps["reward"])
            self._band(axes[1], label, runs, lambda r: r.steps["loss"])
            for r in runs:
                ev = r.steps["eval_pass1"]
                ok = np.isfinite(ev)
                axes[2].plot(r.steps["step"][ok], 100 * ev[ok], "o-", label=r.name)
        for ax, y in zip(axes, ("mean reward", "GRPO loss", "greedy pass@1 (%)")):
            ax.set_xlabel("step")
            ax.set_ylabel(y)
            ax.legend(fontsize=7)
        self.save(fig, "training.png")

    def comm(self):
        runs = [r for r in self.runs if "bytes_sent" in r.ranks]
        if not runs:
            return
        fig, (left, right, gate) = self.plt.subplots(1, 3, figsize=(16, 4.5))
        for r in runs:
            b = trainer_bytes(r).astype(float)
            left.plot(r.steps["step"], b, ".-", label=f"{r.trainer_sync}: {r.name}")
            right.plot(r.steps["step"], np.cumsum(b), label=f"{r.trainer_sync}: {r.name}")
            g = r.steps.get("gate_density")
            if g is not None and np.isfinite(g).any():
                ok = np.isfinite(g)
                gate.plot(r.steps["step"][ok], 100 * g[ok], "o-", label=f"{r.trainer_sync}: {r.name}")
        gate.set_xlabel("step")
        gate.set_ylabel("entries sent on outer steps (%)")
        gate.set_title("gate density (diloco: 100%, pulseloco: the BF16 gate)")
        if gate.has_data():
            gate.legend(fontsize=7)
        left.set_yscale("symlog", linthresh=1)
        left.set_ylabel("trainer-to-trainer bytes per step")
        right.set_yscale("symlog", linthresh=1)
        right.set_ylabel("cumulative trainer-to-trainer bytes")
        for ax in (left, right):
            ax.set_xlabel("step")
            ax.legend(fontsize=7)
        fig.suptitle("communication between trainers per trainer-sync method (sum over trainer ranks)")
        self.save(fig, "comm.png")

    def sync(self):
        fig, (left, right) = self.plt.subplots(1, 2, figsize=(12, 4.5))
        for r in self.runs:
            s = r.steps
            (line,) = left.plot(s["step"], s["patch_bytes"], label=f"{r.name} patch")
            left.plot(s["step"], s["dense_bytes"], ":", color=line.get_color(), label=f"{r.name} dense BF16")
            with np.errstate(divide="ignore"):
                right.plot(s["step"], s["dense_bytes"] / s["patch_bytes"].astype(float), label=r.name)
        left.set_yscale("log")
        left.set_ylabel("bytes per step")
        left.set_title("trainer -> inference: PULSESync patch vs dense BF16")
        right.set_ylabel("dense / patch")
        right.set_title("compression against dense BF16")
        for ax in (left, right):
            ax.set_xlabel("step")
            ax.legend(fontsize=7)
        self.save(fig, "sync.png")

    def bandwidth(self, model, grid_bps):
        fig, (left, right) = self.plt.subplots(1, 2, figsize=(12, 4.5))
        dense, patch = model.sync_s(grid_bps)
        g = grid_bps / 1e9
        left.plot(g, dense, label=f"dense BF16 ({model.dense_bytes / 1e9:.3g} GB)")
        left.plot(g, patch, label=f"patch ({model.patch_bytes / 1e9:.3g} GB, sparsity {100 * model.sparsity:.2f}%)")
        right.plot(g, 100 * model.utilisation(dense), label="dense BF16")
        right.plot(g, 100 * model.utilisation(patch), label="patch")
        right.plot(g, 100 * model.utilisation(np.minimum(dense, patch)), "k:", label="best codec")
        if math.isfinite(model.crossover_bps):
            for ax in (left, right):
                ax.axvline(model.crossover_bps / 1e9, color="grey", ls="--", lw=1,
                           label=f"crossover {model.crossover_bps / 1e9:.3g} Gbit/s")
        left.set_yscale("log")
        left.set_ylabel("sync time per step (s)")
        right.set_ylabel("GPU utilisation (%)")
        for ax in (left, right):
            ax.set_xscale("log")
            ax.set_xlabel("link bandwidth (Gbit/s)")
            ax.legend(fontsize=7)
        fig.suptitle(f"{model.params:.3g} parameters, compute {model.compute_s:.3g} s/step (measured in {model.run})")
        self.save(fig, "bandwidth.png")


def write_report(paths, out_dir, reference=None, params=None, compute_s=None, sparsity=None,
                 bandwidths_gbps=(0.1, 1, 10, 100, 400)):
    runs = [Run(p) for p in paths]
    names = [r.name for r in runs]
    for r in runs:
        if names.count(r.name) > 1:  # same stem in different folders: keep them apart
            r.name = os.path.relpath(os.path.splitext(r.path)[0], os.path.commonpath([os.path.abspath(p) for p in paths]))
    ref = read_reference(reference) if reference else None
    os.makedirs(out_dir, exist_ok=True)
    groups = group_runs(runs)
    k_values = sorted({k for r in runs for k in r.k_values})

    summary = [summary_row(r, k_values) for r in runs]
    ksteps = kstep_rows(runs)
    comm = comm_rows(runs)
    # the bandwidth model needs a run that sent patches to inference ranks
    synced = [r for r in runs if r.steps["patch_bytes"].sum() > 0 and r.steps["changed"].sum() > 0
              and np.isfinite(r.steps["apply_s"]).all()]
    model = bandwidth.Model(synced[0], params=params, compute_s=compute_s, sparsity=sparsity) if synced else None
    bw = model.table([b * 1e9 for b in bandwidths_gbps]) if model else []
    _write_csv(os.path.join(out_dir, "summary.csv"), summary)
    _write_csv(os.path.join(out_dir, "kstep.csv"), ksteps)
    _write_csv(os.path.join(out_dir, "comm.csv"), comm)
    _write_csv(os.path.join(out_dir, "bandwidth.csv"), bw)
    refs = reference_rows(ref) if ref else []
    _write_csv(os.path.join(out_dir, "reference.csv"), refs)

    fig = Figures(out_dir, runs, groups, ref)
    fig.sparsity()
    fig.kstep()
    fig.staleness()
    fig.absorption()
    fig.grad_sparsity()
    fig.training()
    fig.comm()
    fig.sync()
    if model:
        fig.bandwidth(model, np.logspace(-2, 3, 200) * 1e9)

    main_cols = ["run", "trainer_sync", "steps", "mean_sparsity", "min_sparsity"] + \
                [f"k{k}_mean_sparsity" for k in k_values] + \
                ["mean_patch_bytes", "compression_vs_dense", "bits_per_changed", "final_reward", "final_eval_pass1"]
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write(f"# pulse-train report: {len(runs)} run(s)\n\n")
        f.write("Runs: " + ", ".join(f"`{r.name}` ({r.rows} steps)" for r in runs) + "\n\n")
        f.write("Variants (runs that differ only in seed or output are one variant): " +
                "; ".join(f"{label}: {', '.join(r.name for r in rs)}" for label, rs in groups) + "\n\n")
        f.write("## Per run\n\n" + _md_table(summary, main_cols) + "\n")
        f.write("All columns are in summary.csv:\n\n" +
                "\n".join(f"- `{c}`: {d}" for c, d in SUMMARY_COLUMNS.items()) +
                "\n- `k<K>_mean_sparsity`: mean of the finite entries of /kstep/sparsity column k=K\n\n")
        f.write("## k-step sparsity\n\n" + _md_table(ksteps) + "\n")
        f.write("## Communication per trainer-sync method\n\n" + _md_table(comm) + "\n")
        if not model:
            f.write("## Bandwidth model\n\nNo run sent patches to inference ranks (inference-ranks 0, or a "
                    "pulse-measure file): no model.\n\n")
        else:
            f.write(f"## Bandwidth model (from `{model.run}`)\n\n"
                    f"{model.params:.4g} parameters, sparsity {100 * model.sparsity:.3f}%, "
                    f"{model.bits_per_changed:.3g} bits per changed element, "
                    f"encode {model.encode_rate:.3g} and apply {model.apply_rate:.3g} parameters/s, "
                    f"compute {model.compute_s:.3g} s per step: patch {model.patch_bytes:.4g} B against dense "
                    f"{model.dense_bytes:.4g} B per step; the patch is faster below "
                    f"{model.crossover_bps / 1e9:.4g} Gbit/s.\n\n" + _md_table(bw) + "\n")
        if refs:
            f.write(f"## Paper reference ({os.path.basename(reference)})\n\n" + _md_table(refs) + "\n")
        f.write("## Figures\n\n" + "\n".join(f"![{n}]({n})" for n in fig.written) + "\n")
    return {"runs": runs, "summary": summary, "kstep": ksteps, "comm": comm, "bandwidth": bw, "reference": refs,
            "figures": fig.written}
