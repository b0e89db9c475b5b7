"""CPU seconds of the Python Sender and Receiver at one thread (resource.getrusage, so a busy
machine's wall clock does not count), on a numpy-made Hugging Face folder pair
(tests/apps/llama_folder.py: real tensor names and shapes, BF16, 1% of the elements moved), best
of --repeats, each on a freshly loaded state:
  pulse.apply                      Receiver built over the state and applied at once (one hash)
  Receiver.apply                   steady state: the state hashed again first (another writer?)
  Receiver.apply_without_rehash    the same apply without that hash (what the check costs)
  Sender.patch copy=True / copy=compressed, and building Sender(copy="compressed")
Prints one JSON object.
    PYTHONPATH=build/python python3 apps/bench/python_sync_cpu.py --layout small
"""
import argparse
import json
import os
import resource
import shutil
import sys
import tempfile

import torch  # noqa: F401  (states as torch tensors)

import pulse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "apps"))
import llama_folder  # noqa: E402


def cpu_seconds(fn):
    def now():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime
    t = now()
    fn()
    return now() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layout", default="small", choices=sorted(llama_folder.LAYOUTS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", help="where the temporary folder pair goes")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="pulse-sync-cpu-", dir=args.dir)
    try:
        base, target = os.path.join(work, "base"), os.path.join(work, "target")
        llama_folder.write_pair(base, target, args.layout)
        new = pulse.load(target, framework="torch")
        patch = pulse.encode(pulse.load(base, framework="torch"), new, base_version=0, target_version=1, threads=1)

        def best(run):
            return round(min(run(pulse.load(base, framework="torch")) for _ in range(args.repeats)), 3)

        def sender_patch(copy):
            def run(state):
                sender = pulse.Sender(state, copy=copy, threads=1)
                for name in state:
                    state[name].copy_(new[name])  # the step, in place
                return cpu_seconds(sender.patch)
            return run

        r = {"layout": args.layout, "model_bytes": sum(t.numel() * t.element_size() for t in new.values()),
             "patch_bytes": len(patch), "threads": 1,
             "pulse.apply": best(lambda s: cpu_seconds(lambda: pulse.apply(s, patch, threads=1))),
             "Receiver.apply": best(lambda s: (lambda rc: cpu_seconds(lambda: rc.apply(patch)))(
                 pulse.Receiver(s, threads=1))),
             "Receiver.apply_without_rehash": best(lambda s: (lambda rc: cpu_seconds(
                 lambda: rc._apply(patch, None, rehash=False)))(pulse.Receiver(s, threads=1))),
             "Sender.patch copy=True": best(sender_patch(True)),
             "Sender.patch copy=compressed": best(sender_patch("compressed")),
             "Sender(copy=compressed)": best(lambda s: cpu_seconds(lambda: pulse.Sender(s, copy="compressed", threads=1)))}
        r["kept_bytes_compressed / model"] = round(pulse.Sender(new, copy="compressed").kept_bytes / r["model_bytes"], 4)
        print(json.dumps(r, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
