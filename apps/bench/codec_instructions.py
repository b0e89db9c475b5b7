#!/usr/bin/env python3
"""Instructions per element of the codec's per-core loops (issue 30), counted by callgrind:
repeatable on a loaded machine, where wall and CPU times vary. Each loop runs as its
pulse-bench-sync BM_Core* benchmark at 2^18 elements, 1% changed, one thread; callgrind counts
only inside the timed call (toggle-collect), and the count is divided by the benchmark's
iterations and the elements.

  apps/bench/codec_instructions.py build/apps/bench/pulse-bench-sync
"""
import json
import os
import subprocess
import sys
import tempfile

ELEMENTS = 1 << 18
LOOPS = [  # name, benchmark, functions counted
    ("keydiff encode", f"BM_CoreEncode/{ELEMENTS}/990/0", ["pulse::sync::encode_patch*"]),
    ("expclass encode", f"BM_CoreEncode/{ELEMENTS}/990/2", ["pulse::sync::encode_patch*"]),
    ("keydiff apply", f"BM_CoreApply/{ELEMENTS}/990/0", ["pulse::sync::parse_patch*", "pulse::sync::apply_patch*"]),
    ("expclass apply", f"BM_CoreApply/{ELEMENTS}/990/2", ["pulse::sync::parse_patch*", "pulse::sync::apply_patch*"]),
    ("block digest of the target", f"BM_CoreBlockDigest/{ELEMENTS}", ["pulse::sync::tensor_digest*"]),
]


def count(binary, benchmark, functions):
    with tempfile.TemporaryDirectory() as tmp:
        out, result = os.path.join(tmp, "callgrind.out"), os.path.join(tmp, "result.json")
        command = ["valgrind", "--tool=callgrind", "--collect-atstart=no", f"--callgrind-out-file={out}"]
        command += [f"--toggle-collect={f}" for f in functions]
        command += [binary, f"--benchmark_filter=^{benchmark}$", "--benchmark_min_time=0",
                    f"--benchmark_out={result}", "--benchmark_out_format=json"]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(result) as f:
            iterations = json.load(f)["benchmarks"][0]["iterations"]
        with open(out) as f:
            totals = [line for line in f if line.startswith("totals:") or line.startswith("summary:")]
        return int(totals[-1].split()[1]) / iterations


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "build/apps/bench/pulse-bench-sync"
    print(f"{'loop':<28} {'instructions':>14} {'per element':>12}")
    for name, benchmark, functions in LOOPS:
        ir = count(binary, benchmark, functions)
        print(f"{name:<28} {ir:>14.0f} {ir / ELEMENTS:>12.2f}", flush=True)


if __name__ == "__main__":
    main()
