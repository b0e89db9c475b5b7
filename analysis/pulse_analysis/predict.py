"""Predicted BF16 changes from a run's absorption histograms (mixed precision: FP32 master weights,
BF16 copy; pulse-train writes /absorption/step_NNNNNN every --absorption-every steps).

The model. The histogram counts r = |u| / half_ulp(bf16(w)) for each weight's FP32 update u in a
step. The BF16 copy changes when the master crosses a rounding boundary; neighbouring boundaries
are one BF16 ulp = 2 half-ulps apart. If a master's position between its two boundaries is
uniform (it has drifted for many steps), one update of size |u| crosses a boundary with
probability min(1, |u| / ulp) = min(1, r / 2). So the expected changed fraction of a step is

    c1 = sum over bins b of  n_b / N * min(1, r_b / 2)

with r_b the bin's geometric centre 2^(j + 1/2) for bin [2^j, 2^(j+1)), 1 for the bin above the
range and 0 for exact zeros and the bin below. An update under half an ulp is "absorbed" (the
cast of w + u alone gives bf16(w)), yet it still moves the master, and with probability r / 2 it
crosses a boundary: that is why fewer weights stay unchanged than updates are absorbed.
In pure BF16 (no FP32 master) an absorbed update is lost, so the same
updates would change only the weights with r >= 1: c1 = 1 - absorbed / N (`pure_bf16`).
Which model a run is held to follows from its precision attribute: "mixed" (an FP32 master and
its BF16 copy) the first, "bf16" (the weights themselves in BF16) the second, exactly (absorbed is
counted per element, no bin width); a run of any other precision (a checkpoint series measured as
stored, an FP32 run) is held to neither.
The bin width bounds the prediction's own resolution: r at the bins' lower and upper edges gives
c1 / sqrt(2) and sqrt(2) c1 for the sub-threshold part (the stated tolerance, `low` and `high`).

Over k steps the master moves between sqrt(k) |u| (signs independent from step to step, a random
walk) and k |u| (the same sign every step, as Adam's momentum keeps it for a while), so the k-step
changed fraction lies between the sums with min(1, sqrt(k) r_b / 2) (r_b at the lower bin edges)
and min(1, k r_b / 2) (r_b at the upper edges), using the histograms pooled over the recorded
steps; at k = 1 the two bounds are the bin-width band. Assumed: updates of one weight have about
the same size over k steps, and no weight crosses into another binade (ulp) on the way."""
import math

import numpy as np

from .runs import FOLLOWS_FROM_MODEL

# (name, exponent of k): how the displacement over k steps grows
KSTEP_BOUNDS = (("random walk", 0.5), ("same sign", 1.0))


def _bin_ratios(a, edge):
    """Per slot of the ratio histogram (bins, zero, below, above, non-finite): the ratio used."""
    k0, k1 = a.ratio_k
    j = np.arange(k0, k1, dtype=float)
    offset = {"low": 0.0, "centre": 0.5, "high": 1.0}[edge]
    below = 2.0 ** k0 if edge == "high" else 0.0
    return np.concatenate([2.0 ** (j + offset), [0.0, below, math.inf, 0.0]])


def changed_fraction(a, k=1, exponent=1.0, edge="centre"):
    """Expected fraction of weights whose BF16 copy differs after k steps of this histogram's
    updates (module docstring); edge: which point of each log2 bin stands for its ratios."""
    r = _bin_ratios(a, edge)
    with np.errstate(invalid="ignore"):
        p = np.minimum(1.0, (k ** exponent) * r / 2.0)
    return float(np.sum(a.ratio_counts * p) / a.elements)


class Mean:
    """The recorded histograms of a run pooled (summed): stands for a typical step's updates."""

    def __init__(self, absorption):
        first = absorption[0]
        self.ratio_k = first.ratio_k
        self.ratio_counts = np.sum([x.ratio_counts for x in absorption], axis=0)
        self.elements = int(self.ratio_counts.sum())


# config keys in which a pure-BF16 twin of a mixed-precision run may differ (the warm start's
# path may be spelled differently; the model is the same)
TWIN_KEYS = {"precision", "absorption-every"} | FOLLOWS_FROM_MODEL


# precision attribute -> the model of the module docstring a run is held to
MODELS = {"mixed": "FP32 master", "bf16": "pure BF16"}


def pure_bf16_twins(run, runs):
    """For a mixed-precision run: the runs with --precision bf16 and otherwise its config (seed
    included; both configs given): they measure what `pure_bf16` predicts."""
    if run.attrs.get("precision") != "mixed" or not run.config:
        return []
    same = [(k, v) for k, v in run.variant() if k not in TWIN_KEYS] + [("seed", repr(run.cfg("seed")))]
    return [q for q in runs if q.attrs.get("precision") == "bf16" and q.config and
            [(k, v) for k, v in q.variant() if k not in TWIN_KEYS] + [("seed", repr(q.cfg("seed")))] == same]


def of(run):
    """The run's Prediction, or None when its precision has no model or it recorded no histogram at
    a step it has a row for."""
    rows = {int(x) for x in run.steps["step"]}
    return Prediction(run) if run.attrs.get("precision") in MODELS and any(a.step in rows for a in run.absorption) \
        else None


class Prediction:
    """Per-step and k-step predictions of one run against what it measured."""

    def __init__(self, run):
        self.run = run.name
        self.source = run
        rows = {int(s): i for i, s in enumerate(run.steps["step"])}
        recorded = [a for a in run.absorption if a.step in rows]
        if not recorded:
            raise ValueError(f"{run.name}: no absorption histograms to predict from")
        self.steps = np.array([a.step for a in recorded])
        self.measured = np.array([1.0 - run.steps["sparsity"][rows[a.step]] for a in recorded])
        self.absorbed = np.array([a.absorbed / a.elements for a in recorded])
        self.pure_bf16 = 1.0 - self.absorbed  # the same updates without an FP32 master to keep them
        self.model = MODELS[run.attrs.get("precision")]
        self.k_values = list(run.k_values)
        self.kstep_measured = np.array([_nanmean(1.0 - run.kstep[:, j]) for j in range(len(self.k_values))])
        if self.model == "pure BF16":  # exact: no band; no k-step model (a lost update is not carried)
            self.predicted = self.low = self.high = self.pure_bf16
            self.kstep_bounds = None
            return
        self.predicted = np.array([changed_fraction(a) for a in recorded])
        self.low = np.array([changed_fraction(a, edge="low") for a in recorded])
        self.high = np.array([changed_fraction(a, edge="high") for a in recorded])
        pooled = Mean(recorded)
        # low: random walk with each bin's lower edge; high: same sign with its upper edge
        self.kstep_bounds = {name: np.array([changed_fraction(pooled, k, e, edge) for k in self.k_values])
                             for (name, e), edge in zip(KSTEP_BOUNDS, ("low", "high"))}

    @property
    def mean_measured(self):
        return float(self.measured.mean())

    @property
    def mean_predicted(self):
        return float(self.predicted.mean())

    @property
    def relative_error(self):
        """(predicted - measured) / measured of the per-step changed fraction, means over the
        recorded steps."""
        return (self.mean_predicted - self.mean_measured) / self.mean_measured if self.mean_measured else math.nan

    @property
    def within_tolerance(self):
        """Measured mean inside the bin-width band of the prediction."""
        return bool(self.low.mean() <= self.mean_measured <= self.high.mean())

    def kstep_inside(self):
        """Per k: whether the measured k-step changed fraction lies between the two bounds (None
        where the run is too short to measure k steps, or the model has no k-step bounds)."""
        if self.kstep_bounds is None:
            return [None] * len(self.k_values)
        lo, hi = self.kstep_bounds["random walk"], self.kstep_bounds["same sign"]
        return [bool(a <= m <= b) if math.isfinite(m) else None for a, m, b in zip(lo, self.kstep_measured, hi)]

    def twin_statement(self, twin):
        measured = 1.0 - float(np.mean(twin.steps["sparsity"]))
        predicted = float(self.pure_bf16.mean())
        return (f"`{twin.name}` (pure BF16, otherwise the config of `{self.run}`): measured {100 * measured:.3g}% "
                f"changed per step, predicted {100 * predicted:.3g}% from `{self.run}`'s histograms "
                f"({100 * (predicted - measured) / measured:+.0f}%).")

    def statement(self):
        """One sentence on agreement, for the report."""
        if self.model == "pure BF16":
            return (f"`{self.run}` (pure BF16: an update changes a weight when it is at least half an ulp): per-step "
                    f"changed fraction measured {100 * self.mean_measured:.3g}%, predicted {100 * self.mean_predicted:.3g}% "
                    f"({100 * self.relative_error:+.0f}%) = the {100 * (1 - self.pure_bf16.mean()):.3g}% of updates not "
                    f"absorbed, over {len(self.steps)} recorded steps.")
        s = (f"`{self.run}` (FP32 master): per-step changed fraction measured {100 * self.mean_measured:.3g}%, predicted "
             f"{100 * self.mean_predicted:.3g}% ({100 * self.relative_error:+.0f}%; bin-width band "
             f"{100 * self.low.mean():.3g}-{100 * self.high.mean():.3g}%: "
             f"{'inside' if self.within_tolerance else 'outside'}) over {len(self.steps)} recorded steps; "
             f"{100 * self.absorbed.mean():.3g}% of updates absorbed, so in pure BF16 (no FP32 master: absorbed updates "
             f"are lost) they would change {100 * self.pure_bf16.mean():.3g}% per step.")
        inside = self.kstep_inside()
        s += (f" k-step: measured between the random-walk and same-sign bounds for "
              f"k = {', '.join(str(k) for k, ok in zip(self.k_values, inside) if ok) or 'none'}")
        outside = [(k, m, lo, hi) for k, ok, m, lo, hi in zip(self.k_values, inside, self.kstep_measured,
                                                            self.kstep_bounds["random walk"],
                                                            self.kstep_bounds["same sign"]) if ok is False]
        short = [k for k, ok in zip(self.k_values, inside) if ok is None]
        if outside:
            s += "; outside for " + ", ".join(
                f"k={k} (measured {100 * m:.3g}%, bounds {100 * lo:.3g}-{100 * hi:.3g}%)" for k, m, lo, hi in outside)
        if short:
            s += f"; not measured (run shorter than k) for k = {', '.join(map(str, short))}"
        return s + "."


def _nanmean(x):
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else math.nan
