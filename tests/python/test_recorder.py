"""pulse.torch.SparsityRecorder against a direct recomputation with torch and numpy: changed,
sparsity, per-tensor changes, k-step sparsity, patch bytes, Adam-ratio quantiles, absorption
histograms; then pulse_analysis report reads the file."""
import gc
import os
import subprocess
import sys
import threading

import h5py
import numpy as np
import pytest
import torch

import pulse
import pulse.torch

QS = [0.5, 0.9, 0.99, 0.999]


def numpy_log2_hist(k, finite, zero, k_min, k_max):
    bins = k_max - k_min
    counts = np.zeros(bins + 4, np.int64)
    for kk, f, z in zip(k, finite, zero):
        slot = bins + 3 if not f else bins if z else bins + 1 if kk < k_min else bins + 2 if kk >= k_max else kk - k_min
        counts[slot] += 1
    return counts


def numpy_absorption(w, u):
    """kernels/absorption.hpp's definition, written again with numpy."""
    w, u = w.astype(np.float32), u.astype(np.float32)
    e = ((torch.from_numpy(w).to(torch.bfloat16).view(torch.int16).numpy().astype(np.int64) & 0xFFFF) >> 7) & 0xFF
    log2_half = np.maximum(e, 1) - 127 - 8
    with np.errstate(all="ignore"):
        kw = np.frexp(w)[1] - 1
        ku = np.frexp(u)[1] - 1
    weight = numpy_log2_hist(kw, np.isfinite(w), w == 0, -40, 8)
    r_finite = np.isfinite(w) & np.isfinite(u) & (e != 0xFF)
    k = ku - log2_half
    ratio = numpy_log2_hist(k, r_finite, u == 0, -24, 16)
    absorbed = int(np.sum(r_finite & ((u == 0) | (k < 0))))
    return ratio, weight, absorbed


@pytest.mark.parametrize("precision", ["mixed", "bf16"])
def test_recorder_matches_direct_recomputation(tmp_path, precision):
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    x, y = torch.randn(64, 8), torch.randn(64, 3)
    out = tmp_path / "run.h5"
    rec = pulse.torch.SparsityRecorder(model, out=out, optimizer=opt, k_values=(1, 2, 4), absorption_every=3)
    names = [n for n, _ in model.named_parameters()]
    bf16 = lambda: {n: p.detach().to(torch.bfloat16, copy=True) for n, p in model.named_parameters()}
    history = [bf16()]
    expected = {"changed": [], "tensor_changed": [], "kstep": [], "patch_bytes": [], "adam": [], "absorption": {},
                "grad_norm": [], "grad_sparsity": []}
    steps = 12
    for t in range(1, steps + 1):
        before = {n: p.detach().float().clone() for n, p in model.named_parameters()}
        loss = torch.nn.functional.mse_loss(model(x.to(next(model.parameters()).dtype)).float(), y)
        loss.backward()
        opt.step()
        rec.step(loss=loss.item())
        g = np.concatenate([p.grad.float().numpy().ravel() for p in model.parameters()])  # widened by torch
        expected["grad_norm"].append(np.linalg.norm(g.astype(np.float64)))
        expected["grad_sparsity"].append([int((np.abs(g) <= np.float32(th)).sum()) / g.size
                                          for th in pulse.torch.GRAD_THRESHOLDS])
        opt.zero_grad()
        now = bf16()
        per = [int((now[n].view(torch.int16) != history[-1][n].view(torch.int16)).sum()) for n in names]
        expected["tensor_changed"].append(per)
        expected["changed"].append(sum(per))
        numel = sum(v.numel() for v in now.values())
        expected["kstep"].append([np.nan if k > len(history) else
                                  sum(int((now[n].view(torch.int16) == history[-k][n].view(torch.int16)).sum())
                                      for n in names) / numel for k in (1, 2, 4)])
        expected["patch_bytes"].append(len(pulse.encode(history[-1], now, base_version=t - 1, target_version=t)))
        m = [opt.state[p]["exp_avg"].float().flatten() for p in model.parameters()]
        v = [opt.state[p]["exp_avg_sq"].float().flatten() for p in model.parameters()]
        ratio = (torch.cat(m) / (1 - 0.9 ** t)).abs() / ((torch.cat(v) / (1 - 0.999 ** t)).sqrt() + 1e-8)
        expected["adam"].append(np.quantile(ratio.double().numpy(), QS))
        if precision == "mixed" and t % 3 == 0:
            w = torch.cat([before[n].flatten() for n in names])
            u = torch.cat([p.detach().flatten() for p in model.parameters()]) - w
            expected["absorption"][t] = numpy_absorption(w.numpy(), u.numpy())
        history.append(now)
    rec.close()

    with h5py.File(out, "r") as f:
        s = f["steps"]
        assert list(s["step"][()]) == list(range(1, steps + 1))
        assert list(s["changed"][()]) == expected["changed"]
        assert s["tensor_changed"][()].tolist() == expected["tensor_changed"]
        numel = sum(p.numel() for p in model.parameters())
        np.testing.assert_allclose(s["sparsity"][()], 1 - np.array(expected["changed"]) / numel, rtol=0, atol=1e-12)
        np.testing.assert_allclose(f["kstep/sparsity"][()], np.array(expected["kstep"]), rtol=0, atol=1e-12)
        assert list(s["patch_bytes"][()]) == expected["patch_bytes"]
        np.testing.assert_allclose(s["adam_ratio"][()], np.array(expected["adam"]), rtol=1e-5)
        np.testing.assert_allclose(s["grad_norm"][()], expected["grad_norm"], rtol=1e-6)
        assert s["grad_sparsity"][()].tolist() == expected["grad_sparsity"]
        assert [s.decode() if isinstance(s, bytes) else s for s in s["tensor_changed"].attrs["tensor_names"]] == names
        if precision == "mixed":
            groups = sorted(f["absorption"])
            assert groups == [f"step_{t:06d}" for t in (3, 6, 9, 12)]
            for t, (ratio, weight, absorbed) in expected["absorption"].items():
                g = f[f"absorption/step_{t:06d}"]
                assert g["ratio_counts"][()].tolist() == ratio.tolist()
                assert g["weight_counts"][()].tolist() == weight.tolist()
                assert int(g["absorbed"][0]) == absorbed
                assert int(g["ratio_counts"][()].sum()) == numel
        else:  # pure BF16: the AdamW update rebuilt from the optimizer state; every element counted once
            assert int(f["absorption/step_000003/ratio_counts"][()].sum()) == numel

    report = subprocess.run([sys.executable, "-m", "pulse_analysis", "report", str(out), "-o", str(tmp_path / "rep")],
                            capture_output=True, text=True)
    assert report.returncode == 0, report.stderr
    assert os.path.exists(tmp_path / "rep" / "summary.md")


@pytest.mark.parametrize("compare_as", ["bf16", "f16", "raw"])
def test_fp32_parameters_compared_as_chosen(tmp_path, compare_as):
    """compare_as for FP32 parameters (a BF16 buffer-free model with one BF16 parameter beside them):
    changed, per tensor and k-step counts and patch bytes equal torch's casts recomputed here;
    weights set by hand so some return to an earlier value (k-step counts equality, not recency)."""
    torch.manual_seed(4)
    model = torch.nn.Linear(16, 8)
    model.extra = torch.nn.Parameter(torch.randn(5).to(torch.bfloat16))
    out = tmp_path / "run.h5"
    rec = pulse.torch.SparsityRecorder(model, out=out, k_values=(1, 2, 4, 8), compare_as=compare_as)
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "raw": torch.float32}[compare_as]
    width = {"bf16": torch.int16, "f16": torch.int16, "raw": torch.int32}[compare_as]
    names = [n for n, _ in model.named_parameters()]
    view = lambda: {n: (p.detach().to(dtype, copy=True) if p.dtype == torch.float32 else p.detach().clone())
                    for n, p in model.named_parameters()}
    as_bits = lambda t: t.view(width if t.dtype != torch.bfloat16 else torch.int16)
    history = [view()]
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    expected = {"changed": [], "tensor_changed": [], "kstep": [], "patch": []}
    for t in range(1, 13):
        with torch.no_grad():
            for n, p in model.named_parameters():
                if t % 3 == 0:
                    p.copy_(start[n])  # back to the first version: k = 3, 6, ... back are equal
                else:
                    p.add_(torch.randn(p.shape).to(p.dtype) * 1e-3)
        rec.step()
        now = view()
        per = [int((as_bits(now[n]) != as_bits(history[-1][n])).sum()) for n in names]
        expected["changed"].append(per)
        expected["kstep"].append([np.nan if k > len(history) else
                                  sum(int((as_bits(now[n]) == as_bits(history[-k][n])).sum()) for n in names) /
                                  sum(v.numel() for v in now.values()) for k in (1, 2, 4, 8)])
        expected["patch"].append(len(pulse.encode(history[-1], now, base_version=t - 1, target_version=t)))
        history.append(now)
    rec.close()
    with h5py.File(out, "r") as f:
        assert f["steps/tensor_changed"][()].tolist() == expected["changed"]
        assert list(f["steps/changed"][()]) == [sum(c) for c in expected["changed"]]
        np.testing.assert_allclose(f["kstep/sparsity"][()], np.array(expected["kstep"]), rtol=0, atol=1e-12)
        assert list(f["steps/patch_bytes"][()]) == expected["patch"]
        element = {"bf16": 2, "f16": 2, "raw": 4}[compare_as]
        assert int(f["steps/dense_bytes"][0]) == element * (16 * 8 + 8) + 2 * 5
        assert f.attrs["compared_as"] == compare_as
        assert f.attrs["precision"] == {"bf16": "mixed", "f16": "mixed-f16", "raw": "fp32"}[compare_as]
        if compare_as == "raw":  # an FP32 master changes at every step nearly everywhere
            assert f["steps/sparsity"][0] < 0.2


def test_run_is_described(tmp_path):
    """The optimizer's lr, betas, eps and weight decay (a list where groups differ), the label and
    the caller's settings are in the config (read back with tomllib); the caller's keys win."""
    import tomllib

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    decay, no_decay = list(model[0].parameters()), list(model[1].parameters())
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-6, betas=(0.9, 0.95), eps=1e-8)
    out = tmp_path / "run.h5"
    pulse.torch.SparsityRecorder(model, out=out, optimizer=opt, label="bf16, lr 3e-6",
                                 config={"seed": 2, "task": 'gsm8k "main"', "eps": 1e-6}).close()
    with h5py.File(out, "r") as f:
        config = tomllib.loads(f.attrs["config"])
        assert f.attrs["label"] == "bf16, lr 3e-6"
        assert f.attrs["precision"] == "mixed"
    assert config == {"model": "Sequential", "precision": "mixed", "compare-as": "bf16", "optimizer": "AdamW",
                      "absorption-every": 0, "lr": 3e-6, "beta1": 0.9, "beta2": 0.95, "eps": 1e-6,
                      "weight-decay": [0.1, 0.0], "seed": 2, "task": 'gsm8k "main"', "label": "bf16, lr 3e-6"}
    with pytest.raises(pulse.Error, match="config key"):
        pulse.torch.SparsityRecorder(model, out=tmp_path / "bad.h5", config={"a b": 1})
    assert not os.path.exists(tmp_path / "bad.h5")
    with pytest.raises(pulse.Error, match="compare_as"):
        pulse.torch.SparsityRecorder(model, out=tmp_path / "bad.h5", compare_as="fp8")


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("precision", ["mixed", "bf16"])
def test_patches_are_the_senders(tmp_path, precision, threads):
    """The recorder encodes each step's patch from its own versions (no Sender, beside its other
    figures on threads != 1): the same bytes as a pulse.Sender over the compared weights makes
    for the same steps, so the same patch_bytes, and patch_raw_bytes as the patch's streams say.
    In mixed, an F16 parameter (compared as stored, unchanged: no gradient) beside the FP32 ones."""
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(24, 64), torch.nn.Tanh(), torch.nn.Linear(64, 5))
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    else:
        model.half_scale = torch.nn.Parameter(torch.randn(7).to(torch.float16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    x, y = torch.randn(32, 24), torch.randn(32, 5)
    compared = lambda: {n: p.detach().to(torch.bfloat16) if p.dtype == torch.float32 else p.detach().clone()
                        for n, p in model.named_parameters()}
    state = compared()
    sender = pulse.Sender(state)
    rec = pulse.torch.SparsityRecorder(model, out=tmp_path / "run.h5", optimizer=opt, threads=threads)
    patches = []
    for _ in range(6):
        loss = torch.nn.functional.mse_loss(model(x.to(model[0].weight.dtype)).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        rec.step(loss=loss.item())
        for n, t in compared().items():
            state[n].copy_(t)
        patches.append(sender.patch())
        assert rec.last_patch == patches[-1]
    rec.close()
    with h5py.File(tmp_path / "run.h5", "r") as f:
        assert list(f["steps/patch_bytes"][()]) == [len(p) for p in patches]
        raw = [pulse.inspect(p)["streams"] for p in patches]
        assert list(f["steps/patch_raw_bytes"][()]) == [r["index"]["raw"] + r["value"]["raw"] for r in raw]
    assert all(pulse.inspect(p)["total_changed"] > 0 for p in patches)


TIMINGS = {"/steps/time_s", "/steps/step_s", "/steps/encode_s", "/steps/measure_s", "/steps/sync_s", "/steps/write_s"}


def datasets(path):
    """Every dataset of a recorder's file but its timings, path -> values."""
    out = {}

    def read(name, obj):
        if isinstance(obj, h5py.Dataset) and "/" + name not in TIMINGS:
            out["/" + name] = obj[()]

    with h5py.File(path, "r") as f:
        f.visititems(read)
    return out


@pytest.mark.parametrize("precision", ["mixed", "bf16"])
def test_background_writes_what_synchronous_writes(tmp_path, precision):
    """background=True (each step measured while the next trains) and background=False write the
    same datasets, the same absorption arrays, and keep the same history (flush() between steps
    changes nothing); both count their CPU time in the same parts."""
    def run(background):
        torch.manual_seed(5)
        model = torch.nn.Sequential(torch.nn.Linear(12, 48), torch.nn.Tanh(), torch.nn.Linear(48, 4))
        if precision == "bf16":
            model = model.to(torch.bfloat16)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
        x, y = torch.randn(16, 12), torch.randn(16, 4)
        out = tmp_path / f"{background}.h5"
        rec = pulse.torch.SparsityRecorder(model, out=out, optimizer=opt, k_values=(1, 2, 4), absorption_every=2,
                                           background=background)
        for t in range(7):
            loss = torch.nn.functional.mse_loss(model(x.to(model[0].weight.dtype)).float(), y)
            loss.backward()
            opt.step()
            rec.step(loss=loss.item())
            opt.zero_grad()
            if t % 3 == 1:
                rec.flush()
        history = rec.history_bytes()
        rec.close()
        assert set(rec.cpu_seconds) == {"taken at step()", "change log", "k-step counts", "patch encode",
                                        "Adam-ratio quantiles and gradient counts", "row write"}
        assert all(cpu >= 0 for cpu in rec.cpu_seconds.values()) and rec.cpu_seconds["patch encode"] > 0
        return datasets(out), history

    (background, history), (synchronous, history_sync) = run(True), run(False)
    assert history == history_sync
    assert background.keys() == synchronous.keys()
    assert {"/absorption/step_000006/ratio_counts", "/steps/patch_bytes", "/steps/adam_ratio", "/kstep/sparsity",
            "/steps/grad_norm", "/steps/grad_sparsity", "/steps/loss"} <= background.keys()
    for path, values in synchronous.items():
        np.testing.assert_array_equal(background[path], values, err_msg=path)


class _FailingSender:
    def patch(self, *args, **kwargs):
        raise MemoryError("no memory for the patch")


@pytest.mark.parametrize("background", [True, False])
def test_measurement_error_surfaces_once(tmp_path, background):
    """An error in a step's measurement is raised once, naming the step, by the call that waits for
    it: the next step() in the background (or step() itself on background=False); the rows before
    it are written, the recorder records no more steps, and close() still closes the file."""
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    out = tmp_path / "run.h5"
    rec = pulse.torch.SparsityRecorder(model, out=out, optimizer=opt, background=background)

    def train():
        model(torch.ones(4)).sum().backward()
        opt.step()
        opt.zero_grad()

    for _ in range(2):
        train()
        rec.step()
    rec.flush()  # step 2 measured with the recorder's own sender
    rec.sender = _FailingSender()
    train()
    failed = r"^SparsityRecorder: measuring step 3 failed: no memory for the patch$"
    if background:
        rec.step()  # step 3, measured in the background
        train()
        with pytest.raises(pulse.Error, match=failed):
            rec.step()
    else:
        with pytest.raises(pulse.Error, match=failed):
            rec.step()
    with pytest.raises(pulse.Error, match="records no more steps"):
        rec.step()
    rec.close()
    with h5py.File(out, "r") as f:
        assert f["steps/step"][()].tolist() == [1, 2]


@pytest.mark.parametrize("cycle", [False, True])
def test_recorder_never_closed_stops_its_thread(tmp_path, cycle):
    """A recorder measures on a thread of its own (background) and, on threads != 1, a second one
    beside it; dropped without close(), its threads end once the recorder is collected (also when
    only the cycle collector frees it: once its last step's measurement, which holds it, is done),
    and close() ends them at once."""
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def record(out):
        before = set(threading.enumerate())
        rec = pulse.torch.SparsityRecorder(model, out=out, optimizer=opt)
        model(torch.ones(4)).sum().backward()
        opt.step()
        opt.zero_grad()
        rec.step()
        rec.flush()
        started = [t for t in threading.enumerate() if t not in before]
        assert len(started) == 2
        return rec, started

    rec, threads = record(tmp_path / "closed.h5")
    rec.close()
    assert not any(t.is_alive() for t in threads)
    rec, threads = record(tmp_path / "dropped.h5")
    if cycle:
        rec.itself = rec
    del rec
    for _ in range(300):
        gc.collect()
        for t in threads:
            t.join(timeout=0.05)
        if not any(t.is_alive() for t in threads):
            break
    assert not any(t.is_alive() for t in threads)


@pytest.mark.parametrize("n", [1, 2, 3, 1000, 200001])
def test_quantiles_select_as_numpy_sorts(n):
    """The radix select against np.quantile (linear interpolation): ties, zeros, one bin holding
    everything, spread over many binades."""
    rng = np.random.default_rng(n)
    cases = [np.abs(rng.standard_normal(n)) * np.exp(rng.standard_normal(n) * 5),
             rng.integers(0, 3, n).astype(np.float64), np.full(n, 0.25), np.zeros(n)]
    for x in cases:
        x = x.astype(np.float32)
        assert pulse.torch.quantiles(torch.from_numpy(x), QS) == pytest.approx(np.quantile(x.astype(np.float64), QS), rel=1e-15, abs=0)


def test_history_is_the_changes(tmp_path):
    """The k-step history holds the recorded version, one staging copy and the change logs of the
    last max(k) steps (16-bit positions within their block of the model and old bits, or the old
    version where that is smaller), not max(k) copies of the model."""
    torch.manual_seed(2)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    rec = pulse.torch.SparsityRecorder(model, out=tmp_path / "run.h5", optimizer=opt, k_values=(1, 2, 4, 8))
    x = torch.randn(32, 64)
    for _ in range(12):
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        rec.step()
    rec.close()
    with h5py.File(tmp_path / "run.h5", "r") as f:
        changed = f["steps/changed"][()]
    dense = 2 * sum(p.numel() for p in model.parameters())
    entry = 2 + 2  # a changed element's position and old BF16 bits
    assert rec.history_bytes() == 2 * dense + sum(entry * int(c) if entry * int(c) < dense else dense for c in changed[-8:])
    assert all(0 < entry * c < dense for c in changed)  # sparse logs (below: whole ones)
    lr_high = torch.optim.AdamW(model.parameters(), lr=1e-1)
    rec = pulse.torch.SparsityRecorder(model, out=tmp_path / "dense.h5", optimizer=lr_high, k_values=(1, 2))
    for _ in range(3):
        model(x).square().mean().backward()
        lr_high.step()
        lr_high.zero_grad()
        rec.step()
    rec.close()
    with h5py.File(tmp_path / "dense.h5", "r") as f:
        assert (f["steps/changed"][()] * entry >= dense).all()
    assert rec.history_bytes() == 4 * dense


def test_recorder_declares_pulse_train_schema(tmp_path):
    """The recorder's file holds every per-step dataset of pulse-train's schema, of the same type and
    units, and nothing else (besides absorption arrays, which it writes when due)."""
    model = torch.nn.Linear(2, 2)
    out = tmp_path / "run.h5"
    pulse.torch.SparsityRecorder(model, out=out).close()
    schema = {c["path"]: c for c in pulse._pulse.train_stats_schema()}
    per_step = {p for p, c in schema.items() if c["kind"] == "per_step"}
    assert {"/steps/changed", "/kstep/sparsity", "/steps/tensor_changed"} <= per_step
    with h5py.File(out, "r") as f:
        stored = set()
        f.visititems(lambda name, obj: stored.add("/" + name) if isinstance(obj, h5py.Dataset) else None)
        assert stored == per_step
        for path in stored:
            assert f[path].attrs["units"] == schema[path]["units"], path
            assert f[path].dtype == np.dtype(schema[path]["type"]), path
            if schema[path]["columns_attribute"]:
                assert schema[path]["columns_attribute"] in f[path].attrs, path


def test_recorder_refuses_to_overwrite(tmp_path):
    model = torch.nn.Linear(2, 2)
    out = tmp_path / "run.h5"
    pulse.torch.SparsityRecorder(model, out=out).close()
    with pytest.raises(pulse.Error, match="exists"):
        pulse.torch.SparsityRecorder(model, out=out)


def test_example_torch_relay(tmp_path):
    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "torch_relay.py")
    run = subprocess.run([sys.executable, example, "--out", str(tmp_path), "--steps", "25"], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "25 versions received bit-identical" in run.stdout
    assert "mean sparsity" in run.stdout
    assert os.path.exists(tmp_path / "report" / "summary.md")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
