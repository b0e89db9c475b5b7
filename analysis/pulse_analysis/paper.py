"""The paper's published numbers (arXiv 2602.03839), read from paper.json in this package: every
k-step summary row the paper's measurement data holds (model, num_iterations, lr, k: mean and
min over seeds and steps, in percent) and its headline ratios, each with its source. The report
draws them as reference marks and adds them as table columns; it never computes them."""
import functools
import importlib.resources
import json

# The model the paper sweeps lr and num_iterations on.
SWEPT_MODEL = "Qwen-1.5B"
# The paper's default learning rate (its model-size comparison runs at it).
DEFAULT_LR = 3e-6


@functools.cache
def data():
    return json.loads(importlib.resources.files(__package__).joinpath("paper.json").read_text())


def kstep_rows(model=None, lr=None, mu=None, k=None):
    """Summary rows (dicts, sparsity in percent) that match every given key."""
    return [r for r in data()["kstep"]
            if (model is None or r["model"] == model) and (lr is None or _same_lr(r["lr"], lr))
            and (mu is None or r["iteration_num"] == mu) and (k is None or r["k"] == k)]


def _same_lr(a, b):
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b))


def headline(name):
    """One headline fact: dict with value, unit, text and source."""
    for h in data()["headline"]:
        if h["name"] == name:
            return h
    raise KeyError(name)


def models():
    """Paper models in order of size."""
    seen = {}
    for r in data()["kstep"]:
        seen[r["model"]] = r["parameters"]
    return sorted(seen, key=seen.get)


def matching(lr, mu, k):
    """The paper's k-step sparsity for a run's lr and num_iterations: (mean fraction over the
    matching models, their names), or (None, []) when the paper has no run at that lr and μ."""
    rows = kstep_rows(lr=lr, mu=mu, k=k)
    if not rows:
        return None, []
    return sum(r["mean_pct"] for r in rows) / len(rows) / 100.0, [r["model"] for r in rows]


def source():
    return data()["kstep_source"]
