"""pulse-sft end to end: a short run on tiny lowers the loss clearly, pass@1 stays in [0, 1],
the checkpoint holds the tensor table's names and shapes in BF16 with the config in its
metadata, and bad input fails with a one-line error.
    test_pulse_sft.py --app build/apps/pulse-sft
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_ref  # noqa: E402


def expected_shapes(meta):
    """The GPT tensor table (src/model/gpt.cpp gpt_tensor_table) from the checkpoint's config."""
    V, C, L, S = (int(meta[k]) for k in ("vocab_size", "channels", "num_layers", "max_seq_len"))
    shapes = {"wte.weight": [V, C], "wpe.weight": [S, C]}
    for l in range(L):
        p = f"blocks.{l}."
        shapes.update({p + "ln1.weight": [C], p + "ln1.bias": [C], p + "attn.qkv.weight": [3 * C, C],
                       p + "attn.qkv.bias": [3 * C], p + "attn.proj.weight": [C, C], p + "attn.proj.bias": [C],
                       p + "ln2.weight": [C], p + "ln2.bias": [C], p + "mlp.fc.weight": [4 * C, C],
                       p + "mlp.fc.bias": [4 * C], p + "mlp.proj.weight": [C, 4 * C], p + "mlp.proj.bias": [C]})
    shapes.update({"ln_f.weight": [C], "ln_f.bias": [C]})
    if meta["tied_lm_head"] != "true":
        shapes["lm_head.weight"] = [V, C]
    return shapes


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--app", required=True)
    app = parser.parse_args().app
    failures = []

    def expect(cond, message):
        if not cond:
            failures.append(message)

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "run")
        r = subprocess.run([app, "--out", out, "--model", "tiny", "--digits", "2", "--steps", "600", "--batch", "32",
                            "--lr", "1e-3", "--eval-every", "200", "--eval-problems", "100", "--seed", "3"],
                           capture_output=True, text=True)
        expect(r.returncode == 0, f"training run failed: {r.stderr}")
        if r.returncode == 0:
            log = json.load(open(os.path.join(out, "sft_log.json")))
            curve = log["curve"]
            expect([c["step"] for c in curve] == [0, 200, 400, 600], f"eval steps {[c['step'] for c in curve]}")
            first, last = curve[0]["eval_loss"], curve[-1]["eval_loss"]
            expect(last < 0.7 * first, f"eval loss fell only from {first} to {last}")
            expect(all(0.0 <= c["pass_at_1"] <= 1.0 for c in curve), "pass@1 outside [0, 1]")
            expect(log["steps"] == 600, "the log must record the steps taken")
            expect("answer" in log["loss"], f"the default loss is answer-only, the log says {log['loss']!r}")
            # one printed line per evaluation
            rows = [l for l in r.stdout.splitlines() if l.split() and l.split()[0].isdigit()]
            expect(len(rows) == len(curve), f"{len(rows)} printed eval lines for {len(curve)} evaluations")

            tensors, meta = safetensors_ref.read(os.path.join(out, "model.safetensors"))
            shapes = expected_shapes(meta)
            expect(list(tensors) == list(shapes), "checkpoint tensor names/order differ from the tensor table")
            for name, (dtype, array) in tensors.items():
                expect(dtype == "BF16", f"{name} is {dtype}, expected BF16")
                expect(list(array.shape) == shapes.get(name), f"{name} has shape {list(array.shape)}")
            expect(meta.get("model") == "tiny" and meta.get("steps") == "600", f"metadata {meta}")
            expect(sum(a.size for _, a in tensors.values()) == log["parameters"], "parameter count differs")

        # a time limit stops early and still writes both files
        out2 = os.path.join(d, "limited")
        r = subprocess.run([app, "--out", out2, "--steps", "1000000", "--time-limit-s", "1", "--eval-every", "100000",
                            "--eval-problems", "20", "--loss", "all"], capture_output=True, text=True)
        expect(r.returncode == 0, f"time-limited run failed: {r.stderr}")
        if r.returncode == 0:
            log = json.load(open(os.path.join(out2, "sft_log.json")))
            expect(0 < log["steps"] < 1000000 and log["curve"][-1]["step"] == log["steps"],
                   "a time-limited run must stop early and evaluate its last step")
            expect(os.path.exists(os.path.join(out2, "model.safetensors")), "no checkpoint after the time limit")
            expect("all positions" in log["loss"], f"--loss all, the log says {log['loss']!r}")

        blocker = os.path.join(d, "file")
        open(blocker, "w").close()
        for flags, what in ((["--model", "huge"], "unknown model"), (["--steps", "0"], "zero steps"),
                            (["--digits", "0"], "zero digits"), (["--batch", "0"], "zero batch"),
                            (["--loss", "operands"], "unknown loss"),
                            (["--out", os.path.join(blocker, "x")], "output under a file")):
            args = [app, "--steps", "1", *flags] if "--steps" not in flags else [app, *flags]
            if "--out" not in flags:
                args += ["--out", os.path.join(d, "bad")]
            r = subprocess.run(args, capture_output=True, text=True)
            lines = [l for l in r.stderr.splitlines() if l.strip()]
            expect(r.returncode != 0, f"{what}: expected a non-zero exit")
            expect(len(lines) == 1 and lines[0].startswith("pulse-sft: "),
                   f"{what}: expected one error line, got {r.stderr!r}")
            expect(not os.path.exists(os.path.join(d, "bad", "model.safetensors")), f"{what}: wrote a checkpoint")
    for f in failures:
        print("FAIL", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
