"""Reading pulse-train statistics files (one HDF5 file per run; the datasets are those of
`pulse-train --print-schema`, and each file lists its own in its "datasets" attribute): root
attributes, /steps/*, /kstep/sparsity, /ranks/* and /absorption/step_NNNNNN."""
import json
import os
import tomllib

import numpy as np

# Config keys that do not change what is measured: runs that differ only in these are repetitions
# of one variant (seeds, where their seeds differ; see group_runs). The label names a run.
NOT_A_VARIANT = {"seed", "out", "overwrite", "resume", "quiet", "config", "checkpoint-every", "relay", "anchor-every",
                 "keep-anchors", "label"}


# Config keys that follow from the model swept (its own warm start).
FOLLOWS_FROM_MODEL = {"init", "sft-steps"}

REQUIRED = ["/steps/" + d for d in ("step", "sparsity", "changed", "patch_bytes", "dense_bytes")] + ["/kstep/sparsity"]


class PerStep(dict):
    """/steps/NAME by NAME. A series the file does not hold (pulse-measure reads weights only; its
    root attribute absent_datasets says why) reads as a column of NaN; `in` still tells whether the
    file holds it (a file without /steps/grad_sparsity has no gradient figure)."""

    def __init__(self, series, rows):
        super().__init__(series)
        self.rows = rows

    def __missing__(self, name):
        return np.full(self.rows, np.nan)


def _plain(value):
    """HDF5 attribute -> str, list of str, number or list of numbers."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "OSU":
            return [v.decode() if isinstance(v, bytes) else str(v) for v in value.ravel()]
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _attrs(obj):
    return {k: _plain(v) for k, v in obj.attrs.items()}


class Absorption:
    """Histograms of one step: |update| / half-ulp(bf16(w)) and |w| in log2 bins."""

    def __init__(self, step, group):
        self.step = step
        self.ratio_counts = group["ratio_counts"][()].astype(np.int64)
        self.weight_counts = group["weight_counts"][()].astype(np.int64)
        self.absorbed = int(group["absorbed"][0])
        self.ratio_k = [int(k) for k in _plain(group["ratio_counts"].attrs["k_range"])]
        self.weight_k = [int(k) for k in _plain(group["weight_counts"].attrs["k_range"])]

    @property
    def elements(self):
        """Every element falls in exactly one bin (log2 bins, zero, below, above, non-finite)."""
        return int(self.ratio_counts.sum())

class Run:
    """One statistics file, read whole (they are small: a few numbers per step and rank)."""

    def __init__(self, path):
        import h5py

        self.path = path
        self.name = os.path.splitext(os.path.basename(path))[0]
        try:
            f = h5py.File(path, "r", locking=False)
        except OSError as e:
            raise ValueError(f"{path}: cannot open as HDF5 ({e})") from None
        with f:
            self.attrs = _attrs(f)
            if self.attrs.get("format") != "pulse-train statistics":
                raise ValueError(f"{path}: not a pulse-train statistics file (format attribute "
                                 f"{self.attrs.get('format')!r})")
            missing = [d for d in REQUIRED if d not in f]
            if missing:
                raise ValueError(f"{path}: lacks dataset(s) {', '.join(missing)}")
            # path -> kind, units, description, as the writer declared them (empty for files of other writers)
            self.datasets = json.loads(self.attrs.get("datasets", "{}"))
            self.steps = PerStep({k: d[()] for k, d in f["steps"].items()}, f["steps/step"].shape[0])
            self.step_attrs = {k: _attrs(d) for k, d in f["steps"].items()}
            self.kstep = f["kstep/sparsity"][()]
            self.k_values = [int(k) for k in _plain(f["kstep/sparsity"].attrs["k_values"])]
            self.ranks = {k: d[()] for k, d in f["ranks"].items()} if "ranks" in f else {}
            self.absorption = []
            if "absorption" in f:
                for g in sorted(f["absorption"]):
                    self.absorption.append(Absorption(int(g.split("_")[-1]), f["absorption"][g]))
        self.config = tomllib.loads(self.attrs.get("config", ""))

    @property
    def rows(self):
        return len(self.steps["step"])

    def cfg(self, key, default=None):
        """A config value by its flag name (num-iterations); accepts num_iterations spelling too."""
        for k in (key, key.replace("-", "_")):
            if k in self.config:
                return self.config[k]
        return default

    @property
    def trainer_sync(self):
        return self.attrs.get("trainer_sync", self.cfg("trainer-sync", "ddp"))

    @property
    def trainer_ranks(self):
        return [r for r, role in enumerate(self.attrs.get("roles", [])) if role == "trainer"]

    @property
    def inference_ranks(self):
        return [r for r, role in enumerate(self.attrs.get("roles", [])) if role == "inference"]

    def variant(self):
        """The config without the keys that only repeat a measurement (see NOT_A_VARIANT)."""
        flat = {k.replace("_", "-"): v for k, v in self.config.items()}
        return tuple(sorted((k, repr(v)) for k, v in flat.items() if k not in NOT_A_VARIANT))

def seeds_of_one_variant(runs):
    """Whether runs (of one variant) differ in seed alone: each has a seed, and no two the same."""
    seeds = [repr(r.cfg("seed")) for r in runs]
    return "None" not in seeds and len(set(seeds)) == len(seeds)


def group_runs(runs):
    """Runs grouped by variant (the config without NOT_A_VARIANT), in first-seen order. Several runs
    share a group only where they differ in seed alone; a run whose file says nothing about it (no
    config: pulse-measure without --set) or that repeats another's seed is a group of its own. A
    group is labelled by its runs' common label (--label), else by the config keys that differ
    between the groups (e.g. 'lr=1e-05'), else by its runs' common stem."""
    variants = {}
    for r in runs:
        variants.setdefault(r.variant() if r.config else (("file", r.path),), []).append(r)
    groups = []
    for key, rs in variants.items():
        if len(rs) == 1 or seeds_of_one_variant(rs):
            groups.append((key, rs))
        else:
            groups += [(key + (("file", r.path),), [r]) for r in rs]
    described = [dict(key) for key, rs in groups if rs[0].config]
    differing = sorted({k for d in described for k in d if k != "file" and any(d.get(k) != e.get(k) for e in described)})
    # a model's own warm start (init, sft-steps) follows from the model: named only when alone
    if set(differing) - FOLLOWS_FROM_MODEL:
        differing = [k for k in differing if k not in FOLLOWS_FROM_MODEL]
    out = []
    for key, rs in groups:
        d = dict(key)
        names = {r.cfg("label", r.attrs.get("label")) for r in rs}
        if len(names) == 1 and None not in names:
            label = str(names.pop())
        elif rs[0].config and differing:
            label = ", ".join(f"{k}={d[k] if k in d else '-'}".replace("'", "") for k in differing)
        else:
            label = os.path.commonprefix([r.name for r in rs]).rstrip("-_") or rs[0].name
        out.append((label, rs))
    labels = [label for label, _ in out]
    return [(f"{label} [{rs[0].name}]" if labels.count(label) > 1 else label, rs) for label, rs in out]


def exchanges(run):
    """Whether the run's trainers exchanged anything: at least two trainer ranks and the bytes they
    sent on record (one trainer has no one to send to)."""
    return len(run.trainer_ranks) >= 2 and "bytes_sent" in run.ranks


def trainer_bytes(run):
    """Trainer-to-trainer bytes (gradients or pseudo-gradients) the trainer ranks hand to MPI in
    each step (row), summed over trainer ranks; files without /ranks/trainer_bytes_sent (written
    before it existed) give all bytes the trainer ranks sent."""
    name = "trainer_bytes_sent" if "trainer_bytes_sent" in run.ranks else "bytes_sent"
    return run.ranks[name][:, run.trainer_ranks].sum(axis=1)
