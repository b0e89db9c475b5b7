"""What the apps print. --json on the apps: one JSON object on the last line of stdout with the run's key results,
checked against what the run wrote (file sizes, sft_log.json, the patch), the lines before it
unchanged, errors included, and subcommands with a --json of their own left as they were.
pulse-train runs with a --config from another folder, so its output lands beside the config.
pulse-sync's human-readable lines say what they mean (larger than dense, bytes apart from elements).
    test_json_summary.py --pulse-version 0.1.0 --sync build/apps/pulse-sync --sft build/apps/pulse-sft
        --absorb build/apps/pulse-absorb --train build/apps/pulse-train --mpiexec mpiexec --mpi-flags="..."
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_ref  # noqa: E402

from expect import expect, failures  # noqa: E402


def run(cmd, cwd=None):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, cwd=cwd)


def summary(r, program, command=None):
    """The JSON object on the last stdout line, after checking the fields every summary has."""
    lines = r.stdout.splitlines()
    try:
        s = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        expect(False, f"{program} {command}: last stdout line is not JSON: {r.stdout[-300:]!r} {r.stderr}")
        return {}
    expect(s.get("program") == program and str(s.get("pulse_version")).startswith(PULSE_VERSION + " (git ") and s.get("exit_code") == r.returncode,
           f"{program}: program, pulse_version, exit_code in {s} (exit {r.returncode})")
    expect(s.get("command") == command, f"{program}: command {s.get('command')} != {command}")
    expect(isinstance(s.get("elapsed_s"), float) and s["elapsed_s"] >= 0, f"{program}: elapsed_s in {s}")
    expect(all(not line.startswith("{") for line in lines[:-1]), f"{program}: one JSON line only")
    return s


def folder_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def check_sync(app, d):
    rng = np.random.default_rng(3)
    a = rng.integers(0, 1 << 16, size=(64, 64), dtype=np.uint16)
    b = a.copy()
    b[rng.random(a.shape) < 0.05] += 1
    safetensors_ref.write(d / "a.safetensors", [("w", "BF16", a)])
    safetensors_ref.write(d / "b.safetensors", [("w", "BF16", b)])

    plain = run([app, "encode", "--base", d / "a.safetensors", "--target", d / "b.safetensors", "-o", d / "p0.pulse"])
    r = run([app, "encode", "--base", d / "a.safetensors", "--target", d / "b.safetensors", "-o", d / "p.pulse", "--json"])
    s = summary(r, "pulse-sync", "encode")
    expect(r.returncode == 0 and s.get("out") == str(d / "p.pulse") and s.get("out_bytes") == os.path.getsize(d / "p.pulse"),
           f"encode: out and out_bytes {s}")
    # the human-readable lines are the same as without --json (the timing aside)
    strip = lambda text: [line.split(", encoded in")[0].replace("p0.pulse", "p.pulse") for line in text.splitlines()]
    expect(strip(plain.stdout) == strip(r.stdout)[:-1], f"encode: lines before the JSON changed:\n{plain.stdout}\n{r.stdout}")

    r = run([app, "apply", "--base", d / "a.safetensors", "--patch", d / "p.pulse", "-o", d / "b2.safetensors", "--json"])
    s = summary(r, "pulse-sync", "apply")
    expect(r.returncode == 0 and s.get("out") == str(d / "b2.safetensors")
           and s.get("out_bytes") == os.path.getsize(d / "b2.safetensors"), f"apply: {s}")
    expect(np.array_equal(safetensors_ref.read(d / "b2.safetensors")[0]["w"][1], b), "apply: wrong output")

    corrupt = bytearray(open(d / "p.pulse", "rb").read())
    corrupt[len(corrupt) // 2] ^= 0xFF
    open(d / "bad.pulse", "wb").write(corrupt)
    r = run([app, "apply", "--base", d / "a.safetensors", "--patch", d / "bad.pulse", "-o", d / "b3.safetensors", "--json"])
    s = summary(r, "pulse-sync", "apply")
    expect(r.returncode == 1 and s.get("error") and s["error"] in r.stderr and "out_bytes" not in s
           and not os.path.exists(d / "b3.safetensors"), f"failed apply: {s} {r.stderr}")

    r = run([app, "keygen", "--public", d / "k.pub", "--secret", d / "k.sec", "--json"])
    s = summary(r, "pulse-sync", "keygen")
    expect(s.get("public_bytes") == os.path.getsize(d / "k.pub") and s.get("secret_bytes") == os.path.getsize(d / "k.sec"),
           f"keygen: {s}")

    # Messages that say what they mean: a patch larger than dense is called larger (not "0.1x
    # smaller"), and bytes of tensors carried whole are not added to a count of elements.
    safetensors_ref.write(d / "s.safetensors", [("w", "BF16", np.array([1, 2], np.uint16)), ("i", "I64", np.array([1, 2]))])
    safetensors_ref.write(d / "t.safetensors", [("w", "BF16", np.array([3, 4], np.uint16)), ("i", "I64", np.array([5, 6]))])
    r = run([app, "encode", "--base", d / "s.safetensors", "--target", d / "t.safetensors", "-o", d / "st.pulse"])
    size, dense = os.path.getsize(d / "st.pulse"), 2 * 2 + 2 * 8
    expect(f"{size} bytes, {size / dense:.2f}x larger than dense" in r.stdout and "smaller" not in r.stdout,
           f"encode of a patch larger than dense: {r.stdout}")
    r = run([app, "apply", "--base", d / "s.safetensors", "--patch", d / "st.pulse", "-o", d / "t2.safetensors"])
    i64 = [line.split() for line in r.stdout.splitlines() if line.split()[:1] == ["I64"]]
    expect(r.returncode == 0 and i64 == [["I64", "1", "tensors", "2", "elements", "16", "bytes", "carried", "whole"]],
           f"apply: the I64 line must count 2 elements and 16 bytes carried whole: {r.stdout}")

    # diff keeps its own --json object (no summary fields)
    r = run([app, "diff", d / "a.safetensors", d / "b.safetensors", "--json"])
    own = json.loads(r.stdout)
    expect(r.returncode == 0 and "program" not in own and len(r.stdout.splitlines()) == 1, f"diff --json: {r.stdout[:200]}")


def check_sft(app, d):
    out = d / "sft"
    r = run([app, "--steps", "20", "--eval-every", "10", "--eval-problems", "8", "--out", out, "--json"])
    s = summary(r, "pulse-sft")
    log = json.load(open(out / "sft_log.json"))
    expect(r.returncode == 0 and s.get("steps") == log["steps"] == 20, f"sft: steps {s.get('steps')}")
    expect(s.get("final") == log["curve"][-1], f"sft: final {s.get('final')} != {log['curve'][-1]}")
    expect(s.get("out") == str(out) and s.get("out_bytes") == folder_bytes(out), f"sft: out {s}")
    r = run([app, "--steps", "5", "--eval-every", "5", "--eval-problems", "4", "--out", d / "sft2"])
    expect(r.returncode == 0 and not r.stdout.splitlines()[-1].startswith("{"), "sft without --json printed JSON")


def check_absorb(app, d):
    out = d / "absorb"
    r = run([app, "--out", out, "--elements", "300000", "--steps", "3", "--json"])
    s = summary(r, "pulse-absorb")
    expect(r.returncode == 0 and s.get("steps") == 3 and len(json.load(open(out / "absorption.json"))["steps"]) == 3,
           f"absorb: {s}")
    expect(s.get("out") == str(out) and s.get("out_bytes") == folder_bytes(out), f"absorb: out {s}")


def check_train(app, launcher, d):
    """A config in another folder names its output relative to itself; the run starts elsewhere."""
    (d / "project" / "configs" / "results").mkdir(parents=True)
    (d / "elsewhere").mkdir()
    (d / "project" / "configs" / "run.toml").write_text(
        'out = "results/run.h5"\nmodel = "tiny"\nsteps = 2\ninference-ranks = 0\neval-every = 0\n'
        'absorption-every = 0\nprompts-per-step = 2\ngroup-size = 2\n')
    r = run(launcher(1) + [app, "--config", "../project/configs/run.toml", "--json", "--quiet"], cwd=d / "elsewhere")
    s = summary(r, "pulse-train")
    out = d / "project" / "configs" / "results" / "run.h5"
    expect(r.returncode == 0 and out.exists() and not (d / "elsewhere" / "results").exists(),
           f"train: the output must be beside the config: {r.stderr}")
    expect(s.get("out") == "../project/configs/results/run.h5" and s.get("out_bytes") == os.path.getsize(out)
           and s.get("steps") == 2, f"train: {s}")
    # Its results equal the statistics file's rows.
    with h5py.File(out, "r") as f:
        steps = {k: f["steps"][k][:] for k in ("sparsity", "patch_bytes", "dense_bytes", "reward")}
    res = s.get("results", {})
    expect(res.get("steps_run") == 2 and res.get("last_step") == 2
           and abs(res.get("mean_sparsity", -1) - float(np.mean(steps["sparsity"]))) < 1e-12
           and abs(res.get("dense_over_patch_bytes", -1) - steps["dense_bytes"].sum() / steps["patch_bytes"].sum()) < 1e-9
           and res.get("final_reward") == float(steps["reward"][-1]), f"train: results {res} vs the file's {steps}")


def main():
    global PULSE_VERSION
    p = argparse.ArgumentParser()
    for name in ("--pulse-version", "--sync", "--sft", "--absorb", "--train", "--mpiexec"):
        p.add_argument(name, required=True)
    p.add_argument("--mpi-flags", default="")
    a = p.parse_args()
    PULSE_VERSION = a.pulse_version
    app = lambda path: os.path.abspath(path)
    launcher = lambda n: [a.mpiexec, "-n", str(n), *a.mpi_flags.split()]
    from pathlib import Path
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        check_sync(app(a.sync), d)
        check_sft(app(a.sft), d)
        check_absorb(app(a.absorb), d)
        check_train(app(a.train), launcher, d)
    if failures:
        print(f"{len(failures)} failures")
        sys.exit(1)
    print("all --json summaries match what the runs wrote")


if __name__ == "__main__":
    main()
