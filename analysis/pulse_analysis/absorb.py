"""Figures and a summary table of a pulse-absorb run (absorption.json): per-step BF16 sparsity,
k-step sparsity curves (the paper's Fig. 2a/2b shape) and, in mixed precision, the fraction of
updates below half a BF16 ulp. Every number comes from the JSON file."""
import csv
import json
import os

import numpy as np


def summary_rows(doc):
    """One row per k: mean and minimum k-step sparsity over the steps where it is defined."""
    rows = []
    for j, k in enumerate(doc["k_values"]):
        values = np.array([s["kstep_sparsity"][j] for s in doc["steps"] if s["kstep_sparsity"][j] is not None])
        if values.size:
            rows.append({"k": k, "steps": int(values.size), "mean_sparsity": float(values.mean()),
                         "min_sparsity": float(values.min())})
    return rows


def write_report(json_path, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc = json.load(open(json_path))
    os.makedirs(out_dir, exist_ok=True)
    rows = summary_rows(doc)
    with open(os.path.join(out_dir, "absorption_summary.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["k", "steps", "mean_sparsity", "min_sparsity"])
        writer.writeheader()
        writer.writerows(rows)

    steps = [s["step"] for s in doc["steps"]]
    title = f"{doc['precision']} AdamW, lr {doc['lr']:g}, {doc['elements']:,} parameters (synthetic gradients)"
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(steps, [100 * s["sparsity"] for s in doc["steps"]], label="per-step sparsity S1")
    if doc["precision"] == "mixed":
        left.plot(steps, [100 * s["absorbed_fraction"] for s in doc["steps"]], "--",
                  label="updates < half BF16 ulp")
    left.set_xlabel("step")
    left.set_ylabel("%")
    left.legend()
    left.set_title("BF16 sparsity per step")
    right.plot([r["k"] for r in rows], [100 * r["mean_sparsity"] for r in rows], "o-", label="mean")
    right.plot([r["k"] for r in rows], [100 * r["min_sparsity"] for r in rows], "s--", label="min")
    right.set_xscale("log", base=2)
    right.set_xlabel("k (steps apart)")
    right.set_ylabel("k-step sparsity (%)")
    right.legend()
    right.set_title("k-step sparsity")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "absorption.png"), dpi=120)
    plt.close(fig)
    return rows
