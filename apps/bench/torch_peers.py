"""The PyTorch code a user would write for the same jobs as pulse's kernel benchmarks, timed on
one thread: the BF16 cast, torch.optim.AdamW(foreach=False) on FP32 and on BF16 parameters,
and the BF16 diff (count; mask / nonzero / gather) at 99% sparsity. Times are the process's CPU
time, as pulse-bench-kernels measures on one thread. Writes JSON.
    python3 torch_peers.py --sizes 16777216,268435456 --out torch.json
"""
import argparse
import json
import time

import torch


def best_time(fn, repeats, warmup=1):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return min(times)


def adamw(n, dtype, with_copy):
    p = torch.nn.Parameter((torch.rand(n) - 0.5).mul_(0.1).to(dtype))
    p.grad = (torch.rand(n) - 0.5).mul_(2e-3).to(dtype)
    opt = torch.optim.AdamW([p], lr=3e-6, weight_decay=0.01, foreach=False)
    if with_copy:  # the mixed-precision step also refreshes the BF16 copy the forward pass uses
        copy = torch.empty(n, dtype=torch.bfloat16)
        return lambda: (opt.step(), copy.copy_(p.detach()))
    return opt.step


def diff_inputs(n):
    before = ((torch.rand(n) - 0.5) * 0.1).to(torch.bfloat16)
    after = before.clone()
    flip = torch.rand(n) < 0.01
    after.view(torch.int16)[flip] ^= 1
    return before.view(torch.int16), after.view(torch.int16)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default=f"{1 << 24},{1 << 28}")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = []
    for n in (int(s) for s in args.sizes.split(",")):
        x = torch.rand(n)
        results.append({"kernel": "cast", "n": n, "seconds": best_time(lambda: x.to(torch.bfloat16), args.repeats)})
        del x
        results.append({"kernel": "adamw_mixed", "n": n,
                        "seconds": best_time(adamw(n, torch.float32, True), args.repeats)})
        results.append({"kernel": "adamw_fp32_step_only", "n": n,
                        "seconds": best_time(adamw(n, torch.float32, False), args.repeats)})
        results.append({"kernel": "adamw_bf16", "n": n,
                        "seconds": best_time(adamw(n, torch.bfloat16, False), args.repeats)})
        before, after = diff_inputs(n)
        results.append({"kernel": "diff_count", "n": n,
                        "seconds": best_time(lambda: int((before != after).sum()), args.repeats)})

        def compact():
            idx = (before != after).nonzero().squeeze(1)
            return idx, after[idx]
        results.append({"kernel": "diff_compact", "n": n, "seconds": best_time(compact, args.repeats)})
        del before, after
    json.dump({"torch_version": torch.__version__, "threads": torch.get_num_threads(), "results": results},
              open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
