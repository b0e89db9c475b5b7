"""Statistics files in pulse-train's schema (apps/pulse_train.cpp, docs/statistics.md),
made by a small numpy simulation instead of pulse-train, so figure tests run in seconds and can
hold any sweep. The weights really are simulated: an FP32 master moved by Adam-sized updates
whose sign persists from step to step with probability `keep_sign`, its BF16 copy cast with
round-to-nearest-even, and every count (changed, per tensor, k-step, absorption histograms) taken
from those arrays the way pulse-train defines it."""
import h5py
import numpy as np

TENSORS = [("wte.weight", 1200), ("blocks.0.ln1.weight", 100), ("blocks.0.attn.qkv.weight", 2400),
           ("blocks.0.attn.qkv.bias", 300), ("blocks.0.mlp.fc.weight", 3600), ("blocks.0.mlp.fc.bias", 400),
           ("ln_f.bias", 100)]
K_VALUES = [1, 2, 4, 8, 16, 32]
THRESHOLDS = [0.0, 1e-10, 1e-8, 1e-6]
RATIO_K, WEIGHT_K = (-24, 16), (-40, 8)


def bf16_bits(x):
    """uint16 bits of bf16(x), round to nearest even (finite inputs)."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_value(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def half_ulp(bits):
    """Half a BF16 ulp of the BF16 values (normal numbers: 2^(exponent - 8))."""
    v = np.abs(bf16_value(bits)).astype(np.float64)
    _, e = np.frexp(v)
    return np.ldexp(1.0, e - 1 - 8)


def log2_histogram(values, k_range, finite=None):
    """Counts per bin [2^k, 2^(k+1)) for k in k_range, then zero, below, above, non-finite."""
    k0, k1 = k_range
    v = np.abs(np.asarray(values, dtype=np.float64))
    counts = np.zeros(k1 - k0 + 4, dtype=np.int64)
    nz = v > 0
    _, e = np.frexp(v[nz])
    k = e - 1
    inside = (k >= k0) & (k < k1)
    np.add.at(counts, k[inside] - k0, 1)
    counts[k1 - k0] = np.sum(~nz)
    counts[k1 - k0 + 1] = np.sum(k < k0)
    counts[k1 - k0 + 2] = np.sum(k >= k1)
    return counts


def write(path, seed=1, lr=3e-6, mu=1, lag=0, model="tiny", steps=40, absorption_every=5, eval_every=10,
          eval_problems=128, keep_sign=0.8, inference_ranks=1, scale=1.0, precision="mixed"):
    """precision "bf16": no FP32 master, the weights are BF16 and each update is cast away or not
    (pulse-train then writes no absorption histograms: pass absorption_every=0)."""
    rng = np.random.default_rng(seed)
    names = [n for n, _ in TENSORS]
    numel = [int(scale * n) if "weight" in name and "ln" not in name else n for name, n in TENSORS]
    n = sum(numel)
    master = rng.normal(0, 0.02, n).astype(np.float32)
    if precision == "bf16":
        master = bf16_value(bf16_bits(master))
    size = 0.2 * lr * np.exp(rng.normal(0, 1, n))     # per-weight |update|: lr times an O(0.1-1) Adam ratio
    sign = rng.choice([-1.0, 1.0], n)
    bits = [bf16_bits(master)]
    rows = {k: [] for k in ("changed", "tensor_changed", "grad_sparsity", "reward", "loss", "eval_pass1")}
    absorption = {}
    for t in range(1, steps + 1):
        flip = rng.random(n) > keep_sign
        sign[flip] *= -1
        update = (sign * size).astype(np.float32)
        before = master.copy()
        master = (master + update).astype(np.float32)
        if precision == "bf16":
            master = bf16_value(bf16_bits(master))
        u = master.astype(np.float64) - before.astype(np.float64)  # the update the FP32 master took
        new = bf16_bits(master)
        changed = new != bits[-1]
        bits.append(new)
        rows["changed"].append(int(changed.sum()))
        edges = np.cumsum([0] + numel)
        rows["tensor_changed"].append([int(changed[a:b].sum()) for a, b in zip(edges[:-1], edges[1:])])
        g = rng.normal(0, 1e-7, n) * (rng.random(n) > 0.02)
        rows["grad_sparsity"].append([float(np.mean(np.abs(g) <= th)) for th in THRESHOLDS])
        rows["reward"].append(float(rng.random()))
        rows["loss"].append(float(rng.normal()))
        rows["eval_pass1"].append(float(rng.binomial(eval_problems, 0.4) / eval_problems) if t % eval_every == 0
                                  else np.nan)
        if absorption_every and t % absorption_every == 0:
            hu = half_ulp(bf16_bits(before))
            ratio = np.abs(u) / hu
            absorption[t] = (log2_histogram(ratio, RATIO_K), log2_histogram(before, WEIGHT_K),
                             int(np.sum(np.abs(u) < hu)))
    changed = np.array(rows["changed"])
    kstep = np.full((steps, len(K_VALUES)), np.nan)
    for j, k in enumerate(K_VALUES):
        for t in range(k, steps + 1):
            kstep[t - 1, j] = 1.0 - np.mean(bits[t] != bits[t - k])
    trainers = 1
    roles = ["trainer"] * trainers + ["inference"] * inference_ranks
    config = (f'model = "{model}"\nseed = {seed}\nlr = {lr!r}\nsteps = {steps}\nnum-iterations = {mu}\n'
              f'async-lag = {lag}\ninference-ranks = {inference_ranks}\neval-problems = {eval_problems}\n'
              f'init = "runs/sft-{model}/model.safetensors"\nout = "{path}"\nprecision = "{precision}"\n'
              f'absorption-every = {absorption_every}\n')
    with h5py.File(path, "w") as f:
        f.attrs.update({"format": "pulse-train statistics", "config": config, "num_parameters": n, "model": model,
                        "trainer_sync": "ddp", "precision": precision, "roles": roles, "tensor_names": names,
                        "tensor_numel": numel})
        s = f.create_group("steps")
        s["step"] = np.arange(1, steps + 1)
        s["changed"] = changed
        s["sparsity"] = 1.0 - changed / n
        s["tensor_changed"] = np.array(rows["tensor_changed"])
        s["tensor_changed"].attrs["tensor_names"] = names
        s["grad_sparsity"] = np.array(rows["grad_sparsity"])
        s["grad_sparsity"].attrs["thresholds"] = THRESHOLDS
        for k in ("reward", "loss", "eval_pass1"):
            s[k] = np.array(rows[k])
        synced = inference_ranks > 0
        s["patch_bytes"] = (changed * 2.1 + 500).astype(np.int64) if synced else np.zeros(steps, np.int64)
        s["dense_bytes"] = np.full(steps, 2 * n) if synced else np.zeros(steps, np.int64)
        s["step_s"] = np.full(steps, 0.1)
        s["sync_s"] = np.full(steps, 0.01)
        s["encode_s"] = np.full(steps, 0.002)
        s["apply_s"] = np.full(steps, 0.001)
        s["outer_step"] = np.ones(steps, np.int64)
        s["gate_density"] = np.full(steps, np.nan)
        f["kstep/sparsity"] = kstep
        f["kstep/sparsity"].attrs["k_values"] = K_VALUES
        f["ranks/bytes_sent"] = np.zeros((steps, len(roles)), np.int64)
        f["ranks/trainer_bytes_sent"] = np.zeros((steps, len(roles)), np.int64)
        for t, (ratio, weight, absorbed) in absorption.items():
            g = f.create_group(f"absorption/step_{t:06d}")
            g["ratio_counts"] = ratio
            g["ratio_counts"].attrs["k_range"] = list(RATIO_K)
            g["weight_counts"] = weight
            g["weight_counts"].attrs["k_range"] = list(WEIGHT_K)
            g["absorbed"] = [absorbed]
    return path
