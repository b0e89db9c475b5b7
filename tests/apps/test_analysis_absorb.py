"""pulse_analysis absorb on a real pulse-absorb run: the CSV table equals the values recomputed
from the JSON and the figure is a PNG image.
    test_analysis_absorb.py --app build/apps/pulse-absorb
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--app", required=True)
    app = parser.parse_args().app
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([app, "--out", d, "--elements", "300000", "--steps", "12", "--lr", "1e-4"], check=True,
                       capture_output=True)
        subprocess.run([sys.executable, "-m", "pulse_analysis", "absorb", os.path.join(d, "absorption.json"),
                        "-o", d], check=True, cwd=os.path.join(ROOT, "analysis"))
        doc = json.load(open(os.path.join(d, "absorption.json")))
        table = list(csv.DictReader(open(os.path.join(d, "absorption_summary.csv"))))
        failures = []
        # independent recomputation: k-step sparsity from the step records
        for j, k in enumerate(doc["k_values"]):
            values = [s["kstep_sparsity"][j] for s in doc["steps"] if s["kstep_sparsity"][j] is not None]
            row = [r for r in table if int(r["k"]) == k]
            if not values:
                if row:
                    failures.append(f"k={k} has no data but a table row")
                continue
            if len(row) != 1:
                failures.append(f"k={k}: expected one table row")
                continue
            if int(row[0]["steps"]) != len(values) or abs(float(row[0]["mean_sparsity"]) - sum(values) / len(values)) > 1e-12 \
                    or abs(float(row[0]["min_sparsity"]) - min(values)) > 1e-12:
                failures.append(f"k={k}: table {row[0]} disagrees with the JSON")
        with open(os.path.join(d, "absorption.png"), "rb") as f:
            if f.read(8) != b"\x89PNG\r\n\x1a\n":
                failures.append("absorption.png is not a PNG image")
    for f in failures:
        print("FAIL", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
