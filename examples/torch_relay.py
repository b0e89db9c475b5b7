"""PULSESync from a PyTorch training loop, end to end on CPU.

A small model trains with AdamW (FP32 master weights, BF16 copy for inference). After every step
the trainer publishes the BF16 weights to a relay folder (pulse.Relay, a patch per version and an
anchor every 10) and a second process, the receiver, pulls each version and checks it bit for bit
against the weights the trainer saved with torch.save (independent of pulse). The trainer waits
for the receiver's acknowledgement, so every version is received. pulse.torch.SparsityRecorder
writes run.h5, and `python3 -m pulse_analysis report` makes the report from it.

    PYTHONPATH=build/python:analysis python3 examples/torch_relay.py --out runs/torch-relay
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

import torch

import pulse
import pulse.torch


def wait_for(path, version, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                if int(f.read() or -1) >= version:
                    return
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.005)
    sys.exit(f"torch_relay: timed out waiting for {what} {version}")


def write_atomically(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def receiver(out, steps):
    """Pulls every version from the relay and checks it against the trainer's own copy."""
    relay = pulse.Relay(os.path.join(out, "relay"))
    state, version, fast = None, 0, 0
    while version < steps:
        wait_for(os.path.join(out, "published"), version + 1, 120, "version")
        pulled = relay.pull(state, version)
        assert pulled.version == version + 1, (pulled.version, version)
        truth = torch.load(os.path.join(out, "truth.pt"))
        assert truth["version"] == pulled.version
        for name, t in truth["weights"].items():
            if not torch.equal(t.view(torch.int16), pulled.state[name].view(torch.int16)):
                sys.exit(f"torch_relay: version {pulled.version}, tensor {name} differs from the trainer's")
        state, version, fast = pulled.state, pulled.version, fast + pulled.fast_path
        write_atomically(os.path.join(out, "ack"), str(version))
    print(f"receiver: {steps} versions received bit-identical ({fast} by patch, {steps - fast} from anchors)")


def trainer(out, steps, lr):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Linear(128, 128),
                                torch.nn.GELU(), torch.nn.Linear(128, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    x, y = torch.randn(256, 32), torch.randn(256, 4)
    recorder = pulse.torch.SparsityRecorder(model, out=os.path.join(out, "run.h5"), optimizer=opt,
                                            absorption_every=5, overwrite=True)
    relay = pulse.Relay(os.path.join(out, "relay"))
    child = subprocess.Popen([sys.executable, __file__, "--receive", "--out", out, "--steps", str(steps)])
    previous = None
    try:
        for step in range(1, steps + 1):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            recorder.step(loss=loss.item())
            weights = {n: p.detach().to(torch.bfloat16) for n, p in model.named_parameters()}
            relay.publish(step, weights, previous, anchor_every=10)
            torch.save({"version": step, "weights": weights}, os.path.join(out, "truth.pt.tmp"))
            os.replace(os.path.join(out, "truth.pt.tmp"), os.path.join(out, "truth.pt"))
            write_atomically(os.path.join(out, "published"), str(step))
            wait_for(os.path.join(out, "ack"), step, 120, "acknowledgement of version")
            previous = weights
        recorder.close()
    finally:
        if child.wait(timeout=120) != 0:
            sys.exit("torch_relay: the receiver failed")
    report = subprocess.run([sys.executable, "-m", "pulse_analysis", "report", os.path.join(out, "run.h5"), "-o",
                             os.path.join(out, "report")], capture_output=True, text=True)
    if report.returncode != 0:
        sys.exit(f"torch_relay: pulse_analysis report failed: {report.stderr.strip()}")
    print(report.stdout.strip())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for the relay, run.h5 and the report")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--receive", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.receive:
        receiver(args.out, args.steps)
        return
    os.makedirs(args.out, exist_ok=True)
    shutil.rmtree(os.path.join(args.out, "relay"), ignore_errors=True)  # a new run starts at version 1
    for name in ("published", "ack"):
        if os.path.exists(os.path.join(args.out, name)):
            os.remove(os.path.join(args.out, name))
    trainer(args.out, args.steps, args.lr)


if __name__ == "__main__":
    main()
