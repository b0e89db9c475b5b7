"""pulse-measure end to end on checkpoint series made here with Debian's torch in the Hugging
Face layout (2-shard folders with model.safetensors.index.json: metadata.total_size and
weight_map; config and tokenizer files; BF16, F16 and F32 tensors and an I64 buffer):
- every dataset equals a numpy recomputation from the checkpoints read back with the
  independent pure-Python reader (safetensors_ref): changed counts per step, per tensor and per
  tensor kind, sparsity, k-step sparsity (NaN where no checkpoint is k steps back), dense bytes;
- np 1, 2 and 4 write identical datasets (patch bytes included: units do not depend on np);
- --max-k 5 over a series with gaps (its k-step history rebuilt from change logs) equals numpy;
- with one unit, patch_bytes equals the size of `pulse-sync encode` between the same files;
- `python3 -m pulse_analysis report` reads the file, and jobs/measure-checkpoints.sbatch (run
  without Slurm) writes the same rows and the report;
- with --train-app: on the anchors of a pulse-train run (--anchor-every 1) the rows equal
  pulse-train's own /steps and /kstep rows, and with one unit the patch bytes equal its patches';
- bad input (missing shard, tensor in two shards, tensor in a shard but not in the index and
  the other way round, sharded + single files, index.json or a .bin as a checkpoint, a missing
  path, another model in the series, an existing output) exits non-zero with one line naming
  the file and writes nothing.
    test_pulse_measure.py --app build/apps/pulse-measure --sync-app build/apps/pulse-sync --mpiexec mpiexec
"""
import argparse
import glob
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_ref  # noqa: E402

from expect import expect, failures  # noqa: E402


# name -> (dtype, shape, kind): a 2-layer Llama-like model; the kinds are assigned by hand here.
H, V, FF = 32, 96, 64
MODEL = {"model.embed_tokens.weight": ("BF16", (V, H), "embeddings"), "lm_head.weight": ("F16", (V, H), "embeddings"),
         "model.norm.weight": ("F32", (H,), "norms"), "model.extra_scale": ("BF16", (7,), "other"),
         "model.rotary_emb.position_ids": ("I64", (16,), None)}
for layer in range(2):
    p = f"model.layers.{layer}."
    for proj in "qkvo":
        MODEL[p + f"self_attn.{proj}_proj.weight"] = ("BF16", (H, H), "attention")
    for proj, shape in (("gate", (FF, H)), ("up", (FF, H)), ("down", (H, FF))):
        MODEL[p + f"mlp.{proj}_proj.weight"] = ("BF16", shape, "mlp")
    MODEL[p + "input_layernorm.weight"] = ("F32", (H,), "norms")
    MODEL[p + "post_attention_layernorm.weight"] = ("F32", (H,), "norms")
KINDS = ["attention", "mlp", "embeddings", "norms", "other"]
KSTEP = [1, 2, 4, 8, 16, 32]
TORCH = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "I64": torch.int64}


def to_numpy(t, dtype):
    """torch tensor -> numpy array as safetensors_ref stores it (BF16 as uint16 bits)."""
    if dtype == "BF16":
        return t.contiguous().view(torch.int16).numpy().view(np.uint16)
    return t.contiguous().numpy()


def initial_state(gen):
    state = {}
    for name, (dtype, shape, _) in MODEL.items():
        if dtype == "I64":
            state[name] = torch.arange(shape[0], dtype=torch.int64)
        else:
            state[name] = (torch.randn(shape, generator=gen) * 0.05).to(TORCH[dtype])
    return state


def next_state(state, gen, fraction=0.01):
    """About `fraction` of each float tensor's elements move by one ulp (up or down); the F32 norms
    get small FP32 updates."""
    out = {}
    for name, t in state.items():
        dtype = MODEL[name][0]
        if dtype == "I64":
            out[name] = t.clone()
            continue
        mask = torch.rand(t.shape, generator=gen) < fraction
        if dtype == "F32":
            out[name] = t + mask.float() * 1e-3
        else:
            bits = t.view(torch.int16).clone()
            step = torch.where(torch.rand(t.shape, generator=gen) < 0.5, 1, -1).to(torch.int16)
            bits[mask] += step[mask]
            out[name] = bits.view(TORCH[dtype])
    return out


def write_folder(path, state, shards=2, metadata=None):
    """A Hugging Face folder: model-0000k-of-0000n.safetensors + index, config, tokenizer files."""
    os.makedirs(path, exist_ok=True)
    names = list(state)
    weight_map, total = {}, 0
    for k in range(shards):
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = names[k::shards]
        tensors = [(n, MODEL[n][0], to_numpy(state[n], MODEL[n][0])) for n in part]
        safetensors_ref.write(os.path.join(path, file), tensors, metadata or {"format": "pt"})
        for n, _, a in tensors:
            weight_map[n] = file
            total += a.nbytes
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "hidden_size": H, "vocab_size": V}, f)
    with open(os.path.join(path, "tokenizer.json"), "w") as f:
        json.dump({"model": {"type": "BPE", "vocab": {}}}, f)


def write_file(path, state):
    safetensors_ref.write(path, [(n, MODEL[n][0], to_numpy(state[n], MODEL[n][0])) for n in state],
                          {"format": "pt"})


def read_state(path):
    """{name: (dtype, array)} of a file or folder, with the independent reader."""
    files = sorted(glob.glob(os.path.join(path, "*.safetensors"))) if os.path.isdir(path) else [path]
    out = {}
    for f in files:
        tensors, _ = safetensors_ref.read(f)
        out.update(tensors)
    return out


def bits(a):
    return a.view(np.uint32) if a.dtype.itemsize == 4 else a.view(np.uint16)


def expected_rows(paths, steps, view=lambda dtype, a: bits(a)):
    """The datasets pulse-measure must write, recomputed with numpy; view(dtype, array): the bits
    compared."""
    states = [{n: (d, view(d, a)) for n, (d, a) in read_state(p).items() if d != "I64"} for p in paths]
    names = sorted(n for n in MODEL if MODEL[n][0] != "I64")
    numel = {n: int(np.prod(MODEL[n][1])) for n in names}
    total = sum(numel.values())
    rows = {"step": [], "changed": [], "sparsity": [], "tensor_changed": [], "kstep": [], "kinds_changed": [],
            "dense_bytes": []}
    for t in range(1, len(states)):
        per = [int(np.count_nonzero(states[t][n][1] != states[t - 1][n][1])) for n in names]
        rows["step"].append(steps[t])
        rows["tensor_changed"].append(per)
        rows["changed"].append(sum(per))
        rows["sparsity"].append(1 - sum(per) / total)
        rows["kinds_changed"].append([sum(c for n, c in zip(names, per) if MODEL[n][2] == k) for k in KINDS])
        ks = []
        for k in KSTEP:
            if steps[t] - k in steps[:t]:
                j = steps.index(steps[t] - k)
                ks.append(sum(int(np.count_nonzero(states[t][n][1] == states[j][n][1])) for n in names) / total)
            else:
                ks.append(math.nan)
        rows["kstep"].append(ks)
        rows["dense_bytes"].append(sum(numel[n] * states[t][n][1].itemsize for n in names))
    return names, rows


def read_h5(path):
    with h5py.File(path, "r") as f:
        out = {}
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
        attrs = dict(f.attrs)
        names = [n.decode() if isinstance(n, bytes) else n for n in f["steps/tensor_changed"].attrs["tensor_names"]]
    return out, attrs, names


def same_nan(a, b, atol=0.0):
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return a.shape == b.shape and bool(np.all((np.abs(a - b) <= atol) | (np.isnan(a) & np.isnan(b))))


def check_against_numpy(label, out, paths, steps, view=lambda dtype, a: bits(a)):
    data, attrs, names = read_h5(out)
    exp_names, rows = expected_rows(paths, steps, view)
    expect(sorted(names) == exp_names, f"{label}: tensor_names {names}")
    if sorted(names) != exp_names:
        return data
    data["steps/tensor_changed"] = data["steps/tensor_changed"][:, np.argsort(names)]
    expect(list(data["steps/step"]) == rows["step"], f"{label}: steps {list(data['steps/step'])} vs {rows['step']}")
    expect(np.array_equal(data["steps/tensor_changed"], np.array(rows["tensor_changed"])), f"{label}: tensor_changed")
    expect(list(data["steps/changed"]) == rows["changed"], f"{label}: changed")
    expect(np.allclose(data["steps/sparsity"], rows["sparsity"], rtol=0, atol=1e-12), f"{label}: sparsity")
    expect(same_nan(data["kstep/sparsity"], rows["kstep"], 1e-12), f"{label}: kstep\n{data['kstep/sparsity']}\n{rows['kstep']}")
    expect(np.array_equal(data["kinds/changed"], np.array(rows["kinds_changed"])), f"{label}: kinds/changed")
    expect(list(data["steps/dense_bytes"]) == rows["dense_bytes"], f"{label}: dense_bytes")
    expect(all(data["steps/patch_bytes"] > 0), f"{label}: patch_bytes {data['steps/patch_bytes']}")
    expect(np.allclose(data["steps/bits_per_changed"], 8 * data["steps/patch_bytes"] / data["steps/changed"]),
           f"{label}: bits_per_changed")
    expect(int(attrs["num_parameters"]) == sum(int(np.prod(MODEL[n][1])) for n in exp_names), f"{label}: num_parameters")
    for absent in ("steps/grad_sparsity", "steps/adam_ratio", "steps/reward", "steps/loss"):
        expect(absent not in data, f"{label}: {absent} present")
    expect("gradients" in str(attrs.get("absent_datasets")), f"{label}: no absent_datasets attribute")
    if os.path.isdir(paths[0]):
        files = [f.decode() if isinstance(f, bytes) else f for f in attrs["checkpoint_other_files"]]
        expect(files == [f"{n} ({os.path.getsize(os.path.join(paths[0], n))} bytes)"
                         for n in ("config.json", "model.safetensors.index.json", "tokenizer.json")],
               f"{label}: checkpoint_other_files {files}")
        meta = [m.decode() if isinstance(m, bytes) else m for m in attrs["checkpoint_metadata"]]
        expect(meta == ["model-00001-of-00002.safetensors: format=pt", "model-00002-of-00002.safetensors: format=pt"],
               f"{label}: checkpoint_metadata {meta}")
    return data


def run(cmd, timeout=300):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


# Datasets whose values depend on timing or on the rank count by definition.
TIMING = {"steps/encode_s", "steps/measure_s"}


def check_series(args, mpi, tmp):
    gen = torch.Generator().manual_seed(7)
    state = initial_state(gen)
    paths = []
    for t in range(35):  # 34 rows: k = 32 is reached
        path = os.path.join(tmp, "run", f"checkpoint-{t}")
        write_folder(path, state)
        paths.append(path)
        state = next_state(state, gen)
    outs = {}
    for np_ in (1, 2, 4):
        out = os.path.join(tmp, f"np{np_}.h5")
        code, o, e = run(mpi + ["-n", str(np_), args.app, "--out", out, "--unit-mb", "0.004",
                                "--glob", os.path.join(tmp, "run", "checkpoint-*")])
        expect(code == 0, f"np {np_}: exit {code}: {e.strip()[-800:]}")
        if code != 0:
            return
        expect("ETA" in e, f"np {np_}: no progress line")
        outs[np_] = check_against_numpy(f"np {np_}", out, paths, list(range(35)))
    for np_ in (2, 4):
        for key, value in outs[1].items():
            if key in TIMING or key.startswith("ranks/"):
                continue
            expect(key in outs[np_] and same_nan(outs[np_][key], value), f"np {np_}: {key} differs from np 1")
        expect(outs[np_]["ranks/read_bytes"].shape[1] == np_, f"np {np_}: ranks/read_bytes columns")
        expect(np.all(outs[np_]["ranks/read_bytes"].sum(axis=1) == outs[np_]["steps/dense_bytes"]),
               f"np {np_}: the ranks' shares do not add up to the model")

    # --as bf16 on the mixed-dtype series: its F32 norms compared as their BF16 cast, the BF16 and
    # F16 tensors as stored (the default there is raw: FP32 tensors beside 16-bit ones).
    out = os.path.join(tmp, "mixed-as-bf16.h5")
    code, o, e = run(mpi + ["-n", "2", args.app, "--quiet", "--out", out, "--unit-mb", "0.004", "--as", "bf16"] + paths)
    expect(code == 0, f"mixed dtypes --as bf16: exit {code}: {e.strip()[-800:]}")
    if code == 0:
        check_against_numpy("mixed dtypes --as bf16", out, paths, list(range(35)), cast_bits(torch.bfloat16))
        _, attrs, _ = read_h5(out)
        expect(attrs["compared_as"] == "bf16" and attrs["precision"] == "checkpoint",
               f"mixed dtypes --as bf16: {attrs['compared_as']}, {attrs['precision']}")
    _, attrs, _ = read_h5(os.path.join(tmp, "np1.h5"))
    expect(attrs["compared_as"] == "raw", f"mixed dtypes default: compared_as {attrs['compared_as']}")

    # A shorter history (--max-k 5: k = 1, 2, 4), every other checkpoint from the 5th on (gaps in
    # the history it reverts through): the same rows as the numpy recomputation, and the same
    # k = 1, 2, 4 columns as the full run where the steps are all there.
    some = paths[:5] + paths[5::2]
    some_steps = list(range(5)) + list(range(5, 35, 2))
    out = os.path.join(tmp, "max_k5.h5")
    code, o, e = run(mpi + ["-n", "2", args.app, "--quiet", "--out", out, "--unit-mb", "0.004", "--max-k", "5",
                            "--steps", ",".join(map(str, some_steps))] + some)
    expect(code == 0, f"max-k 5: exit {code}: {e.strip()[-800:]}")
    if code == 0:
        data, _, _ = read_h5(out)
        _, rows = expected_rows(some, some_steps)
        expect(same_nan(data["kstep/sparsity"], np.array(rows["kstep"])[:, :3], 1e-12),
               f"max-k 5: kstep\n{data['kstep/sparsity']}\n{np.array(rows['kstep'])[:, :3]}")
        expect(list(data["steps/changed"]) == rows["changed"], "max-k 5: changed")
        expect(same_nan(data["kstep/sparsity"][:3], outs[1]["kstep/sparsity"][:3, :3]), "max-k 5: differs from max-k 32")

    # Every other checkpoint, with their steps: k = 1 has no partner (NaN), k = 2 has.
    every_other = paths[::2]
    steps = list(range(0, 35, 2))
    out = os.path.join(tmp, "every_other.h5")
    code, o, e = run(mpi + ["-n", "2", args.app, "--quiet", "--out", out, "--steps", ",".join(map(str, steps))]
                     + every_other)
    expect(code == 0, f"every other: exit {code}: {e.strip()[-800:]}")
    if code == 0:
        data = check_against_numpy("every other", out, every_other, steps)
        expect(np.all(np.isnan(data["kstep/sparsity"][:, 0])) and np.all(np.isfinite(data["kstep/sparsity"][:, 1])),
               "every other: k=1 should be NaN and k=2 finite")
        expect(list(data["steps/steps_apart"]) == [2] * (len(steps) - 1), "every other: steps_apart")

    # jobs/measure-checkpoints.sbatch outside Slurm (mpirun): the file and its report.
    root = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    runs = os.path.join(tmp, "job-runs")
    env = dict(os.environ, PULSE_ROOT=root, PULSE_BUILD=os.path.dirname(os.path.dirname(os.path.abspath(args.app))),
               PULSE_RUNS=runs, PULSE_NP="2", PULSE_CHECKPOINTS=os.path.join(tmp, "run", "checkpoint-*"),
               PULSE_MEASURE_ARGS="--quiet --unit-mb 0.004", PULSE_PYTHON=sys.executable, PULSE_LAUNCHER="mpirun")
    p = subprocess.run(["bash", os.path.join(root, "jobs", "measure-checkpoints.sbatch")], capture_output=True,
                       text=True, env=env, timeout=300)
    expect(p.returncode == 0, f"measure-checkpoints.sbatch: exit {p.returncode}: {p.stderr.strip()[-800:]}")
    made = glob.glob(os.path.join(runs, "*", "measure.h5"))
    expect(len(made) == 1, f"measure-checkpoints.sbatch: made {made}")
    if made:
        data, _, _ = read_h5(made[0])
        expect(list(data["steps/changed"]) == list(outs[1]["steps/changed"]), "measure-checkpoints.sbatch: rows differ")
        expect(os.path.exists(os.path.join(os.path.dirname(made[0]), "report", "summary.md")),
               "measure-checkpoints.sbatch: no report")

    # The report reads the file as it reads pulse-train's.
    env = dict(os.environ, PYTHONPATH=args.analysis)
    rep = os.path.join(tmp, "report")
    p = subprocess.run([sys.executable, "-m", "pulse_analysis", "report", os.path.join(tmp, "np1.h5"), "-o", rep],
                       capture_output=True, text=True, env=env)
    expect(p.returncode == 0, f"report: exit {p.returncode}: {p.stderr.strip()[-800:]}")
    if p.returncode == 0:
        mean = float(np.mean(outs[1]["steps/sparsity"]))
        expect(f"mean sparsity {100 * mean:.3f}%" in p.stdout, f"report: {p.stdout}")
        expect(os.path.exists(os.path.join(rep, "kstep.png")), "report: no kstep.png")


def check_patch_bytes(args, tmp):
    """One unit holding the whole model: patch_bytes is the size of pulse-sync's patch."""
    gen = torch.Generator().manual_seed(3)
    state = {n: t for n, t in initial_state(gen).items() if MODEL[n][0] != "I64"}
    files = []
    for t in range(3):
        files.append(os.path.join(tmp, f"single-{t}.safetensors"))
        write_file(files[-1], state)
        state = next_state(state, gen)
    out = os.path.join(tmp, "single.h5")
    code, o, e = run([args.app, "--quiet", "--out", out, "--unit-mb", "1024"] + files)
    expect(code == 0, f"single files: exit {code}: {e.strip()}")
    if code != 0:
        return
    data, _, _ = read_h5(out)
    for t in (1, 2):
        patch = os.path.join(tmp, f"patch-{t}.pulse")
        code, o, e = run([args.sync_app, "encode", "--base", files[t - 1], "--target", files[t], "-o", patch])
        expect(code == 0, f"pulse-sync encode: {e.strip()}")
        if code == 0:
            expect(int(data["steps/patch_bytes"][t - 1]) == os.path.getsize(patch),
                   f"patch_bytes {int(data['steps/patch_bytes'][t - 1])} vs pulse-sync {os.path.getsize(patch)}")


def cast_bits(to):
    """view for expected_rows: FP32 arrays as the bits of torch's cast to `to` (round to nearest even),
    16-bit ones as stored."""
    def view(dtype, a):
        if dtype != "F32":
            return bits(a)
        return torch.from_numpy(np.array(a)).to(to).view(torch.int16).numpy().view(np.uint16)
    return view


def fp32_state(gen):
    """An FP32 master (every float tensor of MODEL in F32); model.extra_scale holds the edge cases:
    a BF16 and an F16 rounding tie, an F16 subnormal, a value beyond F16's range, an FP32
    subnormal, a NaN (its payload changes every step) and a large negative value."""
    state = {n: torch.randn(shape, generator=gen) * 0.05 for n, (dtype, shape, _) in MODEL.items() if dtype != "I64"}
    state["model.extra_scale"] = torch.tensor([1 + 2 ** -8, 1 + 2 ** -11, 2.0 ** -20, 7e4, 1e-40, math.nan, -3e5])
    return state


def next_fp32_state(state, gen, t):
    """Small FP32 updates to every element (AdamW-sized at lr ~1e-5): most BF16 casts stay put."""
    out = {n: a + torch.randn(a.shape, generator=gen) * 1e-5 for n, a in state.items()}
    nan = out["model.extra_scale"].view(torch.int32)
    nan[5] = 0x7FC00000 | (t + 1)
    return out


def check_compare_as(args, mpi, tmp):
    """--as on an FP32 series: the default (every tensor FP32) compares the BF16 cast; bf16, f16 and
    raw each equal numpy on torch's casts; bf16 equals --as raw on the BF16 checkpoints torch casts
    (patch bytes included, equal to pulse-sync's patch between them); the choice is in the file."""
    gen = torch.Generator().manual_seed(13)
    state = fp32_state(gen)
    d = os.path.join(tmp, "fp32")
    os.makedirs(d)
    paths, cast_paths = [], []
    for t in range(10):
        paths.append(os.path.join(d, f"master-{t}.safetensors"))
        safetensors_ref.write(paths[-1], [(n, "F32", a.numpy()) for n, a in state.items()])
        cast_paths.append(os.path.join(d, f"bf16-{t}.safetensors"))
        safetensors_ref.write(cast_paths[-1], [(n, "BF16", to_numpy(a.to(torch.bfloat16), "BF16"))
                                               for n, a in state.items()])
        state = next_fp32_state(state, gen, t)
    outs = {}
    for as_, view in (("", cast_bits(torch.bfloat16)), ("bf16", cast_bits(torch.bfloat16)),
                      ("f16", cast_bits(torch.float16)), ("raw", lambda dtype, a: bits(a))):
        out = os.path.join(tmp, f"fp32-{as_ or 'default'}.h5")
        code, o, e = run(mpi + ["-n", "2", args.app, "--out", out, "--unit-mb", "0.004", "--max-k", "4"]
                         + (["--as", as_] if as_ else []) + paths)
        expect(code == 0, f"--as {as_}: exit {code}: {e.strip()[-800:]}")
        if code != 0:
            continue
        expect(("comparing their BF16 cast" in e) == (as_ == ""), f"--as {as_!r}: stderr {e!r}")
        data, attrs, _ = read_h5(out)
        _, rows = expected_rows(paths, list(range(10)), view)
        label = f"--as {as_ or '(default)'}"
        expect(list(data["steps/changed"]) == rows["changed"], f"{label}: changed {list(data['steps/changed'])} vs "
                                                               f"{rows['changed']}")
        expect(same_nan(data["kstep/sparsity"], np.array(rows["kstep"])[:, :3], 1e-12), f"{label}: kstep")
        expect(list(data["steps/dense_bytes"]) == rows["dense_bytes"], f"{label}: dense_bytes")
        expect(attrs["compared_as"] == (as_ or "bf16"), f"{label}: compared_as {attrs['compared_as']}")
        # the BF16 view of an FP32 master is the mixed-precision regime; anything else is not said
        expect(attrs["precision"] == ("mixed" if as_ in ("", "bf16") else "checkpoint"),
               f"{label}: precision {attrs['precision']}")
        outs[as_ or "default"] = data
    if "bf16" in outs and "raw" in outs:
        expect(float(np.mean(outs["raw"]["steps/sparsity"])) < 1e-3 < float(np.mean(outs["bf16"]["steps/sparsity"])),
               "FP32 master: raw should be ~0% sparse and its BF16 view sparse")
    out = os.path.join(tmp, "cast-raw.h5")
    code, o, e = run(mpi + ["-n", "2", args.app, "--quiet", "--out", out, "--unit-mb", "0.004", "--max-k", "4",
                            "--as", "raw"] + cast_paths)
    expect(code == 0, f"torch-cast BF16 series: exit {code}: {e.strip()[-800:]}")
    if code == 0 and "bf16" in outs:
        cast, _, _ = read_h5(out)
        for key, value in outs["bf16"].items():
            if key not in TIMING and not key.startswith("ranks/"):
                expect(same_nan(cast[key], value), f"--as bf16 on FP32 vs raw on torch's BF16 cast: {key} differs")
    out = os.path.join(tmp, "fp32-one-unit.h5")
    code, o, e = run([args.app, "--quiet", "--out", out, "--unit-mb", "1024"] + paths[:2])
    expect(code == 0, f"one unit: exit {code}: {e.strip()}")
    patch = os.path.join(tmp, "fp32-cast.pulse")
    p = subprocess.run([args.sync_app, "encode", "--base", cast_paths[0], "--target", cast_paths[1], "-o", patch],
                       capture_output=True, text=True)
    expect(p.returncode == 0, f"pulse-sync encode: {p.stderr.strip()}")
    if code == 0 and p.returncode == 0:
        data, _, _ = read_h5(out)
        expect(int(data["steps/patch_bytes"][0]) == os.path.getsize(patch),
               f"--as bf16 patch_bytes {int(data['steps/patch_bytes'][0])} vs pulse-sync {os.path.getsize(patch)}")
    code, o, e = run([args.app, "--quiet", "--out", out, "--overwrite", "--as", "fp8"] + paths[:2])
    expect(code != 0 and len(e.strip().splitlines()) == 1 and "--as" in e, f"--as fp8: exit {code}, {e!r}")


def check_description_and_json(args, tmp):
    """--set and --label into the config attribute (read back with tomllib), precision and model
    from them; --json's figures equal those recomputed from the file's datasets; a bad --set exits
    with one line and writes nothing."""
    gen = torch.Generator().manual_seed(17)
    state = {n: t for n, t in initial_state(gen).items() if MODEL[n][0] != "I64"}
    files = []
    for t in range(6):
        files.append(os.path.join(tmp, f"described-{t}.safetensors"))
        write_file(files[-1], state)
        state = next_state(state, gen)
    out = os.path.join(tmp, "described.h5")
    code, o, e = run([args.app, "--out", out, "--json", "--max-k", "4", "--set", "lr=3e-6", "--set", "seed=2",
                      "--set", "precision=bf16", "--set", "model=Qwen2.5-0.5B", "--set", "note=a \"quoted\" word",
                      "--label", "bf16, lr 3e-6"] + files)
    expect(code == 0, f"--set: exit {code}: {e.strip()[-800:]}")
    if code != 0:
        return
    data, attrs, _ = read_h5(out)
    config = tomllib.loads(attrs["config"])
    expect(config == {"lr": 3e-6, "seed": 2, "precision": "bf16", "model": "Qwen2.5-0.5B", "note": 'a "quoted" word',
                      "label": "bf16, lr 3e-6"}, f"--set: config {config}")
    expect(attrs["precision"] == "bf16" and attrs["model"] == "Qwen2.5-0.5B" and attrs["label"] == "bf16, lr 3e-6",
           f"--set: attributes {attrs['precision']}, {attrs.get('model')}, {attrs.get('label')}")
    fig = json.loads(o.strip().splitlines()[-1])["figures"]
    changed, patch, dense = data["steps/changed"], data["steps/patch_bytes"], data["steps/dense_bytes"]
    want = {"rows": len(changed), "num_parameters": int(attrs["num_parameters"]),
            "mean_sparsity": float(np.mean(data["steps/sparsity"])), "min_sparsity": float(np.min(data["steps/sparsity"])),
            "changed": int(changed.sum()), "patch_bytes": int(patch.sum()), "dense_bytes": int(dense.sum()),
            "dense_over_patch": float(dense.sum() / patch.sum()), "bits_per_changed": float(8 * patch.sum() / changed.sum())}
    for key, value in want.items():
        expect(math.isclose(fig[key], value, rel_tol=1e-12), f"--json {key}: {fig[key]} vs {value}")
    k = data["kstep/sparsity"]
    want_k = {"1": float(np.mean(k[:, 0])), "2": float(np.mean(k[1:, 1])), "4": float(np.mean(k[3:, 2]))}
    expect(sorted(fig["kstep_mean_sparsity"]) == sorted(want_k) and
           all(math.isclose(fig["kstep_mean_sparsity"][j], v, rel_tol=1e-12) for j, v in want_k.items()),
           f"--json kstep {fig['kstep_mean_sparsity']} vs {want_k}")
    expect(f"mean sparsity {100 * want['mean_sparsity']:.3f}%" in e and f"{want['changed']} changed" in e,
           f"closing line: {e.strip().splitlines()[-1]}")
    for bad, words in ((["--set", "lr"], ["--set lr", "key=value"]), (["--set", "lr=1", "--set", "lr=2"], ["twice"]),
                       (["--set", "label=x"], ["--label"])):
        fresh = os.path.join(tmp, "described-bad.h5")
        code, o, e = run([args.app, "--out", fresh] + bad + files[:2])
        lines = [line for line in e.splitlines() if line.strip()]
        expect(code != 0 and len(lines) == 1 and all(w in lines[0] for w in words), f"{bad}: exit {code}, {e!r}")
        expect(not os.path.exists(fresh), f"{bad}: wrote the output")


TRAINER_FILES = ["optimizer.pt", "rng_state_0.pth", "scheduler.pt", "trainer_state.json", "training_args.bin"]


def check_folder_filters(args, tmp):
    """Hugging Face Trainer folders: the Trainer's files are left out by default, named in one
    line and in checkpoint_left_out_files, the rows those of the folders without them; --include
    '*' keeps them; --exclude of a shard measures the other shard's tensors alone (numpy)."""
    gen = torch.Generator().manual_seed(19)
    state = initial_state(gen)
    paths = []
    for t in range(4):
        path = os.path.join(tmp, "trainer", f"checkpoint-{t}")
        write_folder(path, state)
        torch.save({"state": {0: {"exp_avg": torch.randn(1000, generator=gen)}}}, os.path.join(path, "optimizer.pt"))
        torch.save({"last_epoch": t}, os.path.join(path, "scheduler.pt"))
        torch.save({"python": t}, os.path.join(path, "rng_state_0.pth"))
        torch.save({"lr": 1e-5}, os.path.join(path, "training_args.bin"))
        with open(os.path.join(path, "trainer_state.json"), "w") as f:
            json.dump({"global_step": t}, f)
        paths.append(path)
        state = next_state(state, gen)
    out = os.path.join(tmp, "trainer.h5")
    code, o, e = run([args.app, "--out", out, "--unit-mb", "0.004"] + paths)
    expect(code == 0, f"Trainer folders: exit {code}: {e.strip()[-800:]}")
    if code == 0:
        lines = [line for line in e.splitlines() if "left out" in line]
        expect(len(lines) == 1 and all(n in lines[0] for n in TRAINER_FILES) and "Hugging Face Trainer" in lines[0],
               f"Trainer folders: left-out line {lines}")
        check_against_numpy("Trainer folders", out, paths, list(range(4)))  # other files: config, index, tokenizer
        _, attrs, _ = read_h5(out)
        left = [f.decode() if isinstance(f, bytes) else f for f in attrs["checkpoint_left_out_files"]]
        expect([f.split(" (")[0] for f in left] == TRAINER_FILES, f"checkpoint_left_out_files {left}")
    code, o, e = run([args.app, "--quiet", "--out", out, "--overwrite", "--include", "*"] + paths)
    expect(code == 0, f"--include '*': exit {code}: {e.strip()[-800:]}")
    if code == 0:
        _, attrs, _ = read_h5(out)
        files = [(f.decode() if isinstance(f, bytes) else f).split(" (")[0] for f in attrs["checkpoint_other_files"]]
        expect(all(n in files for n in TRAINER_FILES), f"--include '*': other files {files}")
    code, o, e = run([args.app, "--out", out, "--overwrite", "--exclude", "model-00002-of-00002.safetensors"] + paths)
    expect(code == 0, f"--exclude shard: exit {code}: {e.strip()[-800:]}")
    if code == 0:
        data, _, names = read_h5(out)
        first = sorted(n for n in list(MODEL)[0::2] if MODEL[n][0] != "I64")  # write_folder's shard 1
        expect(sorted(names) == first, f"--exclude shard: tensors {names}")
        states = [read_state(p) for p in paths]
        want = [sum(int(np.count_nonzero(bits(states[t][n][1]) != bits(states[t - 1][n][1]))) for n in first)
                for t in range(1, 4)]
        expect(list(data["steps/changed"]) == want, f"--exclude shard: changed {list(data['steps/changed'])} vs {want}")
        expect("model-00002-of-00002.safetensors (by --include/--exclude)" in e, f"--exclude shard: stderr {e!r}")
    code, o, e = run([args.app, "--out", os.path.join(tmp, "none.h5"), "--exclude", "*.safetensors"] + paths)
    expect(code != 0 and len(e.strip().splitlines()) == 1 and "--include/--exclude keep" in e,
           f"--exclude everything: exit {code}, {e!r}")


def check_bad_input(args, tmp):
    gen = torch.Generator().manual_seed(5)
    state = initial_state(gen)
    good = os.path.join(tmp, "bad", "good")
    write_folder(good, state)
    out = os.path.join(tmp, "bad", "out.h5")

    def variant(name, edit):
        path = os.path.join(tmp, "bad", name)
        shutil.copytree(good, path)
        edit(path)
        return path

    def index_edit(fn):
        def edit(path):
            p = os.path.join(path, "model.safetensors.index.json")
            j = json.load(open(p))
            fn(j)
            json.dump(j, open(p, "w"))
        return edit

    shard2 = "model-00002-of-00002.safetensors"
    first_in_2 = list(state)[1]
    cases = {
        "missing shard": (variant("missing", lambda p: os.remove(os.path.join(p, shard2))), ["missing", shard2]),
        "tensor in two shards": (variant("twice", lambda p: safetensors_ref.write(
            os.path.join(p, "model-00001-of-00002.safetensors"),
            [(n, MODEL[n][0], to_numpy(state[n], MODEL[n][0])) for n in list(state)[0::2] + [first_in_2]],
            {"format": "pt"})), ["also in", first_in_2]),
        "not in the index": (variant("unnamed", index_edit(lambda j: j["weight_map"].pop(first_in_2))),
                             ["does not name", first_in_2]),
        "not in the shard": (variant("ghost", index_edit(lambda j: j["weight_map"].__setitem__("ghost", shard2))),
                             ["lacks tensor", "ghost"]),
        "sharded and single": (variant("both", lambda p: write_file(os.path.join(p, "model.safetensors"), state)),
                               ["both", "model.safetensors"]),
        "index as checkpoint": (os.path.join(good, "model.safetensors.index.json"), ["index", "index.json"]),
        "missing path": (os.path.join(tmp, "bad", "nowhere"), ["no such file", "nowhere"]),
    }
    binfile = os.path.join(tmp, "bad", "pytorch_model.bin")
    torch.save(state, binfile)
    cases["torch .bin"] = (binfile, ["PyTorch", "pytorch_model.bin"])
    other = dict(state)
    other["model.norm.weight"] = torch.zeros(H + 1)
    MODEL_norm = MODEL["model.norm.weight"]
    MODEL["model.norm.weight"] = ("F32", (H + 1,), "norms")
    other_path = os.path.join(tmp, "bad", "other-model")
    write_folder(other_path, other)
    MODEL["model.norm.weight"] = MODEL_norm
    for label, (bad, words) in cases.items():
        code, o, e = run([args.app, "--out", out, good, bad])
        lines = [line for line in e.splitlines() if line.strip()]
        expect(code != 0, f"{label}: exit {code}")
        expect(len(lines) == 1 and all(w in lines[0] for w in words), f"{label}: stderr {e!r}")
        expect(not os.path.exists(out), f"{label}: wrote {out}")
    code, o, e = run([args.app, "--out", out, good, other_path])
    lines = [line for line in e.splitlines() if line.strip()]
    expect(code != 0 and len(lines) == 1 and "not the model of" in lines[0] and "other-model" in lines[0],
           f"another model: exit {code}, stderr {e!r}")
    expect(not os.path.exists(out), "another model: wrote the output")
    nowhere = os.path.join(tmp, "bad", "no-folder", "out.h5")
    code, o, e = run([args.app, "--out", nowhere, good, good])
    lines = [line for line in e.splitlines() if line.strip()]
    expect(code != 0 and len(lines) == 1 and "does not exist" in lines[0], f"missing output folder: {code}, {e!r}")
    expect(not os.path.exists(os.path.dirname(nowhere)), "missing output folder: made it")
    with open(out, "w") as f:
        f.write("keep me")
    code, o, e = run([args.app, "--out", out, good, good])
    lines = [line for line in e.splitlines() if line.strip()]
    expect(code != 0 and len(lines) == 1 and "exists" in lines[0], f"existing output: exit {code}, stderr {e!r}")
    expect(open(out).read() == "keep me", "existing output: changed")


def check_pulse_train(args, mpi, tmp):
    """pulse-train's own rows against pulse-measure on the anchors it published every step."""
    d = os.path.join(tmp, "train")
    os.makedirs(d)
    init = os.path.join(d, "sft")
    subprocess.run([args.sft_app, "--model", "tiny", "--digits", "1", "--steps", "100", "--eval-every", "100",
                    "--out", init], check=True, stdout=subprocess.DEVNULL)
    relay, stats = os.path.join(d, "relay"), os.path.join(d, "train.h5")
    steps = 6
    code, o, e = run(mpi + ["-n", "2", args.train_app, "--model", "tiny", "--digits", "1", "--lr", "3e-4",
                            "--warmup-steps", "2", "--group-size", "4", "--eval-every", "0", "--quiet",
                            "--init", os.path.join(init, "model.safetensors"), "--steps", str(steps),
                            "--prompts-per-step", "4", "--inference-ranks", "1", "--relay", relay,
                            "--anchor-every", "1", "--keep-anchors", "1000", "--out", stats], timeout=600)
    expect(code == 0, f"pulse-train: exit {code}: {e.strip()[-500:]}")
    if code != 0:
        return
    out = os.path.join(d, "measure.h5")
    code, o, e = run(mpi + ["-n", "2", args.app, "--quiet", "--out", out, "--unit-mb", "0.01",
                            "--glob", os.path.join(relay, "anchor-*.safetensors")])
    expect(code == 0, f"pulse-measure on anchors: exit {code}: {e.strip()[-500:]}")
    if code != 0:
        return
    m, _, m_names = read_h5(out)
    t, _, t_names = read_h5(stats)
    expect(list(m["steps/step"]) == list(t["steps/step"]), f"anchors: steps {m['steps/step']} vs {t['steps/step']}")
    expect(list(m["steps/changed"]) == list(t["steps/changed"]), "anchors: changed differs from pulse-train's")
    expect(np.array_equal(m["steps/sparsity"], t["steps/sparsity"]), "anchors: sparsity differs")
    expect(same_nan(m["kstep/sparsity"], t["kstep/sparsity"]), "anchors: k-step sparsity differs")
    cols = [m_names.index(n) for n in t_names]
    expect(np.array_equal(m["steps/tensor_changed"][:, cols], t["steps/tensor_changed"]), "anchors: tensor_changed")
    # One unit holding the whole model: the patches are the relay's patch files, byte for byte in size.
    code, o, e = run([args.app, "--quiet", "--out", out, "--overwrite", "--unit-mb", "1024", "--glob",
                      os.path.join(relay, "anchor-*.safetensors")])
    expect(code == 0, f"pulse-measure one unit on anchors: exit {code}: {e.strip()[-500:]}")
    if code == 0:
        m, _, _ = read_h5(out)
        sizes = [os.path.getsize(os.path.join(relay, f"patch-{v - 1}-{v}.pulse")) for v in range(1, steps + 1)]
        expect(list(m["steps/patch_bytes"]) == sizes, f"anchors: patch_bytes {list(m['steps/patch_bytes'])} vs {sizes}")


def check_schema(args, tmp):
    """The file of an np 2 run holds exactly the datasets `--print-schema` lists (the table in
    docs/pulse-measure.md), with their types, units, descriptions and shapes."""
    code, table, e = run([args.app, "--print-schema"])
    expect(code == 0, f"--print-schema: exit {code}: {e.strip()[-400:]}")
    rows = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        rows[cells[0].strip("`")] = cells[1:]
    with h5py.File(os.path.join(tmp, "np2.h5"), "r") as f:
        index = json.loads(f.attrs["datasets"])
        expect(sorted(index) == sorted(rows), f"schema: file {sorted(index)} vs --print-schema {sorted(rows)}")
        for path, (shape, dtype, units, what) in rows.items():
            if path not in index:
                continue
            expect(index[path]["units"] == units and what.startswith(index[path]["description"]),
                   f"schema: {path}: {index[path]} vs {units}, {what}")
            expect(f[path].dtype == np.dtype(dtype), f"schema: {path} is {f[path].dtype}, not {dtype}")
            width = {"(steps,)": None, "(steps, ranks)": 2, "(steps, tensors)": len(f.attrs["tensor_names"]),
                     "(steps, kinds)": len(f.attrs["kind_names"]), "(steps, k values)": 6}[shape]
            expect(f[path].shape[1:] == (() if width is None else (width,)), f"schema: {path}: {f[path].shape} vs {shape}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--app", required=True)
    parser.add_argument("--sync-app", required=True)
    parser.add_argument("--train-app", help="pulse-train: compare with its rows (needs --sft-app)")
    parser.add_argument("--sft-app")
    parser.add_argument("--mpiexec", required=True)
    parser.add_argument("--mpi-flags", default="")
    parser.add_argument("--analysis", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                                           "analysis"))
    args = parser.parse_args()
    mpi = [args.mpiexec] + shlex.split(args.mpi_flags)
    with tempfile.TemporaryDirectory() as tmp:
        check_bad_input(args, tmp)
        check_patch_bytes(args, tmp)
        check_compare_as(args, mpi, tmp)
        check_description_and_json(args, tmp)
        check_folder_filters(args, tmp)
        check_series(args, mpi, tmp)
        check_schema(args, tmp)
        if args.train_app:
            check_pulse_train(args, mpi, tmp)
    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
