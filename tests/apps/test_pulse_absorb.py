"""pulse-absorb end to end: the JSON it writes is consistent with the run it describes,
lr 0 changes nothing, a large lr changes most weights, and bad input fails with one line.
    test_pulse_absorb.py --app build/apps/pulse-absorb
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def run(app, out, *flags):
    return subprocess.run([app, "--out", out, "--elements", "300000", *flags], capture_output=True, text=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--app", required=True)
    app = parser.parse_args().app
    failures = []

    def expect(cond, message):
        if not cond:
            failures.append(message)

    with tempfile.TemporaryDirectory() as d:
        for precision in ("mixed", "bf16"):
            out = os.path.join(d, precision)
            r = run(app, out, "--steps", "6", "--lr", "0", "--precision", precision)
            expect(r.returncode == 0, f"{precision} lr=0 run failed: {r.stderr}")
            doc = json.load(open(os.path.join(out, "absorption.json")))
            expect(len(doc["steps"]) == 6, "expected 6 step records")
            expect(all(s["changed"] == 0 and s["sparsity"] == 1.0 for s in doc["steps"]),
                   f"{precision}: lr 0 must leave every BF16 weight unchanged")
            # k-step values exist only once the history is long enough
            expect(doc["steps"][0]["kstep_sparsity"][1] is None and doc["steps"][1]["kstep_sparsity"][1] == 1.0,
                   f"{precision}: k=2 sparsity must be null at step 1 and defined from step 2")

            r = run(app, out, "--steps", "3", "--lr", "1e-2", "--precision", precision)
            doc = json.load(open(os.path.join(out, "absorption.json")))
            n = doc["elements"]
            for s in doc["steps"]:
                expect(abs(s["sparsity"] - (1 - s["changed"] / n)) < 1e-12, "sparsity disagrees with changed")
                expect(s["kstep_sparsity"][0] == s["sparsity"], "k=1 sparsity must equal per-step sparsity")
                expect(s["sparsity"] < 0.5, f"{precision}: lr 1e-2 should change most weights, got S1={s['sparsity']}")
                expect(s["grad_sparsity"] == sorted(s["grad_sparsity"]),
                       "gradient sparsity must grow with the threshold")
            if precision == "mixed":
                expect(all(0 <= s["absorbed_fraction"] <= 1 for s in doc["steps"]), "absorbed fraction out of [0, 1]")

        blocker = os.path.join(d, "file")
        open(blocker, "w").close()
        for flags, what in ((["--precision", "fp8"], "bad precision"), (["--steps", "0"], "zero steps"),
                            (["--out", os.path.join(blocker, "x")], "output under a file")):
            r = subprocess.run([app, "--elements", "300000", *flags], capture_output=True, text=True)
            lines = [l for l in r.stderr.splitlines() if l.strip()]
            expect(r.returncode != 0, f"{what}: expected a non-zero exit")
            expect(len(lines) >= 1, f"{what}: expected an error message")
    for f in failures:
        print("FAIL", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
