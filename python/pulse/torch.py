"""The paper's measurements inside any PyTorch training loop.

    recorder = pulse.torch.SparsityRecorder(model, out="run.h5", optimizer=opt, label="lr 3e-6", config={"seed": 1})
    for batch in data:
        loss = ...; loss.backward(); opt.step(); opt.zero_grad()
        recorder.step(loss=loss.item())
    recorder.close()                      # then: python3 -m pulse_analysis report run.h5

Each step records, against the weights the forward pass reads (FP32 parameters as their cast,
compare_as="bf16" by default or "f16", round-to-nearest-even as torch's .to(); "raw": their FP32
bits; BF16 and F16 parameters as stored): changed elements, per-step sparsity, per tensor changes,
k-step sparsity (from change logs of the last max(k) steps, not copies), and the bytes of the
PULSESync patch (encoded by pulse's C++ library). The file's config holds what the recorder reads
itself (model class, precision, optimizer, lr, betas, eps, weight decay) and the caller's label
and config. Given an Adam-family optimizer (torch.optim.AdamW), the quantiles of |m_hat| /
(sqrt(v_hat) + eps) from its exp_avg / exp_avg_sq, and every absorption_every steps histograms
of |u| / half_ulp(bf16(w)) and |w|: u is the FP32 master's change for FP32 parameters (mixed
precision), or the AdamW update rebuilt from the optimizer state for BF16 parameters. The file
is pulse-train's HDF5 schema (src/train/stats_schema, `pulse-train --print-schema`), written by pulse's own writer
(src/io/stats_file) through the binding, on a singleton MPI communicator.
"""
import collections
import concurrent.futures
import datetime
import itertools
import json
import math
import sys
import time
import weakref

import numpy as np
import torch

from . import _coding, _pulse, inspect
from . import _threads as pulse_threads
from ._state import entries

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
    "/steps/measure_s": "time the recorder's measurements took in the step, beyond the patch encode",
    "/steps/sync_s": "PULSESync time (encode)",
    "/steps/write_s": "time the previous row took to write and flush",
    "/steps/eval_pass1": "evaluation score, when given to step() (NaN otherwise)",
    "/steps/tokens": "tokens trained on in the step, when given to step()",
    "/steps/patch_bytes": "coded PULSESync patch from the previous version",
}


def _schema():
    """pulse-train's datasets, path -> entry (path, type, kind, columns_attribute, units, description)."""
    return {c["path"]: c for c in _pulse.train_stats_schema()}


# What an FP32 parameter is compared as (compare_as): the cast the forward pass reads, round to
# nearest even as torch's .to() casts, or its own bits; other dtypes are compared as stored.
COMPARE_AS = {"bf16": torch.bfloat16, "f16": torch.float16, "raw": torch.float32}
_BITS = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
_TORCH_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def compared_dtype(dtype, compare_as):
    return COMPARE_AS[compare_as] if dtype == torch.float32 else dtype


def toml_text(config):
    """A flat dict as TOML (numbers, booleans, strings, lists of them), one `key = value` a line."""
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int):
            return str(v)
        if isinstance(v, float):
            return repr(v) if math.isfinite(v) else ("nan" if math.isnan(v) else "inf" if v > 0 else "-inf")
        if isinstance(v, str):
            return json.dumps(v)  # JSON's string escapes are TOML's
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(value(x) for x in v) + "]"
        raise _pulse.Error(f"config value {v!r}: not a number, boolean, string or list of them")
    lines = []
    for key, v in config.items():
        if not key or not all(c.isalnum() or c in "-_" for c in key) or not key.isascii():
            raise _pulse.Error(f"config key {key!r}: letters, digits, '-' and '_' only")
        lines.append(f"{key} = {value(v)}\n")
    return "".join(lines)


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


def quantiles(x, qs, threads=0):
    """numpy's default quantiles (linear interpolation between order statistics) of the float32
    values x (a 1-D CPU tensor), by pulse's radix select (python/src/radix_quantiles.hpp) instead
    of a sort; threads: 0 for every core (the result does not depend on it)."""
    return _pulse.quantiles(x.numpy(), list(qs), threads)


def _host_moments(m, v):
    """Whether pulse's C++ computes the Adam ratios of moments m, v: FP32 or BF16 host tensors in
    one dense block each."""
    return m.device.type == "cpu" and m.dtype == v.dtype and m.dtype in (torch.float32, torch.bfloat16) and \
        m.is_contiguous() and v.is_contiguous()


def _count_magnitude_at_most(x, thresholds, threads=0):
    """Elements of the FP32 x of magnitude at most each threshold; on the host by pulse's C++ (one pass)."""
    if x.device.type == "cpu":
        return _pulse.count_magnitude_at_most(x.numpy(), list(thresholds), threads)
    return [int(torch.count_nonzero(x.abs() <= th)) for th in thresholds]


class _Versions:
    """The last recorded version of the parameters of one element width, as compared (flat, as bits),
    the version now staged beside it, and the change log of each of the last `keep` steps: the
    positions that changed and their old bits, block by block, or a block's whole old bits where that
    is smaller (most changed). Reverting the newest logs in turn gives the versions 1, 2, ... steps
    back, so the k-step history costs the changes, not k copies of the model (pulse's C++,
    python/src/change_logs.hpp over src/core/block_change_log.hpp, pulse-measure's log too). Logging, counting
    and encoding only read the versions; the staged version then becomes the recorded one by the
    two buffers trading roles, without a copy."""

    def __init__(self, params, width, keep, threads):
        self.params = params  # [(index, name, numel, compared dtype, shape)], each of `width` bytes
        numel = sum(n for _, _, n, _, _ in params)
        self.flat = np.empty(numel, dtype=_BITS[width])     # the recorded version
        self.staging = np.empty_like(self.flat)             # the version now
        self.ends = [int(e) for e in np.cumsum([n for _, _, n, _, _ in params])]
        self.views, offset = {}, 0
        for _, name, n, dtype, shape in params:  # torch views of the bits: (recorded, staging)
            self.views[name] = (torch.from_numpy(self.flat[offset:offset + n]).view(dtype).view(shape),
                                torch.from_numpy(self.staging[offset:offset + n]).view(dtype).view(shape))
            offset += n
        self.logs = _pulse.ChangeLogs(width, keep)
        self.threads = threads

    def stage(self, tensors):
        """Copies the parameters as compared into staging: a host parameter stored as compared by
        its bits (numpy's copy, on this thread: torch's threads wait on each other while the
        recorder's background thread holds a core), another by torch's cast (each on its device
        first: only the cast crosses to the host)."""
        for (_, name, _, dtype, _), p, begin, end in zip(self.params, tensors, [0] + self.ends, self.ends):
            src = p.detach().reshape(-1)
            if src.device.type == "cpu" and src.dtype == dtype:
                np.copyto(self.staging[begin:end], src.view(_TORCH_BITS[self.staging.itemsize]).numpy())
                continue
            if src.device.type != "cpu":
                src = src.to(dtype)
            self.views[name][1].view(-1).copy_(src)

    def log(self):
        """Logs the change from the recorded version to the staged one; returns the changed
        elements per parameter."""
        return self.logs.log(self.staging, self.flat, self.ends, self.threads)

    def differing(self, ks):
        """{k: elements of the staged version that differ from the version k steps back} for the k
        the logs reach (the staged version logged)."""
        return self.logs.differing(self.staging, sorted(ks), self.threads)

    def adopt(self):
        """Makes the staged version the recorded one; the old recorded buffer stages the next."""
        self.flat, self.staging = self.staging, self.flat
        self.views = {name: (staged, recorded) for name, (recorded, staged) in self.views.items()}

    def bytes(self):
        return self.flat.nbytes + self.staging.nbytes + self.logs.bytes()


def _shut_down(pools, wait=False):
    """Ends the recorder's threads (not waiting: a recorder collected may be on one of them)."""
    for pool in pools:
        if pool:
            pool.shutdown(wait=wait)


class SparsityRecorder:
    """Records the update sparsity of the weights as the forward pass reads them, patch sizes and
    (given an Adam-family optimizer) Adam ratios and absorption into `out`, one row per step()
    after optimizer.step().

    compare_as: what FP32 parameters are compared as, "bf16" (default) or "f16" (the cast, round to
    nearest even) or "raw" (their FP32 bits); BF16 and F16 parameters are compared as stored.
    label, config: the run's description for the report (config: a dict of settings such as
    {"seed": 2, "task": "gsm8k"}), written with what the recorder reads itself (the model's class,
    precision, the optimizer's class, lr, betas, eps and weight decay) into the file's config;
    a key given in config replaces the one read.
    threads: the cores the recorder's comparisons, k-step counts and quantiles run on (0: every
    core); the figures do not depend on it.
    background: measure each step on the recorder's thread while the next step trains (step()
    takes only what the next optimizer step overwrites); the step's row is written by the next
    step(), flush() or close(), and an error there is raised by that call. False: step() returns
    once its row is written. The figures are the same."""

    def __init__(self, model, out="run.h5", optimizer=None, k_values=(1, 2, 4, 8, 16, 32), absorption_every=0,
                 overwrite=False, compare_as="bf16", label=None, config=None, threads=0, background=True):
        self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not self.params:
            raise _pulse.Error("SparsityRecorder: the model has no trainable parameters")
        if compare_as not in COMPARE_AS:
            raise _pulse.Error(f"SparsityRecorder: compare_as {compare_as!r} is not bf16, f16 or raw")
        self.optimizer = optimizer
        self.compare_as = compare_as
        self.k_values = tuple(int(k) for k in k_values)
        self.absorption_every = int(absorption_every)
        self.threads = pulse_threads(threads)
        self.mixed = any(p.dtype != torch.bfloat16 for _, p in self.params)
        self.numel = sum(p.numel() for _, p in self.params)
        self.t = 0
        self._pending = None  # the step measured in the background: a future of (row, patch)
        self._failed = None   # why a step's measurement failed, if one did
        self._last_patch = None
        # CPU time per part of the recorder's work, of the threads that call its C++ loops (all of
        # it on threads=1)
        self.cpu_seconds = collections.Counter()
        by_width = {}
        for i, (name, p) in enumerate(self.params):
            dtype = compared_dtype(p.dtype, compare_as)
            width = torch.empty(0, dtype=dtype).element_size()
            by_width.setdefault(width, []).append((i, name, p.numel(), dtype, tuple(p.shape)))
        self.versions = [_Versions(group, width, max(self.k_values), self.threads) for width, group in by_width.items()]
        for v in self.versions:
            v.stage([self.params[i][1] for i, _, _, _, _ in v.params])
            v.adopt()
        self.dense_bytes = sum(v.flat.nbytes for v in self.versions)
        staged = {name: v.views[name][1] for v in self.versions for name in v.views}
        # Each step's patch is encoded from the recorded version to the staged one before the
        # staged version becomes the recorded one: the bytes pulse.Sender(self.compared) gives,
        # without the Sender's copy of the model, and without hashing the recorded version again
        # (the recorder alone writes it; the Sender keeps its digests from the last encode). The
        # entries of the two versions trade roles with their buffers (adopt).
        self._recorded = entries(self.compared)
        self._staged = entries({name: staged[name] for name, _ in self.params})
        self.sender = _pulse.Sender(self._recorded, 0, "reference", self.threads)
        self._coding = _coding("keydiff", None, "zstd", 3, self.threads)
        # Measures each step while the next one trains (background). A recorder dropped without
        # close() stops its thread once collected, without waiting for it, since the last
        # reference may go on that thread (its last step's row is then not written).
        self._thread = concurrent.futures.ThreadPoolExecutor(1) if background else None
        # On threads != 1 a second thread measures the optimizer's figures and then the k-step
        # counts beside the change log and the encode (_measure).
        self._beside = concurrent.futures.ThreadPoolExecutor(1) if self.threads != 1 else None
        self._stop_threads = weakref.finalize(self, _shut_down, [self._thread, self._beside])
        self.master = self._master_copy()
        self.start = self.last = time.perf_counter()
        self.write_s = float("nan")
        settings = {"model": type(model).__name__, "precision": self.precision, "compare-as": self.compare_as,
                    "optimizer": type(self.optimizer).__name__ if self.optimizer else "",
                    "absorption-every": self.absorption_every, **self._optimizer_settings(), **dict(config or {})}
        if label is not None:
            settings["label"] = str(label)
        config_text = toml_text(settings)  # a bad setting fails before the file exists
        self.file = _pulse.StatsFile(str(out), "overwrite" if overwrite else "create")
        self._declare(settings, config_text)

    def _master_copy(self):
        """The FP32 master before the step, kept only when the next step records absorption."""
        if not (self.absorption_every and self.mixed and (self.t + 1) % self.absorption_every == 0):
            return None
        return {n: p.detach().to(torch.float32).clone() for n, p in self.params}

    @property
    def compared(self):
        """The recorded version of each parameter as compared, in parameter order (views of the
        recorder's buffers)."""
        self.flush()
        views = {name: v.views[name][0] for v in self.versions for name in v.views}
        return {name: views[name] for name, _ in self.params}

    @property
    def precision(self):
        if not self.mixed:
            return "bf16"
        return {"bf16": "mixed", "f16": "mixed-f16", "raw": "fp32"}[self.compare_as]

    def _optimizer_settings(self):
        """lr, betas, eps and weight decay of the optimizer's parameter groups (a list where the
        groups differ; a scheduler's initial_lr for lr when it set one)."""
        if self.optimizer is None:
            return {}
        groups = self.optimizer.param_groups
        read = {"lr": lambda g: g.get("initial_lr", g.get("lr")), "beta1": lambda g: (g.get("betas") or (None,))[0],
                "beta2": lambda g: (g.get("betas") or (None, None))[1], "eps": lambda g: g.get("eps"),
                "weight-decay": lambda g: g.get("weight_decay")}
        out = {}
        for key, get in read.items():
            values = [get(g) for g in groups]
            values = [float(v) if isinstance(v, (int, float)) or torch.is_tensor(v) else v for v in values]
            if any(v is None for v in values):
                continue
            out[key] = values[0] if len(set(values)) == 1 else values
        return out

    def _declare(self, settings, config_text):
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
        label = settings.get("label")
        for key, value in [("format", "pulse-train statistics"), ("program_version", "pulse.torch"),
                           ("start_utc", datetime.datetime.now(datetime.timezone.utc).isoformat()),
                           ("config", config_text), ("command_line", " ".join(sys.argv)),
                           ("model", str(settings["model"])), ("precision", str(settings["precision"])),
                           ("compared_as", self.compare_as), ("trainer_sync", "none")] + \
                ([("label", str(label))] if label is not None else []):
            f.set_attribute(key, value)
        for key, value in [("format_version", 1), ("num_ranks", 1), ("trainer_ranks", 1), ("inference_ranks", 0),
                           ("num_parameters", self.numel)]:
            f.set_attribute(key, value)
        f.set_attribute("roles", ["trainer"])
        f.set_attribute("tensor_names", names)
        f.set_attribute("tensor_shapes", ["x".join(str(d) for d in p.shape) for _, p in self.params])
        f.set_attribute("tensor_numel", [float(p.numel()) for _, p in self.params])
        f.set_attribute("tensor_compared_dtypes", [str(compared_dtype(p.dtype, self.compare_as)).replace("torch.", "")
                                                   for _, p in self.params])

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
            out.append((s["exp_avg"], s["exp_avg_sq"], float(s["step"]), groups[id(p)]))
        return out

    def _adam_ratios(self, adam):
        """|m_hat| / (sqrt(v_hat) + eps) of every parameter in one host buffer kept between steps
        (FP32, by pulse's C++ for FP32 and BF16 moments on the host, by torch where the state lives
        otherwise; the same bits)."""
        if getattr(self, "_ratios", None) is None:
            self._ratios = torch.empty(self.numel, dtype=torch.float32)
        offset, on_host = 0, []
        for m, v, t, g in adam:
            b1, b2 = g["betas"]
            r = self._ratios[offset:offset + m.numel()]
            offset += m.numel()
            if _host_moments(m, v):
                bf16 = m.dtype == torch.bfloat16
                bits = (lambda x: x.reshape(-1).view(torch.int16).numpy()) if bf16 else (lambda x: x.reshape(-1).numpy())
                on_host.append((bits(m), bits(v), r.numpy(), bf16, 1 - b1 ** t, 1 - b2 ** t, g["eps"]))
            else:
                r.copy_((m.float() / (1 - b1 ** t)).abs_().div_((v.float() / (1 - b2 ** t)).sqrt_().add_(g["eps"])).reshape(-1))
        _pulse.adam_ratios(on_host, self.threads)
        return self._ratios

    def _updates(self, adam):
        """(w, u) float32 of every parameter: the weights before the step and the step's update."""
        ws, us = [], []
        compared = self.compared
        for i, (name, p) in enumerate(self.params):
            if self.mixed:
                w = self.master[name]
                u = p.detach().float() - w
            else:  # pure BF16: AdamW's update in FP32 from the optimizer state, against bf16(w) before
                m, v, t, g = adam[i]
                m, v = m.float(), v.float()
                b1, b2 = g["betas"]
                w = compared[name].float()  # the version before this step: not yet adopted
                denom = v.sqrt() / (1 - b2 ** t) ** 0.5 + g["eps"]
                u = -(g["lr"] / (1 - b1 ** t)) * m / denom - g["lr"] * g["weight_decay"] * w
            ws.append(w.flatten())
            us.append(u.flatten())
        return torch.cat(ws), torch.cat(us)

    def _gradient(self, grads):
        """The gradients as one FP32 tensor: on the host, in a buffer kept between steps (FP32 and
        BF16 ones copied on this thread, as stage() copies)."""
        if any(g.device.type != "cpu" for g in grads):
            return torch.cat(grads).float()
        n = sum(g.numel() for g in grads)
        if getattr(self, "_grads", None) is None or self._grads.numel() != n:
            self._grads = torch.empty(n, dtype=torch.float32)
        offset = 0
        for g in grads:
            out = self._grads[offset:offset + g.numel()]
            offset += g.numel()
            if g.dtype == torch.float32:
                np.copyto(out.numpy(), g.numpy())
            elif g.dtype == torch.bfloat16:
                _pulse.bf16_to_fp32(g.view(torch.int16).numpy(), out.numpy())
            else:
                out.copy_(g)
        return self._grads

    def history_bytes(self):
        """Bytes of the recorded version, the staging copy and the change logs."""
        self.flush()
        return sum(v.bytes() for v in self.versions)

    @property
    def last_patch(self):
        """The patch of the last step recorded (from the version before it)."""
        self.flush()
        return self._last_patch

    def step(self, *, loss=None, reward=None, tokens=None, eval_pass1=None):
        """Records the step the optimizer just took. What the next optimizer step overwrites is
        taken now (the parameters as compared, the Adam ratios, the gradient); the rest is measured
        on the recorder's thread while training goes on (background=True: its row is written by the
        next step(), flush() or close()) or before step() returns."""
        t0 = time.perf_counter()
        self.flush()
        c0 = time.thread_time()
        if self._failed:
            raise _pulse.Error(f"SparsityRecorder: {self._failed}; this recorder records no more steps")
        self.t += 1
        row = _pulse.StatsRow()
        adam = self._adam()
        if self.absorption_every and self.t % self.absorption_every == 0 and (self.mixed or adam is not None):
            self._write_absorption(*absorption(*self._updates(adam)))
        for v in self.versions:
            v.stage([self.params[i][1] for i, _, _, _, _ in v.params])
        ratios = self._adam_ratios(adam) if adam is not None else None
        grads = [p.grad.detach().reshape(-1) for _, p in self.params if p.grad is not None]
        g = None
        if grads:  # one FP32 copy (the same buffer each step on the host); the norm now, by torch
            g = self._gradient(grads)
            row.set("/steps/grad_norm", float(torch.linalg.vector_norm(g)))
        self.master = self._master_copy()
        row.set_int("/steps/step", self.t)
        row.set_int("/steps/policy_version", self.t)
        row.set_int("/steps/dense_bytes", self.dense_bytes)
        if self.optimizer is not None:
            row.set("/steps/lr", float(self.optimizer.param_groups[0]["lr"]))
        for key, value in (("/steps/loss", loss), ("/steps/reward", reward), ("/steps/eval_pass1", eval_pass1)):
            if value is not None:
                row.set(key, float(value))
        if tokens is not None:
            row.set_int("/steps/tokens", int(tokens))
        row.set("/steps/time_s", t0 - self.start)
        row.set("/steps/step_s", t0 - self.last)
        row.set("/steps/write_s", self.write_s)
        self.last = t0
        taken_s = time.perf_counter() - t0
        self._cpu("taken at step()", c0)
        if self._thread:
            self._pending = self._thread.submit(self._measure, row, ratios, g, taken_s)
        else:  # measured now, its error raised as the background's would be
            self._pending = concurrent.futures.Future()
            try:
                self._pending.set_result(self._measure(row, ratios, g, taken_s))
            except Exception as e:
                self._pending.set_exception(e)
            self.flush()

    def flush(self):
        """Waits for the step measured in the background, if any, and writes its row."""
        if self._pending is None:
            return
        pending, self._pending = self._pending, None
        try:
            row, self._last_patch = pending.result()
        except Exception as e:
            self._failed = f"measuring step {self.t} failed: {e}"
            raise _pulse.Error(f"SparsityRecorder: {self._failed}") from e
        w0, c0 = time.perf_counter(), time.thread_time()
        self.file.append(row)
        self.write_s = time.perf_counter() - w0
        self._cpu("row write", c0)

    def _measure(self, row, ratios, grads, taken_s):
        """The step's figures from what step() took (the staged versions, the Adam ratios, the
        gradient), into row; the staged versions then become the recorded ones. Returns the row
        and the patch."""
        m0 = time.perf_counter()
        # Beside, in turn: the optimizer's figures (they read no version), then, once the staged
        # version is logged, the k-step counts (reading the logs and the staged version, as the
        # encode reads it meanwhile).
        beside = [self._aside(self._optimizer_figures, row, ratios, grads)]
        try:
            c0 = time.thread_time()  # on threads=1 the tasks "beside" ran just now, counted apart
            changed = [0] * len(self.params)
            for v in self.versions:
                for (i, _, _, _, _), c in zip(v.params, v.log()):
                    changed[i] = c
            self._cpu("change log", c0)
            beside.append(self._aside(self._differing))
            c0, e0 = time.thread_time(), time.perf_counter()
            patch = self.sender.patch(self._staged, self._recorded, self._coding, None, rehash=False)
            encode_s = time.perf_counter() - e0
            self._cpu("patch encode", c0)
        finally:
            done = [f.result() for f in beside]  # the thread is done with the versions and the row
        differ = done[1]
        for v in self.versions:
            v.adopt()
        self._recorded, self._staged = self._staged, self._recorded
        streams = inspect(patch)["streams"]
        total = sum(changed)
        reach = self.versions[0].logs.depth
        row.set_int("/steps/changed", total)
        row.set_ints("/steps/tensor_changed", changed)
        row.set("/steps/sparsity", 1.0 - total / self.numel)
        row.set_values("/kstep/sparsity", [1.0 - differ[k] / self.numel if k <= reach else float("nan")
                                           for k in self.k_values])
        row.set_int("/steps/patch_bytes", len(patch))
        row.set_int("/steps/patch_raw_bytes", streams["index"]["raw"] + streams["value"]["raw"])
        row.set("/steps/encode_s", encode_s)
        row.set("/steps/sync_s", encode_s)
        row.set("/steps/measure_s", taken_s + time.perf_counter() - m0 - encode_s)
        return row, patch

    def _aside(self, task, *args):
        """task(*args) on the second thread, or now on threads=1; a future of its result."""
        if self._beside:
            return self._beside.submit(task, *args)
        done = concurrent.futures.Future()
        done.set_result(task(*args))
        return done

    def _optimizer_figures(self, row, ratios, grads):
        """The Adam-ratio quantiles and the gradient's magnitude counts into row."""
        c0 = time.thread_time()
        if ratios is not None:
            row.set_values("/steps/adam_ratio", quantiles(ratios, ADAM_QUANTILES, self.threads))
        if grads is not None:
            row.set_values("/steps/grad_sparsity",
                           [c / grads.numel() for c in _count_magnitude_at_most(grads, GRAD_THRESHOLDS, self.threads)])
        self._cpu("Adam-ratio quantiles and gradient counts", c0)

    def _differing(self):
        """{k: elements of the staged version that differ from the version k steps back}."""
        c0 = time.thread_time()
        differ = collections.Counter()
        for v in self.versions:
            differ.update(v.differing(set(self.k_values)))
        self._cpu("k-step counts", c0)
        return differ

    def _cpu(self, part, since):
        """Adds this thread's CPU time since `since` to cpu_seconds[part]."""
        self.cpu_seconds[part] += time.thread_time() - since

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
        """Writes the last step's row and closes the file."""
        try:
            self.flush()
        finally:
            self._stop_threads.detach()
            _shut_down([self._thread, self._beside], wait=True)
            self.file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
