"""pulse.torch.SparsityRecorder's time per step against the training step it records, on a
3.4M-parameter Llama-like model (RMSNorm, RoPE, SwiGLU MLP, untied head; d 256, 3 layers, FFN 688,
vocabulary 2048, batch 8 x 128 tokens) trained with torch.optim.AdamW, at the recorder's default
settings (k up to 32, Adam-ratio quantiles every step), in FP32 (mixed: the BF16 view of the FP32
weights) and in pure BF16. Per step: the training step (forward, backward, optimizer) and
recorder.step(), medians over the steps after --warmup, in wall time and in the process's CPU time
(all threads: steadier than wall time on a loaded machine). A training step with a recorder can
itself take longer than one without, so the recorder's cost is also measured as the overhead of
a step: the median of training step + recorder.step() against the median training step of the
same run without a recorder (the model, data and optimizer made again from the same seeds, run
after the recorded one in the same process). With the recorder's background measurement (its
default) most of its work runs during the next training step, so recorder.step() alone says
little and the overhead of a step is the figure; the recorder's own thread CPU time per part of
its work (cpu_seconds, where the recorder has it: the threads that called its C++ loops, not the
loops' other threads; all of it at --recorder-threads 1) is printed per step below each result line.
--background on|off and --recorder-threads N set the recorder's background= and threads=.
--interleave TURNS measures only the overhead of a step, steadier on a loaded machine: plain
training and the recorder with background on and off (and the --recorder file's) in turns of 6
steps in one process (a model each from the same seeds), medians of the steps after the first
turn but the first of each turn. Also:
the recorder's k-step history in bytes
(history_bytes(), where the recorder has it) and the process's peak RSS growth over the run (each
precision in a process of its own).
--recorder FILE loads another version of pulse/torch.py (e.g. `git show REV:python/pulse/torch.py`)
in place of the built one, for a before/after comparison in one environment. --checkpoints DIR
also saves the weights after each step as DIR/PRECISION/step-N.safetensors (as stored: FP32 for
mixed), the series pulse-measure reads.
    PYTHONPATH=build/python python3 apps/bench/bench_recorder.py [--steps 40] [--lr 1e-4]
        [--recorder OLD_torch.py] [--background on|off] [--recorder-threads N] [--checkpoints DIR]
        [--interleave TURNS] [--threads N] [--json runs/bench/recorder.json]
"""
import argparse
import importlib.util
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

import pulse


class RMSNorm(torch.nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps).to(x.dtype) * self.weight


def rope(x, base=10000.0):
    """Rotary position embedding over the last dimension (pairs of halves), x: (batch, heads, seq, dim)."""
    seq, dim = x.shape[-2], x.shape[-1]
    freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    angle = torch.arange(seq, dtype=torch.float32)[:, None] * freq[None, :]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    a, b = x[..., : dim // 2], x[..., dim // 2:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class Block(torch.nn.Module):
    def __init__(self, d, heads, ff):
        super().__init__()
        self.heads = heads
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(d), RMSNorm(d)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (torch.nn.Linear(d, d, bias=False) for _ in range(4))
        self.gate_proj, self.up_proj = torch.nn.Linear(d, ff, bias=False), torch.nn.Linear(d, ff, bias=False)
        self.down_proj = torch.nn.Linear(ff, d, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        h = self.input_layernorm(x)
        q, k, v = (proj(h).view(b, s, self.heads, d // self.heads).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        a = torch.nn.functional.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True) \
            if hasattr(torch.nn.functional, "scaled_dot_product_attention") else _attention(rope(q), rope(k), v)
        x = x + self.o_proj(a.transpose(1, 2).reshape(b, s, d))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(torch.nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))


def _attention(q, k, v):
    s = q.shape[-2]
    scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(torch.triu(torch.ones(s, s, dtype=torch.bool), 1), float("-inf"))
    return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v


class Llama(torch.nn.Module):
    def __init__(self, vocab=2048, d=256, layers=3, heads=4, ff=688):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(vocab, d)
        self.layers = torch.nn.ModuleList(Block(d, heads, ff) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.lm_head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def load_recorder(path):
    """pulse.torch, or the module at path loaded as a submodule of the built pulse package."""
    if path is None:
        import pulse.torch

        return pulse.torch
    spec = importlib.util.spec_from_file_location("pulse._bench_recorder", path)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "pulse"
    spec.loader.exec_module(module)
    return module


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def save_weights(model, folder, step):
    os.makedirs(folder, exist_ok=True)
    pulse.save({n: p.detach().clone() for n, p in model.named_parameters()}, os.path.join(folder, f"step-{step}.safetensors"))


def training(precision, steps, lr):
    """The model, its optimizer and the batches, from fixed seeds."""
    torch.manual_seed(0)
    model = Llama()
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    data = torch.randint(0, 2048, (steps, 8, 129), generator=torch.Generator().manual_seed(1))
    return model, opt, data


def train_step(model, opt, batch):
    logits = model(batch[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def bench(recorder_module, precision, steps, warmup, lr, out, checkpoints=None, options=None):
    model, opt, data = training(precision, steps, lr)
    params = sum(p.numel() for p in model.parameters())
    rss0 = peak_rss_bytes()
    rec = recorder_module.SparsityRecorder(model, out=out, optimizer=opt, overwrite=True, **(options or {}))
    train_s, record_s, train_cpu, record_cpu = [], [], [], []
    if checkpoints:
        save_weights(model, os.path.join(checkpoints, precision), 0)
    parts_at_warmup = {}
    for t in range(steps):
        if t == warmup and hasattr(rec, "cpu_seconds"):
            rec.flush()
            parts_at_warmup = dict(rec.cpu_seconds)
        c0, t0 = time.process_time(), time.perf_counter()
        loss = train_step(model, opt, data[t])
        c1, t1 = time.process_time(), time.perf_counter()
        rec.step(loss=loss.item())
        c2, t2 = time.process_time(), time.perf_counter()
        train_s.append(t1 - t0)
        record_s.append(t2 - t1)
        train_cpu.append(c1 - c0)
        record_cpu.append(c2 - c1)
        if checkpoints:
            save_weights(model, os.path.join(checkpoints, precision), t + 1)
    history = rec.history_bytes() if hasattr(rec, "history_bytes") else None
    rec.close()
    parts = {part: (cpu - parts_at_warmup.get(part, 0.0)) / (steps - warmup)
             for part, cpu in getattr(rec, "cpu_seconds", {}).items()}
    peak_growth = peak_rss_bytes() - rss0
    del rec, model, opt
    model, opt, data = training(precision, steps, lr)
    plain_s, plain_cpu = [], []
    for t in range(steps):
        c0, t0 = time.process_time(), time.perf_counter()
        train_step(model, opt, data[t])
        plain_s.append(time.perf_counter() - t0)
        plain_cpu.append(time.process_time() - c0)
    import h5py

    with h5py.File(out, "r") as f:
        sparsity = float(np.mean(f["steps/sparsity"][()]))
        k32 = f["kstep/sparsity"][()][:, -1]
    train, record = float(np.median(train_s[warmup:])), float(np.median(record_s[warmup:]))
    train_c, record_c = float(np.median(train_cpu[warmup:])), float(np.median(record_cpu[warmup:]))
    plain, plain_c = float(np.median(plain_s[warmup:])), float(np.median(plain_cpu[warmup:]))
    recorded = float(np.median(np.add(train_s, record_s)[warmup:]))
    recorded_c = float(np.median(np.add(train_cpu, record_cpu)[warmup:]))
    return {"precision": precision, "parameters": params, "steps": steps, "warmup": warmup, "lr": lr,
            "train_step_s": train, "record_step_s": record, "record_over_train": record / train,
            "train_step_cpu_s": train_c, "record_step_cpu_s": record_c, "record_over_train_cpu": record_c / train_c,
            "plain_step_s": plain, "plain_step_cpu_s": plain_c, "recorded_step_s": recorded,
            "recorded_step_cpu_s": recorded_c, "overhead": recorded / plain - 1, "overhead_cpu": recorded_c / plain_c - 1,
            "history_bytes": history, "peak_rss_growth_bytes": peak_growth, "recorder_cpu_s_per_step": parts,
            "mean_sparsity": sparsity, "k32_sparsity_last": float(k32[-1])}


def interleaved(recorders, precision, blocks, lr, tmp, block=6):
    """The overhead of a step of each recorder in `recorders` (name -> (module, options)) against
    plain training, all run in one process in turns of `block` steps (one model, optimizer and
    data each, from the same seeds), so that a change in the machine's load falls on each alike.
    The first step of each turn (it meets the last one's background work) and the first turn are
    left out. Returns name -> (wall, CPU) medians, "plain" included."""
    steps = blocks * block
    runs = {}
    for name, (module, options) in [("plain", (None, None))] + list(recorders.items()):
        model, opt, data = training(precision, steps, lr)
        rec = module.SparsityRecorder(model, out=os.path.join(tmp, f"{len(runs)}.h5"), optimizer=opt, overwrite=True,
                                      **options) if module else None
        runs[name] = {"model": model, "opt": opt, "data": data, "rec": rec, "wall": [], "cpu": []}
    for b in range(blocks):
        for r in runs.values():
            for i in range(block):
                c0, t0 = time.process_time(), time.perf_counter()
                loss = train_step(r["model"], r["opt"], r["data"][b * block + i])
                if r["rec"]:
                    r["rec"].step(loss=loss.item())
                if b > 0 and i > 0:
                    r["wall"].append(time.perf_counter() - t0)
                    r["cpu"].append(time.process_time() - c0)
            if hasattr(r["rec"], "flush"):
                r["rec"].flush()
    for r in runs.values():
        if r["rec"]:
            r["rec"].close()
    return {name: (float(np.median(r["wall"])), float(np.median(r["cpu"]))) for name, r in runs.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--precision", default="mixed,bf16")
    parser.add_argument("--recorder", help="another pulse/torch.py to load in place of the built one")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--checkpoints", help="save the weights after each step into this folder")
    parser.add_argument("--recorder-threads", type=int, help="the recorder's threads= (its default unless given)")
    parser.add_argument("--background", choices=("on", "off"), help="the recorder's background= (its default unless given)")
    parser.add_argument("--interleave", type=int, metavar="TURNS",
                        help="instead: plain training, the recorder with background on and off (and --recorder's) "
                             "in turns of 6 steps, TURNS turns each, in one process; the overhead of a step of each")
    parser.add_argument("--json", default=os.path.join("runs", "bench", "recorder.json"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.interleave:
        import pulse.torch

        recorders = {"background on": (pulse.torch, {"background": True}),
                     "background off": (pulse.torch, {"background": False})}
        if args.recorder:
            recorders[args.recorder] = (load_recorder(args.recorder), {})
        for precision in args.precision.split(","):
            with tempfile.TemporaryDirectory() as tmp:
                medians = interleaved(recorders, precision, args.interleave, args.lr, tmp)
            wall, cpu = medians.pop("plain")
            print(f"{precision}: plain step {1e3 * wall:.0f} ms ({1e3 * cpu:.0f} ms CPU), torch threads "
                  f"{torch.get_num_threads()}, load {os.getloadavg()[0]:.1f}")
            for name, (w, c) in medians.items():
                print(f"  {name}: overhead of a step {100 * (w / wall - 1):.1f}% (CPU time {100 * (c / cpu - 1):.1f}%)")
        return
    precisions = args.precision.split(",")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for precision in precisions:
            if len(precisions) > 1:  # a process each: the peak RSS of one run is not the other's
                child = os.path.join(tmp, f"{precision}.json")
                subprocess.run([sys.executable] + sys.argv + ["--precision", precision, "--json", child], check=True,
                               stdout=subprocess.DEVNULL)
                with open(child) as f:
                    r = json.load(f)["results"][0]
            else:
                options = {} if args.recorder_threads is None else {"threads": args.recorder_threads}
                if args.background:
                    options["background"] = args.background == "on"
                r = bench(load_recorder(args.recorder), precision, args.steps, args.warmup, args.lr,
                          os.path.join(tmp, f"{precision}.h5"), args.checkpoints, options)
            results.append(r)
            history = "-" if r["history_bytes"] is None else f"{r['history_bytes'] / 2**20:.1f} MiB"
            print(f"{precision:5s} {r['parameters'] / 1e6:.2f}M params: train step {1e3 * r['train_step_s']:.0f} ms, "
                  f"recorder {1e3 * r['record_step_s']:.1f} ms ({100 * r['record_over_train']:.1f}% of the step; "
                  f"CPU time {100 * r['record_over_train_cpu']:.1f}%); step without a recorder "
                  f"{1e3 * r['plain_step_s']:.0f} ms, with it (step + recorder) {1e3 * r['recorded_step_s']:.0f} ms: "
                  f"overhead {100 * r['overhead']:.1f}% (CPU time {100 * r['overhead_cpu']:.1f}%), "
                  f"history {history}, peak RSS +{r['peak_rss_growth_bytes'] / 2**20:.0f} MiB, "
                  f"mean sparsity {100 * r['mean_sparsity']:.2f}%")
            for part, cpu in r["recorder_cpu_s_per_step"].items():
                print(f"      {part}: {1e3 * cpu:.1f} ms CPU a step ({100 * cpu / r['plain_step_cpu_s']:.1f}% of the plain step's)")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"recorder": args.recorder or "pulse.torch (built)", "torch": torch.__version__,
                   "threads": torch.get_num_threads(), "machine": platform.machine(), "cpus": os.cpu_count(),
                   "load": os.getloadavg(), "results": results}, f, indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    sys.exit(main())
