"""pulse-sync on a Hugging Face model folder at a Llama-like scale: a base folder (2 shards,
index, config.json, generation_config.json, tokenizer.json, tokenizer_config.json, a binary
tokenizer.model) made with torch, and a target with a fraction of every floating tensor moved by
one ulp, a metadata change, an added tensor, a changed config.json and 3 shards. It runs
`pulse-sync encode` and `apply --in-place` onto a copy of the base, checks with the pure-Python
reader of tests/apps/hf_folder_ref.py that every tensor, shard metadata entry and other file
equals the target's, and prints one JSON object: elements per dtype, changes, patch bytes, bits
per change, and the wall times of encode and apply (whole commands: reading, hashing, writing).
    python3 apps/bench/folder_sync_bench.py --app build/apps/pulse-sync [--hidden 512 --layers 3]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "apps"))
import hf_folder_ref as hf  # noqa: E402


def timed(*cmd):
    t0 = time.perf_counter()
    r = subprocess.run([*map(str, cmd)], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))}: {r.stderr}")
    return time.perf_counter() - t0, r.stdout


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--app", required=True)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--intermediate", type=int, default=1408)
    parser.add_argument("--fraction", type=float, default=0.01)
    parser.add_argument("--repeats", type=int, default=3, help="runs of encode and apply; the best time is reported")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        p = lambda name: os.path.join(d, name)
        base = hf.llama_state(args.hidden, args.layers, args.vocab, args.intermediate, seed=1)
        files = hf.model_files(args.hidden, args.layers, args.vocab, seed=2)
        hf.write_folder(p("base"), base, 2, {"format": "pt"}, files)
        target, changed = hf.one_ulp(base, args.fraction, seed=3)
        target["model.layers.0.self_attn.q_norm.weight"] = torch.ones(args.hidden, dtype=torch.bfloat16)
        config = json.loads(files["config.json"])
        config["rope_theta"] = 500000.0
        hf.write_folder(p("target"), target, 3, {"format": "pt", "step": "1"},
                        {**files, "config.json": json.dumps(config, indent=2).encode()})
        elements = {}
        for t in base.values():
            dtype = hf.DTYPE_OF[t.dtype]
            elements[dtype] = elements.get(dtype, 0) + t.numel()
        encode_s, apply_s = [], []
        for _ in range(args.repeats):
            encode_s.append(timed(args.app, "encode", "--base", p("base"), "--target", p("target"), "-o", p("f.pulse"))[0])
            shutil.rmtree(p("work"), ignore_errors=True)
            shutil.copytree(p("base"), p("work"))
            apply_s.append(timed(args.app, "apply", "--in-place", p("work"), "--patch", p("f.pulse"))[0])
        identical = hf.read_folder(p("work")) == hf.read_folder(p("target"))
        inspect = json.loads(timed(args.app, "inspect", p("f.pulse"), "--json")[1])
        size = os.path.getsize(p("f.pulse"))
        dense = sum(os.path.getsize(os.path.join(p("target"), f)) for f in os.listdir(p("target")))
        result = {"elements": elements, "changed": changed, "patch_bytes": size, "bits_per_change": 8 * size / changed,
                  "target_folder_bytes": dense, "smaller_than_folder": dense / size,
                  "whole_bytes": {s["dtype"]: s["whole_bytes"] for s in inspect["summary"] if s["whole_bytes"]},
                  "table_bytes": inspect["table_bytes"], "encode_seconds": min(encode_s), "apply_seconds": min(apply_s),
                  "byte_identical": identical}
        print(json.dumps(result, indent=1))
        if not identical:
            sys.exit("the applied folder differs from the target")


if __name__ == "__main__":
    main()
