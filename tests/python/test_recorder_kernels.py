"""The C++ behind pulse.torch.SparsityRecorder (python/src/change_logs, radix_quantiles,
adam_ratio, recorder_bindings) against numpy: the k-step history against kept copies of every
version, the quantiles against np.quantile, the Adam ratios against numpy's FP32 arithmetic, the
gradient's magnitude counts against numpy's; each the same at 1, 2 and 3 threads."""
import sys

import numpy as np
import pytest
import torch

import pulse
from pulse import _pulse

QS = [0.0, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0]
BITS = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}


def reference_quantiles(x, qs):
    """np.quantile, with infinities stood in for by +-1e300 (numpy interpolates them to NaN)."""
    x = x.astype(np.float64)
    q = np.quantile(np.where(np.isinf(x), np.sign(x) * 1e300, x), qs)
    return np.where(q > 1e200, np.inf, np.where(q < -1e200, -np.inf, q))


def quantile_cases(n, rng):
    spread = np.abs(rng.standard_normal(n)) * np.exp(rng.standard_normal(n) * 5)
    with_inf = spread.copy()
    with_inf[rng.integers(0, n, max(1, n // 50))] = np.inf
    signed = rng.standard_normal(n) * np.exp(rng.standard_normal(n) * 3)
    signed[rng.integers(0, n, max(1, n // 50))] = -np.inf
    signed[rng.integers(0, n, max(1, n // 100))] = -0.0
    return [spread, rng.integers(0, 3, n).astype(np.float64), np.full(n, 0.25), np.zeros(n), with_inf, signed]


@pytest.mark.parametrize("n", [1, 2, 3, 1000, 200001])
def test_quantiles_select_as_numpy_sorts(n):
    rng = np.random.default_rng(n)
    for x in quantile_cases(n, rng):
        x = x.astype(np.float32)
        got = [_pulse.quantiles(x, QS, threads) for threads in (1, 2, 3)]
        assert got[0] == got[1] == got[2]
        expected = reference_quantiles(x, QS)
        for g, e in zip(got[0], expected):
            assert g == pytest.approx(e, rel=1e-15, abs=0) if np.isfinite(e) else g == e


def test_quantiles_of_nothing_or_nan_are_nan():
    assert all(np.isnan(_pulse.quantiles(np.zeros(0, np.float32), QS, 0)))
    x = np.arange(100, dtype=np.float32)
    x[37] = np.nan
    assert all(np.isnan(_pulse.quantiles(x, QS, 2)))
    assert np.isnan(np.quantile(x, QS)).all()  # numpy's answer
    for at in (0, 255, 256, 1000):  # a NaN of either sign first, last, at the ends of a run of values
        for sign in (1, -1):
            y = np.arange(1001, dtype=np.float32)
            y[at] = sign * np.nan
            assert all(np.isnan(_pulse.quantiles(y, QS, 1))), (at, sign)
    with pytest.raises(pulse.Error, match="not in"):
        _pulse.quantiles(x, [1.5], 1)
    with pytest.raises(pulse.Error, match="contiguous 1-D"):
        _pulse.quantiles(x.astype(np.float64), QS, 1)


@pytest.mark.parametrize("bf16", [False, True])
def test_adam_ratios_are_numpy_fp32_arithmetic(bf16):
    """|m / (1 - b1^t)| / (sqrt(v / (1 - b2^t)) + eps), each operation rounded to FP32 (numpy's
    float32 arithmetic), bit for bit, for moments of two parameter groups (zeros included)."""
    rng = np.random.default_rng(5)
    groups = [(70001, 0.9, 0.999, 1e-8, 7.0), (513, 0.8, 0.95, 1e-6, 3.0)]
    moments, expected, outs = [], [], []
    for n, b1, b2, eps, t in groups:
        m = torch.from_numpy((rng.standard_normal(n) * 1e-3).astype(np.float32))
        v = torch.from_numpy((rng.random(n) ** 4 * 1e-6).astype(np.float32))
        m[:7] = 0
        v[:3] = 0
        if bf16:
            m, v = m.to(torch.bfloat16), v.to(torch.bfloat16)
        mf, vf = m.float().numpy(), v.float().numpy()
        f = np.float32
        with np.errstate(all="ignore"):
            expected.append(np.abs(mf / f(1 - b1 ** t)) / (np.sqrt(vf / f(1 - b2 ** t)) + f(eps)))
        bits = (lambda x: x.view(torch.int16).numpy()) if bf16 else (lambda x: x.numpy())
        outs.append(np.full(n, np.nan, np.float32))
        moments.append((bits(m), bits(v), outs[-1], bf16, 1 - b1 ** t, 1 - b2 ** t, eps))
    for threads in (1, 2, 3):
        for out in outs:
            out.fill(np.nan)
        _pulse.adam_ratios(moments, threads)
        for out, e in zip(outs, expected):
            np.testing.assert_array_equal(out.view(np.int32), e.view(np.int32))


def test_count_magnitude_at_most_is_numpys_count():
    """The gradient's counts of |g| <= each threshold against numpy's, over a spread of signed
    values with zeros, -0, infinities and NaN (counted by none), across the C++'s chunks."""
    rng = np.random.default_rng(9)
    g = (rng.standard_normal(600001) * np.exp(rng.standard_normal(600001) * 8)).astype(np.float32)
    g[rng.integers(0, g.size, 5000)] = 0
    g[rng.integers(0, g.size, 500)] = -0.0
    g[rng.integers(0, g.size, 50)] = np.inf
    g[rng.integers(0, g.size, 50)] = -np.inf
    g[rng.integers(0, g.size, 50)] = np.nan
    thresholds = [0.0, 1e-10, 1e-8, 1e-6, 1.0, float("inf")]
    with np.errstate(invalid="ignore"):
        expected = [int((np.abs(g) <= np.float32(t)).sum()) for t in thresholds]
    for threads in (1, 2, 3):
        assert _pulse.count_magnitude_at_most(g, thresholds, threads) == expected


def test_bf16_to_fp32_is_torchs_widening():
    """BF16 bits widened to FP32 as torch's .float() widens them, bit for bit: every 16-bit
    pattern (zeros, subnormals, infinities, NaNs of either sign)."""
    bits = np.arange(-32768, 32768, dtype=np.int16)
    out = np.full(bits.size, np.nan, np.float32)
    _pulse.bf16_to_fp32(bits, out)
    expected = torch.from_numpy(bits).view(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(out.view(np.int32), expected.view(np.int32))
    with pytest.raises(pulse.Error, match="65536 values into 3"):
        _pulse.bf16_to_fp32(bits, np.zeros(3, np.float32))
    with pytest.raises(pulse.Error, match="contiguous 1-D"):
        _pulse.bf16_to_fp32(bits.astype(np.int32), out)


def next_version(rng, history, step):
    """The next version: a few changes, most elements changed, none, or back to an earlier one."""
    now = history[-1].copy()
    kind = step % 4
    if kind == 0:
        changed = rng.random(now.size) < 0.03
    elif kind == 1:
        changed = rng.random(now.size) < 0.6
    elif kind == 2:
        changed = np.zeros(now.size, bool)
    else:
        return history[max(0, len(history) - 3)].copy()
    now[changed] += rng.integers(1, 3, int(changed.sum())).astype(now.dtype)
    return now


@pytest.mark.parametrize("width", [1, 2, 4, 8])
def test_change_logs_against_kept_copies(width):
    """log's per-parameter changed counts (reading both versions, writing neither),
    differing's k-step counts and the logs' bytes against every version kept as a copy, over
    parameters that start and end inside the C++'s blocks (one empty), sparse and whole logs, and
    versions that return to earlier ones; at 1, 2, 3 threads."""
    rng = np.random.default_rng(width * 10 + 4)
    ends = [10, 10, 40000, 70001, 100000]
    keep, ks = 5, [1, 2, 3, 5, 7]
    first = rng.integers(-100, 100, ends[-1]).astype(BITS[width])
    logs = [_pulse.ChangeLogs(width, keep) for _ in range(3)]
    recorded = [first.copy() for _ in logs]
    history = [first]
    for step in range(1, 12):
        now = next_version(rng, history, step)
        differs = now != history[-1]
        expected_changed = [int(differs[a:b].sum()) for a, b in zip([0] + ends[:-1], ends)]
        history.append(now)
        expected_differing = {k: int((now != history[-1 - k]).sum()) for k in ks if k <= min(step, keep)}
        for threads, (log, rec) in enumerate(zip(logs, recorded), start=1):
            before = rec.copy()
            staged = now.copy()
            assert log.log(staged, rec, ends, threads) == expected_changed
            np.testing.assert_array_equal(staged, now)  # read, not written
            np.testing.assert_array_equal(rec, before)
            assert log.differing(now, ks, threads) == expected_differing
            assert log.depth == min(step, keep)
            rec[:] = now
        sizes = [int((history[j] != history[j - 1]).sum()) for j in range(max(1, step - keep + 1), step + 1)]
        position_bytes = 2  # within a block of 2^15 elements
        assert logs[0].bytes() == sum(c * (position_bytes + width) if c * (position_bytes + width) < width * ends[-1]
                                      else width * ends[-1] for c in sizes)


def test_change_logs_refuse_what_does_not_fit():
    log = _pulse.ChangeLogs(2, 3)
    a, b = np.zeros(10, np.int16), np.zeros(11, np.int16)
    with pytest.raises(pulse.Error, match="elements"):
        log.log(a, b, [10], 1)
    with pytest.raises(pulse.Error, match="ends"):
        log.log(a, a.copy(), [4, 9], 1)
    with pytest.raises(pulse.Error, match="2-byte"):
        log.log(a.astype(np.int32), a.astype(np.int32), [10], 1)
    with pytest.raises(pulse.Error, match="elements of 1, 2, 4 or 8 bytes"):
        _pulse.ChangeLogs(3, 3)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
