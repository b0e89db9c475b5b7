"""Peak resident memory of the Python Sender and Receiver on a model-sized state (issue 26: at
most 2x the model): a numpy-made Hugging Face folder pair (tests/apps/llama_folder.py: real
tensor names and shapes, BF16, 1% of the elements moved) in a temporary folder, deleted after.
Each role runs in its own fresh process (tests/apps/peak_rss.py), as a trainer or an inference
server would:
  sender:   state = pulse.load(base) (torch); Sender(state); the target's values read into
            the state tensor by tensor (the optimizer step, in place); patch()
  sender_compressed: the same with Sender(state, copy="compressed") (the version sent kept
            compressed)
  sender_loads[_reference]: Sender(pulse.load(base)[, copy=False]); patch(pulse.load(target)):
            each version made as new tensors (copy=False: the Sender holds the version sent
            by reference instead of copying it)
  receiver: state = pulse.load(base); Receiver(state); apply(patch); digest checked
  decode:   pulse.decode(patch, pulse.load(base)); every change counted
Prints one JSON object: model bytes, the interpreter's own peak (a process that only imports torch
and pulse) and, per role, peak RSS (GiB, x the model, and x the model beyond the interpreter's
peak: what the role itself holds), wall seconds.
    PYTHONPATH=build/python python3 tests/python/sync_memory.py --layout qwen2-1.5b [--dir D]
"""
import argparse
import json
import os
import shutil
import struct
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "apps"))
import llama_folder  # noqa: E402
import peak_rss  # noqa: E402

GiB = 1 << 30


def folder_tensors(folder):
    """{name: (file, offset, dtype, shape)} of a model folder's shards, read from their headers."""
    out = {}
    for file in sorted(f for f in os.listdir(folder) if f.endswith(".safetensors")):
        path = os.path.join(folder, file)
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        for name, t in header.items():
            if name != "__metadata__":
                out[name] = (path, 8 + n + t["data_offsets"][0], t["dtype"], tuple(t["shape"]))
    return out


def role_sender(base, target, patch_path, values, copy=True):
    import numpy as np
    import torch
    import pulse
    state = pulse.load(base, framework="torch")
    sender = pulse.Sender(state, values=values, copy=copy)
    for name, (path, offset, dtype, shape) in folder_tensors(target).items():  # read into the tensor: no copy
        assert dtype == "BF16"
        with open(path, "rb") as f:
            f.seek(offset)
            assert f.readinto(state[name].view(torch.int16).numpy().view(np.uint8).reshape(-1)) == 2 * int(np.prod(shape))
    patch = sender.patch()
    with open(patch_path, "wb") as f:
        f.write(patch)


def role_sender_loads(base, target, patch_path, values, copy):
    """A trainer that makes each version as new tensors (here: loads it) and hands it to patch()."""
    import pulse
    state = pulse.load(base, framework="torch")
    sender = pulse.Sender(state, values=values, **({"copy": False} if copy == "reference" else {}))
    del state
    sender.state = pulse.load(target, framework="torch")  # patch(new_state) says the same
    patch = sender.patch()
    with open(patch_path, "wb") as f:
        f.write(patch)


def role_receiver(base, patch_path, values):
    import pulse
    state = pulse.load(base, framework="torch")
    receiver = pulse.Receiver(state)
    with open(patch_path, "rb") as f:
        patch = f.read()
    receiver.apply(patch)
    assert pulse.digest(state) == pulse.inspect(patch)["target_state"]


def role_decode(base, patch_path, values):
    import pulse
    with open(patch_path, "rb") as f:
        patch = f.read()
    decoded = pulse.decode(patch, pulse.load(base, framework="torch"))
    assert sum(len(c.indices) for c in decoded.changes.values()) == pulse.inspect(patch)["total_changed"]


ROLES = {"sender": role_sender, "sender_compressed": lambda *a: role_sender(*a, copy="compressed"),
         "receiver": role_receiver, "decode": role_decode,
         "sender_loads": lambda *a: role_sender_loads(*a, "copy"),
         "sender_loads_reference": lambda *a: role_sender_loads(*a, "reference")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layout", default="qwen2-1.5b", choices=sorted(llama_folder.LAYOUTS))
    ap.add_argument("--dir", help="where the temporary folder pair goes (default: the system's temp folder)")
    ap.add_argument("--values", default="keydiff")
    ap.add_argument("--roles", default="sender,sender_compressed,sender_loads,sender_loads_reference,receiver,decode")
    ap.add_argument("--role", help=argparse.SUPPRESS)
    ap.add_argument("args", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:
        ROLES[args.role](*args.args, args.values)
        return
    work = tempfile.mkdtemp(prefix="pulse-sync-memory-", dir=args.dir)
    try:
        base, target, patch = (os.path.join(work, n) for n in ("base", "target", "step.pulse"))
        model_bytes, changed, largest = llama_folder.write_pair(base, target, args.layout)
        result = {"layout": args.layout, "values": args.values, "model_gib": round(model_bytes / GiB, 3),
                  "changed": changed, "largest_tensor_gib": round(largest / GiB, 3)}
        interpreter = peak_rss.run([sys.executable, "-c", "import torch, pulse"])[3]
        result["interpreter_gib"] = round(interpreter / GiB, 3)
        for role in args.roles.split(","):
            extra = [base, target, patch] if role.startswith("sender") else [base, patch]
            t0 = time.perf_counter()
            rc, out, err, peak, cpu = peak_rss.run([sys.executable, os.path.abspath(__file__), "--values", args.values,
                                                    "--role", role, *extra])
            r = {"rc": rc, "wall_s": round(time.perf_counter() - t0, 2), "cpu_s": round(cpu, 2),
                 "peak_rss_gib": round(peak / GiB, 3), "x_model": round(peak / model_bytes, 2),
                 "x_model_beyond_interpreter": round((peak - interpreter) / model_bytes, 3)}
            if rc != 0:
                r["error"] = err.strip()[-400:]
            if role.startswith("sender") and rc == 0:
                r["patch_bytes"] = os.path.getsize(patch)
            result[role] = r
            print(role, r, file=sys.stderr, flush=True)
        print(json.dumps(result, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
