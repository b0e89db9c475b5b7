"""The report's figures (matplotlib), one method each; the paper's figure it mirrors in brackets.
Rules they follow: a band over seeds only where a variant has >= 2 seeds (n in the legend); a
sweep figure only where the files hold a sweep (else `missing` names the jobs/ script that makes
one); no panel without data, title and axis labels; integer ticks on integer axes; the paper's
numbers (paper.py) as grey reference marks wherever they apply."""
import math

import numpy as np

from . import paper, predict, tensor_kinds
from .runs import FOLLOWS_FROM_MODEL, exchanges, trainer_bytes

PAPER = dict(color="0.45")  # style of every reference mark
SWEEP_SCRIPTS = {"staleness": "jobs/staleness.sbatch", "lr": "jobs/lr.sbatch", "scale": "jobs/scale.sbatch",
                 "seeds": "jobs/seeds.sbatch"}
SWEEP_IGNORES = FOLLOWS_FROM_MODEL  # they do not split a sweep either


def wilson(passed_fraction, n, z=1.959964):
    """Wilson score interval (95% by default) of a binomial proportion from n trials."""
    p = np.asarray(passed_fraction, dtype=float)
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def mean_finite(x):
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else math.nan


def _integer_x(ax):
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _k_axis(ax, ks):
    from matplotlib.ticker import FixedLocator, NullLocator

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(ks))
    ax.set_xticklabels([str(k) for k in ks])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("k (steps apart)")


def _decade_ylim(ax, values):
    """y limits on whole decades around the values, so a log or symlog axis always has labelled
    ticks (a constant series would otherwise get a range without one)."""
    v = np.concatenate([np.asarray(x, dtype=float).ravel() for x in values])
    pos = v[v > 0]
    if pos.size:
        hi = 10.0 ** math.ceil(math.log10(pos.max()) + 1e-9)
        lo = 10.0 ** math.floor(math.log10(pos.min()))
        ax.set_ylim(0 if (v <= 0).any() else lo, max(hi, 10 * lo))


def _seeds(runs):
    return f"n={len(runs)} seeds" if len(runs) > 1 else "1 run"


def _paper_k1_span(ax):
    """Horizontal span of the paper's per-step (k=1) means over its models at its default lr."""
    rows = paper.kstep_rows(lr=paper.DEFAULT_LR, mu=1, k=1)
    lo, hi = min(r["mean_pct"] for r in rows), max(r["mean_pct"] for r in rows)
    ax.axhspan(lo, hi, alpha=0.25, **PAPER,
               label=f"paper: k=1 mean of {len(rows)} models 0.5B-7B, lr 3e-6 ({lo:.2f}-{hi:.2f}%)")


def _paper_kstep_envelope(ax, changed=False):
    """The paper's k-step means at its default lr: range over its models, per k."""
    ks = sorted({r["k"] for r in paper.kstep_rows(lr=paper.DEFAULT_LR, mu=1)})
    lo, hi = [], []
    for k in ks:
        v = [r["mean_pct"] for r in paper.kstep_rows(lr=paper.DEFAULT_LR, mu=1, k=k)]
        lo.append(min(v)), hi.append(max(v))
    lo, hi = np.array(lo), np.array(hi)
    if changed:
        lo, hi = 100 - hi, 100 - lo
    n = len(paper.kstep_rows(lr=paper.DEFAULT_LR, mu=1, k=1))
    ax.fill_between(ks, lo, hi, alpha=0.3, **PAPER, label=f"paper: {n} models 0.5B-7B, lr 3e-6 (range of means)")


class Figures:
    def __init__(self, out_dir, runs, groups, keep=False):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        self.plt, self.out_dir, self.runs, self.groups, self.keep = plt, out_dir, runs, groups, keep
        if keep:  # the caller holds every figure on purpose
            matplotlib.rcParams["figure.max_open_warning"] = 0
        self.written = []
        self.figures = {}   # name -> Figure, kept open when keep (the tests read them)
        self.missing = {}   # figure name -> why it was not drawn (and what makes its data)

    def save(self, fig, name):
        import os

        fig.tight_layout()
        fig.savefig(os.path.join(self.out_dir, name + ".png"), dpi=110)
        self.written.append(name + ".png")
        if self.keep:
            self.figures[name] = fig
        else:
            self.plt.close(fig)

    def _band(self, ax, label, runs, get, scale=1.0):
        n = min(r.rows for r in runs)
        steps = runs[0].steps["step"][:n]
        values = np.array([get(r)[:n] for r in runs], dtype=float) * scale
        (line,) = ax.plot(steps, values.mean(axis=0),
                          label=f"{label} (mean, min-max band, {_seeds(runs)})" if len(runs) > 1 else f"{label} (1 run)")
        if len(runs) > 1:
            ax.fill_between(steps, values.min(axis=0), values.max(axis=0), color=line.get_color(), alpha=0.25)

    @property
    def _banded(self):
        return any(len(rs) > 1 for _, rs in self.groups)

    def sparsity(self):
        fig, ax = self.plt.subplots(figsize=(8, 4.5))
        for label, runs in self.groups:
            self._band(ax, label, runs, lambda r: r.steps["sparsity"], 100)
        _paper_k1_span(ax)
        ax.set_xlabel("step")
        _integer_x(ax)
        ax.set_ylabel("per-step sparsity S1 (%)")
        ax.set_title("BF16 weights unchanged per step" + (" (bands: min-max over seeds)" if self._banded else ""))
        ax.legend(fontsize=7)
        self.save(fig, "sparsity")

    def kstep(self):
        fig, (left, right) = self.plt.subplots(1, 2, figsize=(12, 5.5))
        ks = self.runs[0].k_values
        for label, runs in self.groups:
            means = 100 * np.array([[mean_finite(r.kstep[:, j]) for j in range(len(ks))] for r in runs])
            (line,) = left.plot(ks, means.mean(axis=0), "o-", label=f"{label} ({_seeds(runs)})")
            if len(runs) > 1:
                left.fill_between(ks, means.min(axis=0), means.max(axis=0), color=line.get_color(), alpha=0.25)
            r = runs[0]
            for j, k in enumerate(ks):
                right.plot(r.steps["step"], 100 * r.kstep[:, j], lw=0.8, label=f"{r.name} k={k}")
        _paper_kstep_envelope(left)
        _k_axis(left, ks)
        left.set_ylabel("mean k-step sparsity (%)")
        left.set_title("k-step sparsity" + (" (bands: min-max over seeds)" if self._banded else ""))
        left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14))  # below: the paper band stays visible
        right.set_xlabel("step")
        _integer_x(right)
        right.set_ylabel("k-step sparsity (%)")
        right.set_title("k-step sparsity over steps (first run of each variant)")
        right.legend(fontsize=6, ncol=2)
        self.save(fig, "kstep")

    def _sweep(self, key, x_of):
        """Series of a sweep over config key: variants that differ only in key (and in what
        SWEEP_IGNORES lists) form one series of (x, runs) points; only series with >= 2 x values."""
        series = {}
        for label, runs in self.groups:
            if runs[0].cfg(key) is None:
                continue  # a pulse-measure file: no training settings
            v = {k: val for k, val in runs[0].variant() if k != key and k not in SWEEP_IGNORES}
            series.setdefault(tuple(sorted(v.items())), []).append((x_of(runs[0]), runs))
        kept = {rest: points for rest, points in series.items() if len({p[0] for p in points}) >= 2}
        differing = sorted({k for s in kept for k, _ in s if len({dict(t).get(k) for t in kept}) > 1})
        out = []
        for rest, points in kept.items():
            d = dict(rest)
            label = ", ".join(f"{k}={d.get(k, '-')}".replace("'", "") for k in differing) or "pulse-train"
            out.append((label, sorted(points, key=lambda p: p[0])))
        return out

    @staticmethod
    def _sweep_plot(ax, label, points, value, fmt="o-"):
        """Mean over each point's runs, with a min-max bar where a point has >= 2 seeds."""
        x = [p[0] for p in points]
        vals = [[value(r) for r in runs] for _, runs in points]
        mean = np.array([np.mean(v) for v in vals])
        err = np.array([[m - min(v), max(v) - m] for m, v in zip(mean, vals)]).T
        n = sorted({len(v) for v in vals})
        seeds = f"n={'/'.join(map(str, n))} seeds, min-max bars" if max(n) > 1 else "1 run each"
        ax.errorbar(x, mean, yerr=err if max(n) > 1 else None, fmt=fmt, capsize=3, label=f"{label} ({seeds})")

    def staleness(self):
        mu = self._sweep("num-iterations", lambda r: int(r.cfg("num-iterations", 1)))
        lag = self._sweep("async-lag", lambda r: int(r.cfg("async-lag", 0)))
        if not mu and not lag:
            self.missing["staleness"] = SWEEP_SCRIPTS["staleness"]
            return
        panels = [p for p in (("num-iterations μ", mu), ("async-lag S", lag)) if p[1]]
        fig, axes = self.plt.subplots(1, len(panels) + 1, figsize=(5 * (len(panels) + 1), 4.5), squeeze=False)
        axes = axes[0]
        for ax, (name, series) in zip(axes, panels):
            for label, points in series:
                self._sweep_plot(ax, label, points, lambda r: 100 * r.steps["sparsity"].mean())
            if name.startswith("num-iterations"):
                rows = paper.kstep_rows(model=paper.SWEPT_MODEL, lr=paper.DEFAULT_LR, k=1)
                rows.sort(key=lambda r: r["iteration_num"])
                ax.plot([r["iteration_num"] for r in rows], [r["mean_pct"] for r in rows], "s--", **PAPER,
                        label=f"paper: {paper.SWEPT_MODEL}, lr 3e-6, k=1")
            ax.set_xlabel(name)
            _integer_x(ax)
            ax.set_ylabel("mean per-step sparsity (%)")
            ax.set_title(f"sparsity against {name.split()[0]}")
            ax.legend(fontsize=7)
        ax = axes[-1]
        ks = self.runs[0].k_values
        swept = {id(runs): runs for _, series in panels for _, points in series for _, runs in points}
        for runs in swept.values():
            ax.plot(ks, [100 * np.mean([mean_finite(r.kstep[:, j]) for r in runs]) for j in range(len(ks))],
                    "o-", label=f"μ={runs[0].cfg('num-iterations', 1)}, S={runs[0].cfg('async-lag', 0)} ({_seeds(runs)})")
        _paper_kstep_envelope(ax)
        _k_axis(ax, ks)
        ax.set_ylabel("mean k-step sparsity (%)")
        ax.set_title("k-step sparsity per staleness setting")
        ax.legend(fontsize=7)
        self.save(fig, "staleness")

    def _kmax(self):
        return max(self.runs[0].k_values)

    def _sweep_sparsity(self, ax, series):
        """Per-step (k=1) and largest-k mean sparsity of each sweep series; returns that k."""
        kmax = self._kmax()
        j = self.runs[0].k_values.index(kmax)
        for label, points in series:
            self._sweep_plot(ax, f"k=1, {label}", points, lambda r: 100 * r.steps["sparsity"].mean())
            self._sweep_plot(ax, f"k={kmax}, {label}", points, lambda r: 100 * mean_finite(r.kstep[:, j]), "s-")
        return kmax

    def lr(self):
        series = self._sweep("lr", lambda r: float(r.cfg("lr")))
        if not series:
            self.missing["lr"] = SWEEP_SCRIPTS["lr"]
            return
        fig, ax = self.plt.subplots(figsize=(8, 4.5))
        kmax = self._sweep_sparsity(ax, series)
        for k, fmt in ((1, "o--"), (kmax, "s:")):
            rows = sorted(paper.kstep_rows(model=paper.SWEPT_MODEL, mu=1, k=k), key=lambda r: r["lr"])
            ax.plot([r["lr"] for r in rows], [r["mean_pct"] for r in rows], fmt, **PAPER,
                    label=f"paper: {paper.SWEPT_MODEL}, k={k}")
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel("mean sparsity (%)")
        ax.set_title("sparsity against learning rate")
        ax.legend(fontsize=7)
        self.save(fig, "lr")

    def scale(self):
        series = self._sweep("model", lambda r: int(r.attrs["num_parameters"]))
        if not series:
            self.missing["scale"] = SWEEP_SCRIPTS["scale"]
            return
        fig, ax = self.plt.subplots(figsize=(8, 4.5))
        kmax = self._sweep_sparsity(ax, series)
        for k, fmt in ((1, "o"), (kmax, "s")):
            rows = paper.kstep_rows(lr=paper.DEFAULT_LR, mu=1, k=k)
            ax.plot([r["parameters"] for r in rows], [r["mean_pct"] for r in rows], fmt, mfc="none", **PAPER,
                    label=f"paper: k={k}, lr 3e-6 ({', '.join(r['model'] for r in rows)})")
        ax.set_xscale("log")
        ax.set_xlabel("parameters")
        ax.set_ylabel("mean sparsity (%)")
        ax.set_title("sparsity against model size")
        ax.legend(fontsize=7)
        self.save(fig, "scale")

    def absorption(self):
        runs = [r for r in self.runs if predict.of(r)]
        if not runs:
            self.missing["absorption"] = "no /absorption groups (pulse-train --absorption-every N, --precision mixed)"
            return
        fig, axes = self.plt.subplots(1, 3, figsize=(16, 5))
        for r in runs:
            a = r.absorption[-1]
            for ax, counts, (k0, k1) in ((axes[0], a.weight_counts, a.weight_k), (axes[1], a.ratio_counts, a.ratio_k)):
                edges = 2.0 ** np.arange(k0, k1 + 1)
                ax.stairs(counts[: k1 - k0] / a.elements, edges, label=f"{r.name} step {a.step}")
            p = predict.Prediction(r)
            (line,) = axes[2].plot(p.steps, 100 * p.absorbed, "o-", label=f"{r.name}: updates absorbed")
            axes[2].plot(p.steps, 100 * (1 - p.measured), "s--", color=line.get_color(),
                         label=f"{r.name}: BF16 weights unchanged (measured)")
            axes[2].plot(p.steps, 100 * (1 - p.predicted), "x:", color=line.get_color(),
                         label=f"{r.name}: unchanged, predicted from the histogram")
        axes[1].axvline(1.0, color="k", ls="--", lw=1, label="ratio = 1 (half a BF16 ulp)")
        for ax, xl in ((axes[0], "|w|"), (axes[1], "|update| / half-ulp(bf16(w))")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel(xl)
            ax.set_ylabel("fraction of weights")
            ax.legend(fontsize=7)
        axes[0].set_title("weight magnitudes")
        axes[1].set_title("update size in half-ulps (left of the line: absorbed)")
        axes[2].set_xlabel("step")
        _integer_x(axes[2])
        axes[2].set_ylabel("% of weights")
        axes[2].set_title("absorbed updates vs unchanged weights")
        axes[2].legend(fontsize=7)
        fig.suptitle("Absorbed: |update| < half a BF16 ulp, so bf16(w + u) = bf16(w). Unchanged: the BF16 copy kept its bits. "
                     "Fewer stay unchanged than are absorbed:\nan absorbed update still moves the FP32 master, which crosses "
                     "a rounding boundary with probability about |u| / ulp (the prediction, pulse_analysis/predict.py)",
                     fontsize=9)
        self.save(fig, "absorption")

    def prediction(self):
        runs = [r for r in self.runs if predict.of(r)]
        if not runs:
            self.missing["prediction"] = "no /absorption groups to predict from (--absorption-every N, --precision mixed)"
            return
        fig, (left, right) = self.plt.subplots(1, 2, figsize=(13, 4.8))
        for r in runs:
            p = predict.Prediction(r)
            (line,) = left.plot(r.steps["step"], 100 * (1 - r.steps["sparsity"]), lw=0.8, label=f"{r.name}: measured")
            if p.model == "pure BF16":
                left.plot(p.steps, 100 * p.predicted, "v", color=line.get_color(),
                          label=f"{r.name}: predicted, pure BF16: updates not absorbed ({100 * p.relative_error:+.0f}%)")
            else:
                left.errorbar(p.steps, 100 * p.predicted, yerr=[100 * (p.predicted - p.low), 100 * (p.high - p.predicted)],
                              fmt="x", capsize=3, color=line.get_color(),
                              label=f"{r.name}: predicted, FP32 master ({100 * p.relative_error:+.0f}% vs measured; "
                                    f"bars: bin width)")
                left.plot(p.steps, 100 * p.pure_bf16, "v", color=line.get_color(), mfc="none",
                          label=f"{r.name}: predicted in pure BF16 (absorbed updates lost)")
            for q in predict.pure_bf16_twins(r, self.runs):
                left.plot(q.steps["step"], 100 * (1 - q.steps["sparsity"]), ":", lw=0.8, color=line.get_color(),
                          label=f"{q.name}: measured in pure BF16 (--precision bf16)")
            right.plot(p.k_values, 100 * p.kstep_measured, "o-", color=line.get_color(), label=f"{r.name}: measured")
            if p.kstep_bounds is None:
                continue  # pure BF16: no k-step model
            right.fill_between(p.k_values, 100 * p.kstep_bounds["random walk"], 100 * p.kstep_bounds["same sign"],
                               color=line.get_color(), alpha=0.2,
                               label=f"{r.name}: predicted, random walk (low) to same sign (high)")
        _paper_kstep_envelope(right, changed=True)
        left.set_xlabel("step")
        _integer_x(left)
        left.set_ylabel("BF16 weights changed per step (%)")
        left.set_title("per-step changes: measured vs predicted from |u|/half-ulp")
        left.legend(fontsize=7)
        _k_axis(right, runs[0].k_values)
        right.set_yscale("log")
        right.set_ylabel("weights changed over k steps (%)")
        right.set_title("k-step changes: measured vs predicted bounds")
        right.legend(fontsize=7)
        fig.suptitle("prediction: P(change) = min(1, k^a |u| / ulp) per weight, a = 1/2 (random walk) or 1 (same sign); "
                     "pulse_analysis/predict.py", fontsize=9)
        self.save(fig, "prediction")

    def tensor_kinds(self):
        runs = [r for r in self.runs if "tensor_changed" in r.steps]
        if not runs:
            self.missing["tensor_kinds"] = "no /steps/tensor_changed"
            return
        fig, (left, right) = self.plt.subplots(1, 2, figsize=(13, 4.5))
        kinds = [k for k in tensor_kinds.KINDS if any(k in tensor_kinds.per_kind(r) for r in runs)]
        groups = [(label, [r for r in rs if r in runs]) for label, rs in self.groups]
        groups = [(label, rs) for label, rs in groups if rs]
        width = 0.8 / len(groups)
        x = np.arange(len(kinds))
        for g, (label, rs) in enumerate(groups):
            per = [tensor_kinds.per_kind(r) for r in rs]
            changed = [[100 * p[k][1].mean() / p[k][0] if k in p else 0.0 for k in kinds] for p in per]
            share = [[100 * p[k][1].sum() / max(1.0, sum(v[1].sum() for v in p.values())) if k in p else 0.0
                      for k in kinds] for p in per]
            for ax, vals in ((left, np.array(changed)), (right, np.array(share))):
                err = [vals.mean(0) - vals.min(0), vals.max(0) - vals.mean(0)] if len(rs) > 1 else None
                ax.bar(x + g * width, vals.mean(0), width, yerr=err, capsize=2, label=f"{label} ({_seeds(rs)})")
        elements = tensor_kinds.per_kind(runs[0])
        labels = [f"{k}\n{elements[k][0]:,} el." if k in elements else k for k in kinds]
        for ax in (left, right):
            ax.set_xticks(x + width * (len(groups) - 1) / 2)
            ax.set_xticklabels(labels, fontsize=8)
            ax.set_xlabel("tensor kind (by name; elements in the first run)")
            ax.legend(fontsize=7)
        left.axhline(100 - min(r["mean_pct"] for r in paper.kstep_rows(lr=paper.DEFAULT_LR, mu=1, k=1)),
                     ls="--", **PAPER, label="paper: whole-model changed per step, worst of its models (lr 3e-6)")
        left.legend(fontsize=7)
        left.set_ylabel("BF16 weights changed per step (%)")
        left.set_title("changed per step, by tensor kind (mean over steps)")
        right.set_ylabel("share of all changed weights (%)")
        right.set_title("where the changes are")
        self.save(fig, "tensor_kinds")

    def grad_sparsity(self):
        if any("grad_sparsity" not in r.steps for r in self.runs):
            return  # pulse-measure files: weights only, no gradients
        fig, (left, right) = self.plt.subplots(1, 2, figsize=(12, 4.5))
        for label, runs in self.groups:
            th = np.asarray(runs[0].step_attrs["grad_sparsity"]["thresholds"], dtype=float)
            means = 100 * np.array([r.steps["grad_sparsity"].mean(axis=0) for r in runs]).mean(axis=0)
            pos = th > 0
            (line,) = left.plot(th[pos], means[pos], "o-", label=f"{label} ({_seeds(runs)})")
            for t, m in zip(th[~pos], means[~pos]):
                left.axhline(m, color=line.get_color(), ls=":", label=f"{label}: exactly zero (threshold {t:g}): {m:.2f}%")
        r = self.runs[0]
        for j, t in enumerate(r.step_attrs["grad_sparsity"]["thresholds"]):
            right.plot(r.steps["step"], 100 * r.steps["grad_sparsity"][:, j], label=f"|g| <= {t:g}")
        left.set_xscale("log")
        left.set_xlabel("threshold (log; threshold 0 as a dotted line)")
        left.set_ylabel("mean fraction of |g| <= threshold (%)")
        left.set_title("gradient sparsity (dense gradients, sparse BF16 updates)")
        left.legend(fontsize=7)
        right.set_xlabel("step")
        _integer_x(right)
        right.set_ylabel("fraction of |g| <= threshold (%)")
        right.set_title(f"gradient sparsity over steps ({r.name})")
        right.legend(fontsize=7)
        self.save(fig, "grad_sparsity")

    def training(self):
        """One panel per series some run holds (reward, loss, pass@1); none without any."""
        held = {name: [r for r in self.runs if np.isfinite(r.steps[name]).any()] for name in ("reward", "loss", "eval_pass1")}
        panels = [name for name, runs in held.items() if runs]
        if not panels:
            self.missing["training"] = "no reward, loss or evaluation in these files (weights only)"
            return
        fig, axes = self.plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.5), squeeze=False)
        axes = dict(zip(panels, axes[0]))
        for name in ("reward", "loss"):
            if name not in axes:
                continue
            for label, runs in self.groups:
                runs = [r for r in runs if r in held[name]]
                if runs:
                    self._band(axes[name], label, runs, lambda r: r.steps[name])
        for r in held["eval_pass1"]:
            ev = r.steps["eval_pass1"]
            ok = np.isfinite(ev)
            n = int(r.cfg("eval-problems", 128))
            lo, hi = wilson(ev[ok], n)
            axes["eval_pass1"].errorbar(r.steps["step"][ok], 100 * ev[ok], yerr=[100 * (ev[ok] - lo), 100 * (hi - ev[ok])],
                                        fmt="o", capsize=3, label=f"{r.name} (n={n} problems, 95% Wilson interval)")
        text = {"reward": ("mean reward", "mean rollout reward"), "loss": ("loss", "training loss"),
                "eval_pass1": ("greedy pass@1 (%)", "greedy pass@1 on held-out problems")}
        for name, ax in axes.items():
            ax.set_xlabel("step")
            _integer_x(ax)
            ax.set_ylabel(text[name][0])
            ax.set_title(text[name][1] + (" (bands: min-max over seeds)" if self._banded and name != "eval_pass1" else ""))
            ax.legend(fontsize=7)
        self.save(fig, "training")

    def comm(self, rows):
        runs = [r for r in self.runs if exchanges(r)]
        if not runs:
            self.missing["comm"] = "no run with >= 2 trainer ranks (one trainer sends to no one): jobs/loco.sbatch"
            return
        gated = [r for r in runs if "gate_density" in r.steps and np.isfinite(r.steps["gate_density"]).any()]
        fig, axes = self.plt.subplots(1, 3 if gated else 2, figsize=(16 if gated else 11, 4.5))
        per_step = [trainer_bytes(r).astype(float) for r in runs]
        for r, b in zip(runs, per_step):
            axes[0].plot(r.steps["step"], b, ".-", label=f"{r.trainer_sync}: {r.name}")
            axes[1].plot(r.steps["step"], np.cumsum(b), label=f"{r.trainer_sync}: {r.name}")
        for r in gated:
            g = r.steps["gate_density"]
            ok = np.isfinite(g)
            axes[2].plot(r.steps["step"][ok], 100 * g[ok], "o-", label=f"{r.trainer_sync}: {r.name}")
        measured = {row["method"]: row["over_pulseloco"] for row in rows if math.isfinite(row["over_pulseloco"])}
        cite = (f"paper: PULSELoCo sends >{paper.headline('loco_vs_diloco')['value']:g}x less than DiLoCo,\n"
                f">{paper.headline('loco_vs_ddp')['value']:g}x less than DDP (largest setting, v2 abstract)")
        here = ", ".join(f"{m} {v:.3g}x" for m, v in measured.items() if m != "pulseloco")
        axes[0].set_yscale("symlog", linthresh=1)
        axes[0].set_ylabel("bytes per step (symlog)")
        axes[0].set_title("trainer-to-trainer bytes per step")
        axes[1].set_yscale("symlog", linthresh=1)
        axes[1].set_ylabel("cumulative bytes (symlog)")
        _decade_ylim(axes[0], per_step)
        _decade_ylim(axes[1], [np.cumsum(b) for b in per_step])
        axes[1].set_title(("measured over PULSELoCo: " + here + "\n" if here else "") + cite, fontsize=8)
        if gated:
            axes[2].set_ylabel("entries sent on outer steps (%)")
            axes[2].set_title("gate density (diloco: 100%, pulseloco: the BF16 gate)")
        for ax in axes:
            ax.set_xlabel("step")
            _integer_x(ax)
            ax.legend(fontsize=7)
        fig.suptitle("communication between trainers per trainer-sync method (sum over trainer ranks)")
        self.save(fig, "comm")

    def sync(self):
        runs = [r for r in self.runs if r.steps["patch_bytes"].sum() > 0]
        if not runs:
            self.missing["sync"] = "no patches sent (inference-ranks 0)"
            return
        fig, (left, right) = self.plt.subplots(1, 2, figsize=(12, 4.5))
        ratios = []
        for r in runs:
            s = r.steps
            (line,) = left.plot(s["step"], s["patch_bytes"], label=f"{r.name} patch")
            left.plot(s["step"], s["dense_bytes"], ":", color=line.get_color(), label=f"{r.name} dense BF16")
            with np.errstate(divide="ignore"):
                ratios.append(s["dense_bytes"] / s["patch_bytes"].astype(float))
            right.plot(s["step"], ratios[-1], label=r.name)
        d, p = paper.headline("sync_dense_bytes_7b"), paper.headline("sync_patch_bytes_7b")
        _decade_ylim(left, [r.steps[c] for r in runs for c in ("patch_bytes", "dense_bytes")])
        _decade_ylim(right, [x[np.isfinite(x)] for x in ratios] + [[d["value"] / p["value"]]])
        right.axhline(d["value"] / p["value"], ls="--", **PAPER,
                      label=f"paper 7B: 14 GB -> 108 MB = {d['value'] / p['value']:.0f}x ({p['source']})")
        left.set_yscale("log")
        left.set_ylabel("bytes per step")
        left.set_title("trainer -> inference: PULSESync patch vs dense BF16")
        right.set_yscale("log")
        right.set_ylabel("dense / patch")
        right.set_title("compression against dense BF16")
        for ax in (left, right):
            ax.set_xlabel("step")
            _integer_x(ax)
            ax.legend(fontsize=7)
        self.save(fig, "sync")

    def bandwidth(self, model, grid_bps):
        fig, (left, right) = self.plt.subplots(1, 2, figsize=(13, 4.8))
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
        for name, ls in (("bandwidth_90pct_dense", "-."), ("bandwidth_90pct_patch", ":")):
            h = paper.headline(name)
            right.axvline(h["value"], ls=ls, **PAPER, label=f"paper 7B: {h['text']}: {h['value']:g} Gbit/s")
        right.axhline(90, lw=0.5, **PAPER)
        left.set_yscale("log")
        left.set_ylabel("sync time per step (s)")
        left.set_title("sync time: dense vs patch (encode + send + apply)")
        right.set_ylabel("utilisation of the compute (%)")
        right.set_title("compute / (compute + sync), sync not overlapped")
        for ax in (left, right):
            ax.set_xscale("log")
            ax.set_xlabel("link bandwidth (Gbit/s)")
            ax.legend(fontsize=7)
        fig.suptitle(f"model of {model.params:.3g} parameters, compute {model.compute_s:.3g} s/step; codec speeds:\n"
                     + "\n".join(model.speed_source.split("; ")), fontsize=9)
        self.save(fig, "bandwidth")
