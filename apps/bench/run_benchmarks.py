"""make bench: runs pulse's kernel benchmarks and the PyTorch peers on this machine in one
invocation, writes both JSON files and prints bandwidth, each kernel's fraction of its bound and
speed-up. The kernels run on one core (taskset -c 1 where available): a one-thread figure in CPU
time, against limits the same process measures. Then a whole pulse-train step split into compute,
wait, measure, sync and statistics (bench_train_step.py).
    python3 run_benchmarks.py --build build --out runs/bench [--sizes 16777216]
With PULSE_BENCH_BIG=llama-7b (or qwen2-1.5b) in the environment it also runs
apps/bench/big_folder_bench.py on a generated folder pair of that layout (off by default).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

# pulse benchmark -> PyTorch peer (the staged AdamW steps also list their changes; PyTorch's do not)
PEERS = {"BM_CastToBf16": "cast", "BM_AdamWMixed": "adamw_mixed", "BM_AdamWBf16": "adamw_bf16",
         "BM_AdamWMixedStaged": "adamw_mixed", "BM_AdamWBf16Staged": "adamw_bf16",
         "BM_DiffCount": "diff_count", "BM_DiffCompact": "diff_compact"}
BOUNDS = ("copy", "read", "triad", "xxh3")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default="build")
    parser.add_argument("--out", default="runs/bench")
    parser.add_argument("--sizes", default=f"{1 << 24},{1 << 28}")
    parser.add_argument("--trace", action="append", default=[],
                        help="relay folder of a recorded run (pulse-train --relay DIR --anchor-every 1000 "
                             "--keep-anchors 1000): PULSESync sizes of its steps, every coding side by side")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    pulse_json, torch_json = os.path.join(args.out, "pulse.json"), os.path.join(args.out, "torch.json")
    size_filter = "|".join(str(s) for s in sizes)
    one_core = ["taskset", "-c", "1"] if shutil.which("taskset") and os.cpu_count() > 1 else []
    # one BLAS thread: the SGEMM limit is one core's, in CPU time
    one_blas_thread = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    subprocess.run(one_core + [os.path.join(args.build, "apps", "bench", "pulse-bench-kernels"),
                    f"--benchmark_filter=/({size_filter})/", "--benchmark_out=" + pulse_json,
                    "--benchmark_out_format=json"], check=True, env=one_blas_thread)
    subprocess.run(one_core + [sys.executable, os.path.join(os.path.dirname(__file__), "torch_peers.py"),
                    "--sizes", args.sizes, "--out", torch_json], check=True)
    sync_json, torch_sync_json = os.path.join(args.out, "pulse_sync.json"), os.path.join(args.out, "torch_sync.json")
    subprocess.run([os.path.join(args.build, "apps", "bench", "pulse-bench-sync"), "--benchmark_out=" + sync_json,
                    "--benchmark_out_format=json"] + ["--trace=" + t for t in args.trace], check=True)
    subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "torch_sync_peer.py"),
                    "--elements", str(1 << 28), "--out", torch_sync_json], check=True)
    ours = json.load(open(pulse_json))
    theirs = {(r["kernel"], r["n"]): r["seconds"] for r in json.load(open(torch_json))["results"]}
    context = ours["context"]
    print(f"\nLimits (this binary, {context['clock']} time): " +
          ", ".join(f"{b} {float(context[b + '_bytes_per_second']) / 1e9:.2f} GB/s" for b in BOUNDS) +
          f", SGEMM {float(context['sgemm_flops_per_second']) / 1e9:.1f} GFLOP/s")
    print(f"{'kernel':<20}{'elements':>11}{'ms':>10}{'GB/s':>8}{'fraction':>9} {'of':<6}{'torch ms':>10}{'speed-up':>9}")
    for b in ours["benchmarks"]:
        name, n = b["name"].split("/")[0], int(b["name"].split("/")[1])
        ms = b["real_time"] if b["time_unit"] == "ms" else b["real_time"] / 1e6
        peer = theirs.get((PEERS.get(name), n))
        line = f"{name:<20}{n:>11}{ms:>10.2f}{b['bytes_per_second'] / 1e9:>8.2f}{b['fraction']:>9.2f} {b['label'][3:]:<6}"
        if peer:
            line += f"{peer * 1e3:>10.2f}{peer * 1e3 / ms:>8.1f}x"
        print(line)
    print_sync(json.load(open(sync_json)), json.load(open(torch_sync_json)))
    # a whole pulse-train step (tiny, small), split, with MFU against this machine's SGEMM
    subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "bench_train_step.py"),
                    "--build", args.build, "--out", args.out], check=True)
    # import pulse beside the C++ library and the torch format (when the module was built)
    module_dir = os.path.join(args.build, "python")
    if os.path.isdir(os.path.join(module_dir, "pulse")):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([module_dir, os.environ.get("PYTHONPATH", "")]))
        subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "python_sync_bench.py"),
                        "--app", os.path.join(args.build, "apps", "pulse-sync"),
                        "--out", os.path.join(args.out, "python_sync.json")], check=True, env=env)
        # the PyTorch recorder's time per step against the step it records
        subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "bench_recorder.py"),
                        "--json", os.path.join(args.out, "recorder.json")], check=True, env=env)
    # Optional (disk and time; off by default and in CI): pulse-sync against the prime-rl-format
    # peer on a big generated folder pair, PULSE_BENCH_BIG=llama-7b (about 36 min, 55 GB of disk) or
    # qwen2-1.5b (minutes, 13 GB); the table goes to runs/bench/big_folder.md.
    big = os.environ.get("PULSE_BENCH_BIG")
    if big:
        with open(os.path.join(args.out, "big_folder.json"), "w") as f:
            subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "big_folder_bench.py"),
                            "--app", os.path.join(args.build, "apps", "pulse-sync"), "--layout", big,
                            "--table", os.path.join(args.out, "big_folder.md")], check=True, stdout=f)


def print_sync(ours, theirs):
    by_name = {b["name"].split("/manual_time")[0].split("/iterations")[0]: b for b in ours["benchmarks"]}
    print("\nPULSESync, bits per changed element (16M elements):")
    for s in (990, 999):
        b = by_name[f"BM_PatchSize/{s}"]
        print(f"  sparsity {b['sparsity']:.4f}: dense BF16 {b['bits_dense_bf16']:.0f}, dense+zstd-1 "
              f"{b['bits_dense_bf16_zstd1']:.0f}, paper format {b['bits_paper_format']:.2f}, pulse raw values "
              f"{b['bits_pulse_raw_values']:.2f}, pulse default {b['bits_pulse_default']:.2f} "
              f"({b['paper_over_default']:.2f}x smaller than the paper's, {b['dense_over_default']:.0f}x than dense)")
        print(f"    expclass {b['bits_pulse_expclass']:.2f} ({b['paper_over_expclass']:.2f}x smaller than the paper's, "
              f"{b['dense_over_expclass']:.0f}x than dense); entropy given the exponent class "
              f"{b['bits_entropy_exponent_class']:.2f}, without context {b['bits_entropy_no_context']:.2f} "
              f"(expclass {b['expclass_over_entropy']:.2f}x the entropy)")
    for name, b in by_name.items():
        if name.startswith("BM_Trace/"):
            print(f"  trace {name[9:]} ({b['steps']:.0f} steps, {b['changes_per_step']:.0f} changes per step): paper format "
                  f"{b['bits_paper_format']:.2f}, pulse default {b['bits_pulse_default']:.2f}, expclass "
                  f"{b['bits_pulse_expclass']:.2f}, entropy {b['bits_entropy_exponent_class']:.2f} "
                  f"({b['expclass_over_entropy']:.2f}x); {b['dense_over_expclass']:.0f}x below dense BF16")
    print("PULSESync throughput, GB/s of BF16 weights (256M elements), against PyTorch + zstandard:")
    for s, t in zip((990, 999), theirs["results"]):
        enc, app = by_name[f"BM_Encode/{1 << 28}/{s}/0"], by_name[f"BM_Apply/{1 << 28}/{s}/0"]
        enc_x, app_x = by_name[f"BM_Encode/{1 << 28}/{s}/2"], by_name[f"BM_Apply/{1 << 28}/{s}/2"]
        gb = 2 * t["elements"] / 1e9
        ours_s = enc["real_time"] / 1e3 + app["real_time"] / 1e3
        theirs_s = t["encode_seconds"] + t["apply_seconds"]
        print(f"  sparsity {t['sparsity']:.4f}: encode {enc['bytes_per_second'] / 1e9:.2f} (PyTorch {gb / t['encode_seconds']:.2f}), "
              f"apply {app['bytes_per_second'] / 1e9:.2f} (PyTorch {gb / max(t['apply_seconds'], 1e-9):.2f}), "
              f"end to end {theirs_s / ours_s:.1f}x PyTorch; expclass encode {enc_x['bytes_per_second'] / 1e9:.2f}, "
              f"apply {app_x['bytes_per_second'] / 1e9:.2f}")


if __name__ == "__main__":
    main()
