"""import pulse against the C++ library and against the PyTorch peer, on one step, side by side:
the same 16M-element BF16 step (torch_sync_peer.make_step: weights ~ N(0, 0.02), updates scaled
for 99% sparsity) is encoded and applied by
  - pulse-sync (the C++ library; its printed encode and apply times time exactly the library calls),
  - pulse.encode + pulse.apply from Python (states read in place),
  - the int32 gaps + BF16 values + zstd-1 format written in torch (torch_sync_peer.encode / apply).
One thread everywhere (torch.set_num_threads(1); pulse's host kernels run serially here).
    PYTHONPATH=build/python python3 apps/bench/python_sync_bench.py --app build/apps/pulse-sync --out py.json
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import torch

import pulse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_sync_peer  # noqa: E402


def best_of(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def cli_seconds(cmd, pattern, repeats):
    best = float("inf")
    for _ in range(repeats):
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        best = min(best, float(re.search(pattern, out).group(1)))
    return best


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--app", required=True, help="pulse-sync binary")
    parser.add_argument("--elements", type=int, default=1 << 24)
    parser.add_argument("--sparsity", type=float, default=0.99)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--values", default="keydiff", choices=("keydiff", "raw", "expclass"),
                        help="pulse's value coding (expclass brings its own index coding)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    base_w, target_w = torch_sync_peer.make_step(args.elements, args.sparsity)
    base, target = {"weight": base_w}, {"weight": target_w}
    with tempfile.TemporaryDirectory() as d:
        a, b, p, o = (os.path.join(d, f) for f in ("a.safetensors", "b.safetensors", "p.patch", "o.safetensors"))
        pulse.save(base, a)
        pulse.save(target, b)
        cpp_encode = cli_seconds([args.app, "encode", "--base", a, "--target", b, "-o", p, "--values", args.values], r"encoded in ([0-9.]+) s",
                                 args.repeats)
        cpp_apply = cli_seconds([args.app, "apply", "--base", a, "--patch", p, "-o", o], r"in ([0-9.]+) s,",
                                args.repeats)
        cli_bytes = os.path.getsize(p)
    patch = pulse.encode(base, target, base_version=0, target_version=1, values=args.values)
    assert len(patch) == cli_bytes
    py_encode = best_of(lambda: pulse.encode(base, target, base_version=0, target_version=1, values=args.values), args.repeats)
    receivers = [{"weight": base_w.clone()} for _ in range(args.repeats)]
    py_apply = min(best_of(lambda r=r: pulse.apply(r, patch), 1) for r in receivers)
    assert torch.equal(receivers[0]["weight"].view(torch.int16), target_w.view(torch.int16))
    # steady state: Sender and Receiver keep the digests of the version they hold
    sender_s, receiver_s = [], []
    for _ in range(args.repeats):
        state = {"weight": base_w.clone()}
        sender = pulse.Sender(state, values=args.values)
        state["weight"] = target_w
        t0 = time.perf_counter()
        sender.patch()
        sender_s.append(time.perf_counter() - t0)
        receiver = pulse.Receiver({"weight": base_w.clone()})
        t0 = time.perf_counter()
        receiver.apply(patch)
        receiver_s.append(time.perf_counter() - t0)
    payload, count = torch_sync_peer.encode(base_w, target_w)
    torch_encode = best_of(lambda: torch_sync_peer.encode(base_w, target_w), args.repeats)
    held = base_w.clone()
    torch_sync_peer.apply(held, payload, count)
    assert torch.equal(held.view(torch.int16), target_w.view(torch.int16))
    torch_apply = best_of(lambda: torch_sync_peer.apply(held, payload, count), args.repeats)
    r = {"elements": args.elements, "values": args.values, "changed": count, "sparsity": 1 - count / args.elements,
         "cpp": {"encode_s": cpp_encode, "apply_s": cpp_apply, "bytes": cli_bytes},
         "python": {"encode_s": py_encode, "apply_s": py_apply, "bytes": len(patch)},
         "python_sender_receiver": {"encode_s": min(sender_s), "apply_s": min(receiver_s), "bytes": len(patch)},
         "torch_format": {"encode_s": torch_encode, "apply_s": torch_apply, "bytes": len(payload)}}
    r["python_overhead"] = (py_encode + py_apply) / (cpp_encode + cpp_apply) - 1
    r["bytes_ratio_vs_torch"] = len(payload) / len(patch)
    r["speedup_vs_torch"] = (torch_encode + torch_apply) / (py_encode + py_apply)
    r["speedup_vs_torch_sender_receiver"] = (torch_encode + torch_apply) / (min(sender_s) + min(receiver_s))
    json.dump(r, open(args.out, "w"), indent=1)
    print(f"\nimport pulse ({args.values}), one {args.elements}-element BF16 step at sparsity {r['sparsity']:.4f} ({count} changes):")
    print(f"  {'':<28}{'bytes':>10}{'bits/chg':>9}{'encode ms':>11}{'apply ms':>10}{'total ms':>10}")
    for name, key in (("pulse C++ (pulse-sync)", "cpp"), ("pulse from Python", "python"),
                      ("pulse.Sender / Receiver", "python_sender_receiver"),
                      ("torch int32+BF16+zstd-1", "torch_format")):
        x = r[key]
        print(f"  {name:<28}{x['bytes']:>10}{8 * x['bytes'] / count:>9.2f}{1e3 * x['encode_s']:>11.1f}"
              f"{1e3 * x['apply_s']:>10.1f}{1e3 * (x['encode_s'] + x['apply_s']):>10.1f}")
    print(f"  Python overhead over C++: {100 * r['python_overhead']:+.1f}% (target <= 10%); vs the torch format: "
          f"{r['bytes_ratio_vs_torch']:.2f}x fewer bytes (target >= 3x), {r['speedup_vs_torch']:.2f}x faster "
          f"encode + apply (target >= 3x); {r['speedup_vs_torch_sender_receiver']:.2f}x with Sender / Receiver "
          f"(digests kept between versions)")


if __name__ == "__main__":
    main()
