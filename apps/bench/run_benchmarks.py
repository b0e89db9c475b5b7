"""make bench: runs pulse's kernel benchmarks and the PyTorch peers on this machine in one
invocation, writes both JSON files and prints bandwidth, triad fraction and speed-up.
    python3 run_benchmarks.py --build build --out runs/bench [--sizes 16777216]
"""
import argparse
import json
import os
import subprocess
import sys

# pulse benchmark -> PyTorch peer
PEERS = {"BM_CastToBf16": "cast", "BM_AdamWMixed": "adamw_mixed", "BM_AdamWBf16": "adamw_bf16",
         "BM_DiffCount": "diff_count", "BM_DiffCompact": "diff_compact", "BM_Triad": None}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default="build")
    parser.add_argument("--out", default="runs/bench")
    parser.add_argument("--sizes", default=f"{1 << 24},{1 << 28}")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    pulse_json, torch_json = os.path.join(args.out, "pulse.json"), os.path.join(args.out, "torch.json")
    size_filter = "|".join(str(s) for s in sizes)
    subprocess.run([os.path.join(args.build, "apps", "bench", "pulse-bench-kernels"),
                    f"--benchmark_filter=/({size_filter})/", "--benchmark_out=" + pulse_json,
                    "--benchmark_out_format=json"], check=True)
    subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "torch_peers.py"),
                    "--sizes", args.sizes, "--out", torch_json], check=True)
    ours = json.load(open(pulse_json))
    theirs = {(r["kernel"], r["n"]): r["seconds"] for r in json.load(open(torch_json))["results"]}
    triad = float(ours["context"]["triad_bytes_per_second"])
    print(f"\nSTREAM triad (this binary): {triad / 1e9:.2f} GB/s")
    print(f"{'kernel':<16}{'elements':>11}{'ms':>10}{'GB/s':>8}{'triad':>7}{'torch ms':>10}{'speed-up':>9}")
    for b in ours["benchmarks"]:
        name, n = b["name"].split("/")[0], int(b["name"].split("/")[1])
        ms = b["real_time"] if b["time_unit"] == "ms" else b["real_time"] / 1e6
        peer = theirs.get((PEERS.get(name), n))
        line = f"{name:<16}{n:>11}{ms:>10.2f}{b['bytes_per_second'] / 1e9:>8.2f}{b['triad_fraction']:>7.2f}"
        if peer:
            line += f"{peer * 1e3:>10.2f}{peer * 1e3 / ms:>8.1f}x"
        print(line)


if __name__ == "__main__":
    main()
