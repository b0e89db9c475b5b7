"""A whole pulse-train step, split into compute, wait, measure, sync and statistics, with MFU
against this machine's SGEMM measured in the same run (pulse-bench-model's BM_Sgemm, 1024^3,
OpenBLAS on every core, and on one; the best of OpenBLAS's own kernel pick and the kernel sets the
CPU's flags allow). Every figure comes from the statistics file's columns.
    python3 bench_train_step.py --build build --out runs/bench [--presets tiny,small] [--steps 30]

Each preset runs under `mpirun -n 2` (one trainer, one inference rank) from an SFT warm start (--sft-steps,
made once per preset into --out; 0: GPT-2 init, where GRPO earns no reward for many steps), with
the embedded default's batch (jobs/configs/default.toml), in three settings:
  before    async-lag 0, MPI waits spin (PULSE_MPI_WAIT=spin), PULSE_GENERATE_AHEAD=0: the trainer
            and the inference rank strictly in turn, each spinning while the other computes
  lockstep  async-lag 0, waits sleep: the same algorithm and weights, the waiting core freed, and
            the inference rank sampling the next rollouts as soon as the step's patch is in
  overlap   async-lag 1, waits sleep: the inference rank samples step t+1's rollouts while the
            trainer trains step t (another algorithm: rollouts one version older)
Per setting, over the steps after --warmup (medians of per-step values: robust to a loaded
machine's preemptions; the flushes every 100 rows or 10 s show in the JSON's write_max_s):
  step      wall seconds from one step's end to the next (/steps/time_s)
  compute   the rest of the step on trainer 0
  wait      trainer 0's seconds in collective calls (/ranks/wait_s; the patch send included)
  measure   /steps/measure_s; sync: /steps/encode_s (the send is in wait); sync_s: /steps/sync_s,
            trainer 0's PULSESync outside collective calls (waiting for the inference rank is in wait)
  stats     /steps/write_s of the next row (the append once every rank is there)
  overhead  (measure_s + sync_s + write_s) / step: the measurement, PULSESync and statistics share
            of trainer 0's time;
  path      the same with only the part of measure_s that outlasts the inference rank's apply
            (/steps/apply_s), during which trainer 0 measures: the share that lengthens the step;
            ovh_sum: the same over the sums of all those steps (the median step of a run whose
            weights change only in its later steps, as tiny's from GPT-2 init, codes no change)
  mfu       training model FLOPs (6 P tokens + 12 L C T tokens, PaLM appendix B; every position
            of every row) per step second over the SGEMM peak of all cores; mfu_gen adds the
            sampling's forward FLOPs (a third of training's)
  cpu       per rank, CPU seconds over step seconds (/ranks/cpu_s); busy: the share of that CPU
            spent in collective calls (/ranks/wait_cpu_s / cpu_s): polling, not computing; held:
            CPU seconds per second of waiting (wait_cpu_s / wait_s), 1 for a spin on an idle core
Wall figures need idle cores; on a loaded machine read cpu and busy.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tomllib

import h5py
import numpy as np

SETTINGS = {
    "before": ({"PULSE_MPI_WAIT": "spin", "PULSE_GENERATE_AHEAD": "0"}, ["--async-lag", "0"]),
    "lockstep": ({"PULSE_MPI_WAIT": "sleep"}, ["--async-lag", "0"]),
    "overlap": ({"PULSE_MPI_WAIT": "sleep"}, ["--async-lag", "1"]),
}


def core_types():
    """OpenBLAS kernel sets this CPU runs: its own pick, and those its flags allow (OpenBLAS 0.3.21
    takes CPUs newer than it knows, e.g. Sapphire Rapids, for Prescott: SSE3 kernels at a quarter
    of the speed, so its pick alone understates the peak)."""
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    types = [None]
    if {"avx2", "fma"} <= flags:
        types.append("Haswell")
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        types.append("SkylakeX")
    return types


def sgemm_peak(build, threads):
    """BM_Sgemm's FLOP/s with `threads` OpenBLAS threads, the best of the kernel sets this CPU runs."""
    best = 0.0
    for core_type in core_types():
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads))
        env.pop("OPENBLAS_CORETYPE", None)
        if core_type:
            env["OPENBLAS_CORETYPE"] = core_type
        out = subprocess.run([os.path.join(build, "apps", "bench", "pulse-bench-model"), "--benchmark_filter=^BM_Sgemm",
                              "--benchmark_repetitions=5", "--benchmark_format=json"],
                             check=True, capture_output=True, text=True, env=env).stdout
        runs = [b for b in json.loads(out)["benchmarks"] if b.get("run_type") == "iteration"]
        best = max([best] + [b["flops_per_second"] for b in runs])
    return best


def run_train(build, mpiexec, preset, setting, steps, out, init, sft_steps):
    env_extra, flags = SETTINGS[setting]
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cmd = (mpiexec + ["-n", "2", os.path.join(build, "apps", "pulse-train"),
                      "--config", os.path.join(repo, "jobs", "configs", "default.toml"), "--model", preset,
                      "--init", init, "--sft-steps", str(sft_steps), "--steps", str(steps), "--eval-every", "0",
                      "--absorption-every", "0", "--checkpoint-every", "0", "--quiet", "--out", out, "--overwrite"]
           + flags)
    load = os.getloadavg()[0]
    subprocess.run(cmd, check=True, env=dict(os.environ, **env_extra), stdout=subprocess.DEVNULL)
    return load, " ".join(f"{k}={v}" for k, v in env_extra.items()) + " " + shlex.join(cmd)


def model_flops(f):
    """Training model FLOPs of one step: 6 P tokens + 12 L C T tokens over every position of every row."""
    config = tomllib.loads(f.attrs["config"])
    names = [str(n) for n in f.attrs["tensor_names"]]
    numel = dict(zip(names, f.attrs["tensor_numel"]))
    layers = sum(n.endswith("ln1.weight") for n in names)
    channels = float(numel["ln_f.weight"])
    T = int(f.attrs["seq_len"])
    tokens = float(config["prompts-per-step"] * config["group-size"] * T)
    return 6.0 * float(f.attrs["num_parameters"]) * tokens + 12.0 * layers * channels * T * tokens


def summarise(path, warmup, peak):
    with h5py.File(path, "r") as f:
        s, r = f["steps"], f["ranks"]
        time_s = s["time_s"][:]
        step = np.diff(time_s)[warmup:]  # row i+1's step, from row i's end
        rows = slice(warmup + 1, len(time_s) - 1)  # rows whose next row holds their write_s
        pick = lambda a: np.asarray(a)[rows]
        write = s["write_s"][:][warmup + 2:]
        n = min(len(step) - 1, len(write))
        step, write = step[:n], write[:n]
        wait = pick(r["wait_s"][:, 0])[:n]
        measure, encode, sync = pick(s["measure_s"][:])[:n], pick(s["encode_s"][:])[:n], pick(s["sync_s"][:])[:n]
        apply = pick(s["apply_s"][:])[:n]
        compute = step - wait - measure - encode - write
        flops = model_flops(f)
        cpu = r["cpu_s"][rows][:n]
        wait_cpu = r["wait_cpu_s"][rows][:n]
        wait_all = r["wait_s"][rows][:n]
        med = lambda a: float(np.median(a))
        T = med(step)
        return {
            "step_s": T,
            "share": {"compute": med(compute) / T, "wait": med(wait) / T, "measure": med(measure) / T,
                      "sync": med(encode) / T, "stats": med(write) / T},
            "overhead": med(measure + sync + write) / T,
            "overhead_of_sums": float((measure + sync + write).sum() / step.sum()),
            "overhead_on_path": med(np.maximum(measure - apply, 0) + sync + write) / T,
            "write_max_s": float(write.max()),
            "mfu": flops / T / peak, "mfu_gen": flops * 4 / 3 / T / peak,
            "cpu_share": (cpu.sum(axis=0) / step.sum()).tolist(),
            "busy_wait": (wait_cpu.sum(axis=0) / np.maximum(cpu.sum(axis=0), 1e-12)).tolist(),
            "wait_cpu_per_wait_s": (wait_cpu.sum(axis=0) / np.maximum(wait_all.sum(axis=0), 1e-12)).tolist(),
            "steps": int(n),
        }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build")
    parser.add_argument("--out", default="runs/bench")
    parser.add_argument("--presets", default="tiny,small")
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--sft-steps", type=int, default=300,
                        help="warm start: the preset's SFT weights after this many steps (made once into --out, "
                             "then reused), so that GRPO's weights change from the first step; 0: GPT-2 init")
    parser.add_argument("--mpiexec", default="mpirun --oversubscribe" + (" --allow-run-as-root" if os.geteuid() == 0 else ""))
    args = parser.parse_args()
    if args.steps < args.warmup + 3:  # the medians need rows after the warm-up and their next rows
        parser.error(f"--steps {args.steps}: at least --warmup + 3 = {args.warmup + 3}")
    os.makedirs(args.out, exist_ok=True)
    cores = os.cpu_count()
    peak = sgemm_peak(args.build, cores)
    peak_one = sgemm_peak(args.build, 1)
    print(f"\npulse-train step: SGEMM 1024^3 {peak / 1e9:.1f} GFLOP/s on {cores} cores, {peak_one / 1e9:.1f} on one")
    print(f"{'preset':<7}{'setting':<10}{'load':>6}{'step ms':>9}{'compute':>8}{'wait':>6}{'measure':>8}{'sync':>6}"
          f"{'stats':>6}{'overhd':>7}{'ovh_sum':>8}{'path':>6}{'mfu':>7}{'mfu_gen':>8}   cpu/step (busy, held) trainer; inference")
    results = {"sgemm_flops_per_second": peak, "sgemm_one_core_flops_per_second": peak_one, "cores": cores, "runs": []}
    for preset in args.presets.split(","):
        for setting in args.settings.split(","):
            path = os.path.join(args.out, f"train_step_{preset}_{setting}.h5")
            init = os.path.abspath(os.path.join(args.out, f"sft-{preset}-{args.sft_steps}.safetensors")) if args.sft_steps else ""
            load, command = run_train(args.build, shlex.split(args.mpiexec), preset, setting, args.steps, path, init,
                                      args.sft_steps)
            r = dict(summarise(path, args.warmup, peak), preset=preset, setting=setting, load=load, command=command)
            results["runs"].append(r)
            sh = r["share"]
            ranks = "; ".join(f"{c:.2f} ({b:.2f}, {h:.2f})"
                              for c, b, h in zip(r["cpu_share"], r["busy_wait"], r["wait_cpu_per_wait_s"]))
            print(f"{preset:<7}{setting:<10}{load:>6.1f}{r['step_s'] * 1e3:>9.1f}{sh['compute']:>8.3f}{sh['wait']:>6.3f}"
                  f"{sh['measure']:>8.3f}{sh['sync']:>6.3f}{sh['stats']:>6.3f}{r['overhead']:>7.3f}{r['overhead_of_sums']:>8.3f}{r['overhead_on_path']:>6.3f}{r['mfu']:>7.3f}"
                  f"{r['mfu_gen']:>8.3f}   {ranks}", flush=True)
    with open(os.path.join(args.out, "train_step.json"), "w") as fh:
        json.dump(results, fh, indent=1)


if __name__ == "__main__":
    sys.exit(main())
