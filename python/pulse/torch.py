"""The paper's measurements inside any PyTorch training loop.

    recorder = pulse.torch.SparsityRecorder(model, out="run.h5", optimizer=opt)
    for batch in data:
        loss = ...; loss.backward(); opt.step(); opt.zero_grad()
        recorder.step(loss=loss.item())
    recorder.close()                      # then: python3 -m pulse_analysis report run.h5

Each step records, against the BF16 weights the inference side would see (bf16(θ), cast
round-to-nearest-even as torch's .to(torch.bfloat16)): changed elements, per-step sparsity, per
tensor changes, k-step sparsity, and the bytes of the PULSESync patch (encoded by pulse's C++
library). Given an Adam-family optimizer (torch.optim.AdamW), the quantiles of |m_hat| /
(sqrt(v_hat) + eps) from its exp_avg / exp_avg_sq, and every absorption_every steps histograms
of |u| / half_ulp(bf16(w)) and |w|: u is the FP32 master's change for FP32 parameters (mixed
precision), or the AdamW update rebuilt from the optimizer state for BF16 parameters. The file
is pulse-train's HDF5 schema (src/train/stats_schema, `pulse-train --print-schema`), written by pulse's own writer
(src/io/stats_file) through the binding, on a singleton MPI communicator.
"""
import collections
import datetime
import sys
import time

import torch

from . import Sender, _pulse, inspect

ADAM_QUANTILES = (0.5, 0.9, 0.99, 0.999)
RATIO_RANGE = (-24, 16)   # log2 bins of |u| / half_ulp(bf16(w)), as pulse-train
WEIGHT_RANGE = (-40, 8)   # log2 bins of |w|
GRAD_THRESHOLDS = (0.0, 1e-10, 1e-8, 1e-6)

# The series whose meaning in the recorder differs from pulse-train's (the schema, src/train/stats_schema,
# lists every dataset; a series the recorder does not measure keeps the schema's description and reads
# as NaN or -1).
_RECORDER_MEANING = {
    "/steps/time_s": "wall time since the recorder started",
    "/steps/lr": "learning rate of the step (first parameter group)",
    "/steps/loss": "loss of the step, when given to step()",
    "/steps/reward": "mean reward of the step, when given to step()",
    "/steps/grad_norm": "global gradient norm of the step (the .grad tensors after the step)",
    "/steps/encode_s": "PULSESync patch encode time",
    "/steps/step_s": "wall time between two step() calls",
    "/steps/measure_s": "time the recorder's measurements took in the step",
    "/steps/sync_s": "PULSESync time (encode)",
    "/steps/write_s": "time the previous row took to write and flush",
    "/steps/eval_pass1": "evaluation score, when given to step() (NaN otherwise)",
    "/steps/tokens": "tokens trained on in the step, when given to step()",
    "/steps/patch_bytes": "coded PULSESync patch from the previous version",
}


def _schema():
    """pulse-train's datasets, path -> entry (path, type, kind, columns_attribute, units, description)."""
    return {c["path"]: c for c in _pulse.train_stats_schema()}


def bf16_copy(t):
    """A copy of bf16(t) (round to nearest even, as torch casts); compare bits through .view(torch.int16)."""
    return t.detach().to(torch.bfloat16, copy=True)


def bits(t):
    return t.view(torch.int16)


def floor_log2_abs(x):
    """floor(log2 |x|) for finite nonzero float32 x, exact for subnormals (frexp's exponent - 1)."""
    return torch.frexp(x)[1] - 1


def log2_histogram(k, finite, zero, k_range):
    """Counts of the log2 bins [2^k, 2^(k+1)) for k in k_range, then zero, below, above, non-finite
    (kernels/absorption.hpp's slots)."""
    k_min, k_max = k_range
    bins = k_max - k_min
    slot = torch.where(k < k_min, bins + 1, torch.where(k >= k_max, bins + 2, k - k_min))
    slot = torch.where(zero, bins, slot)
    slot = torch.where(finite, slot, bins + 3)
    return torch.bincount(slot.to(torch.int64), minlength=bins + 4).tolist()


def half_ulp_of_bf16(w):
    """half an ulp of bf16(w), a power of two (inf or NaN where bf16(w) is not finite)."""
    b = w.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
    e = (b >> 7) & 0xFF
    half = torch.ldexp(torch.ones_like(w), (torch.clamp(e, min=1) - 127 - 8).to(torch.float32))
    return torch.where(e == 0xFF, torch.full_like(w, float("inf")), half)


def absorption(w, u):
    """(ratio_counts, weight_counts, absorbed) of updates u to weights w (float32), as pulse-train."""
    w_finite, u_finite = torch.isfinite(w), torch.isfinite(u)
    w_zero, u_zero = w == 0, u == 0
    weight_counts = log2_histogram(floor_log2_abs(w), w_finite, w_zero, WEIGHT_RANGE)
    half = half_ulp_of_bf16(torch.where(w_finite, w, torch.zeros_like(w)))
    r_finite = w_finite & u_finite & torch.isfinite(half)
    k = floor_log2_abs(u) - floor_log2_abs(torch.where(torch.isfinite(half), half, torch.ones_like(half)))
    ratio_counts = log2_histogram(k, r_finite, u_zero, RATIO_RANGE)
    absorbed = int((r_finite & (u_zero | (k < 0))).sum())
    return ratio_counts, weight_counts, absorbed


def quantiles(x, qs):
    """Quantiles with linear interpolation between order statistics (numpy's default)."""
    x, _ = torch.sort(x.to(torch.float64))
    out = []
    for q in qs:
        pos = q * (x.numel() - 1)
        lo = int(pos)
        hi = min(lo + 1, x.numel() - 1)
        out.append(float(x[lo] + (x[hi] - x[lo]) * (pos - lo)))
    return out


class SparsityRecorder:
    """Records BF16 update sparsity, patch sizes and (given an Adam-family optimizer) Adam ratios
    and absorption into `out`, one row per step() after optimizer.step()."""

    def __init__(self, model, out="run.h5", optimizer=None, k_values=(1, 2, 4, 8, 16, 32), absorption_every=0,
                 overwrite=False):
        self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not self.params:
            raise _pulse.Error("SparsityRecorder: the model has no trainable parameters")
        self.optimizer = optimizer
        self.k_values = tuple(int(k) for k in k_values)
        self.absorption_every = int(absorption_every)
        self.mixed = any(p.dtype != torch.bfloat16 for _, p in self.params)
        self.numel = sum(p.numel() for _, p in self.params)
        self.t = 0
        self.bf16 = {n: bf16_copy(p) for n, p in self.params}
        self.history = collections.deque([dict(self.bf16)], maxlen=max(self.k_values))  # [-k]: k steps back
        self.sender = Sender(self.bf16)
        self.master = self._master_copy()
        self.start = self.last = time.perf_counter()
        self.write_s = float("nan")
        self.file = _pulse.StatsFile(str(out), "overwrite" if overwrite else "create")
        self._declare(model)

    def _master_copy(self):
        if not (self.absorption_every and self.mixed):
            return None
        return {n: p.detach().to(torch.float32).clone() for n, p in self.params}

    def _declare(self, model):
        f = self.file
        names = [n for n, _ in self.params]
        labels = {"tensor_names": names, "thresholds": list(GRAD_THRESHOLDS), "quantiles": list(ADAM_QUANTILES),
                  "k_values": [float(k) for k in self.k_values]}
        for path, c in _schema().items():
            if c["kind"] != "per_step":  # one process: no per-rank series; arrays are written when due
                continue
            columns = labels.get(c["columns_attribute"], [])
            f.declare(path, c["type"], len(columns), c["units"], _RECORDER_MEANING.get(path, c["description"]))
            if columns:
                f.set_dataset_attribute(path, c["columns_attribute"], columns)
        precision = "mixed" if self.mixed else "bf16"
        config = (f'model = "{type(model).__name__}"\nprecision = "{precision}"\n'
                  f'optimizer = "{type(self.optimizer).__name__ if self.optimizer else ""}"\n'
                  f'absorption-every = {self.absorption_every}\n')
        for key, value in [("format", "pulse-train statistics"), ("program_version", "pulse.torch"),
                           ("start_utc", datetime.datetime.now(datetime.timezone.utc).isoformat()),
                           ("config", config), ("command_line", " ".join(sys.argv)),
                           ("model", type(model).__name__), ("precision", precision), ("trainer_sync", "none")]:
            f.set_attribute(key, value)
        for key, value in [("format_version", 1), ("num_ranks", 1), ("trainer_ranks", 1), ("inference_ranks", 0),
                           ("num_parameters", self.numel)]:
            f.set_attribute(key, value)
        f.set_attribute("roles", ["trainer"])
        f.set_attribute("tensor_names", names)
        f.set_attribute("tensor_shapes", ["x".join(str(d) for d in p.shape) for _, p in self.params])
        f.set_attribute("tensor_numel", [float(p.numel()) for _, p in self.params])

    def _adam(self):
        """(m, v, step, group) of each parameter, or None without an Adam-family optimizer state."""
        if self.optimizer is None:
            return None
        groups = {id(p): g for g in self.optimizer.param_groups for p in g["params"]}
        out = []
        for _, p in self.params:
            s = self.optimizer.state.get(p, {})
            if "exp_avg" not in s or "exp_avg_sq" not in s:
                return None
            out.append((s["exp_avg"].float(), s["exp_avg_sq"].float(), float(s["step"]), groups[id(p)]))
        return out

    def adam_ratio(self, adam):
        ratios = []
        for m, v, t, g in adam:
            b1, b2 = g["betas"]
            m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
            ratios.append((m_hat.abs() / (v_hat.sqrt() + g["eps"])).flatten())
        return quantiles(torch.cat(ratios), ADAM_QUANTILES)

    def _updates(self, adam):
        """(w, u) float32 of every parameter: the weights before the step and the step's update."""
        ws, us = [], []
        for i, (name, p) in enumerate(self.params):
            if self.mixed:
                w = self.master[name]
                u = p.detach().float() - w
            else:  # pure BF16: AdamW's update in FP32 from the optimizer state, against bf16(w) before
                m, v, t, g = adam[i]
                b1, b2 = g["betas"]
                w = self.history[-1][name].float()
                denom = v.sqrt() / (1 - b2 ** t) ** 0.5 + g["eps"]
                u = -(g["lr"] / (1 - b1 ** t)) * m / denom - g["lr"] * g["weight_decay"] * w
            ws.append(w.flatten())
            us.append(u.flatten())
        return torch.cat(ws), torch.cat(us)

    def step(self, *, loss=None, reward=None, tokens=None, eval_pass1=None):
        """Records the step the optimizer just took."""
        t0 = time.perf_counter()
        self.t += 1
        row = _pulse.StatsRow()
        changed = []
        for name, p in self.params:
            now = bf16_copy(p)
            changed.append(int((bits(now) != bits(self.bf16[name])).sum()))
            self.bf16[name] = now
        total = sum(changed)
        e0 = time.perf_counter()
        patch = self.sender.patch()
        encode_s = time.perf_counter() - e0
        streams = inspect(patch)["streams"]
        kstep = []
        for k in self.k_values:
            if k > len(self.history):
                kstep.append(float("nan"))
                continue
            back = self.history[-k]
            same = sum(int((bits(self.bf16[n]) == bits(back[n])).sum()) for n, _ in self.params)
            kstep.append(same / self.numel)
        adam = self._adam()
        if adam is not None:
            row.set_values("/steps/adam_ratio", self.adam_ratio(adam))
        if self.absorption_every and self.t % self.absorption_every == 0 and (self.mixed or adam is not None):
            self._write_absorption(*absorption(*self._updates(adam)))
        grads = [p.grad.detach().float().flatten() for _, p in self.params if p.grad is not None]
        if grads:
            g = torch.cat(grads).abs()
            row.set("/steps/grad_norm", float(torch.linalg.vector_norm(g.double())))
            row.set_values("/steps/grad_sparsity", [float((g <= th).double().mean()) for th in GRAD_THRESHOLDS])
        self.history.append(dict(self.bf16))
        self.master = self._master_copy()
        row.set_int("/steps/step", self.t)
        row.set_int("/steps/policy_version", self.t)
        row.set_int("/steps/changed", total)
        row.set_ints("/steps/tensor_changed", changed)
        row.set("/steps/sparsity", 1.0 - total / self.numel)
        row.set_values("/kstep/sparsity", kstep)
        row.set_int("/steps/patch_bytes", len(patch))
        row.set_int("/steps/patch_raw_bytes", streams["index"]["raw"] + streams["value"]["raw"])
        row.set_int("/steps/dense_bytes", 2 * self.numel)
        row.set("/steps/encode_s", encode_s)
        row.set("/steps/sync_s", encode_s)
        if self.optimizer is not None:
            row.set("/steps/lr", float(self.optimizer.param_groups[0]["lr"]))
        for key, value in (("/steps/loss", loss), ("/steps/reward", reward), ("/steps/eval_pass1", eval_pass1)):
            if value is not None:
                row.set(key, float(value))
        if tokens is not None:
            row.set_int("/steps/tokens", int(tokens))
        now = time.perf_counter()
        row.set("/steps/time_s", now - self.start)
        row.set("/steps/step_s", now - self.last)
        row.set("/steps/measure_s", now - t0 - encode_s)
        row.set("/steps/write_s", self.write_s)
        self.last = now
        w0 = time.perf_counter()
        self.file.append(row)
        self.write_s = time.perf_counter() - w0
        self.last_patch = patch
        return row

    def _write_absorption(self, ratio_counts, weight_counts, absorbed):
        schema = _schema()
        for name, counts, k_range in (("ratio_counts", ratio_counts, RATIO_RANGE), ("weight_counts", weight_counts, WEIGHT_RANGE),
                                      ("absorbed", [absorbed], None)):
            c = schema["/absorption/step_NNNNNN/" + name]
            path = c["path"].replace("step_NNNNNN", f"step_{self.t:06d}")
            self.file.write_array_i64(path, counts, [len(counts)], c["units"], c["description"])
            if k_range:
                self.file.set_dataset_attribute(path, c["columns_attribute"], [float(k) for k in k_range])

    def close(self):
        self.file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
