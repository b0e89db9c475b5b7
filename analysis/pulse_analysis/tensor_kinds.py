"""Tensor kinds by name (pulse's GPT names, src/model/gpt.cpp, and the usual Hugging Face ones):
per-kind BF16 sparsity from /steps/tensor_changed and the root attributes tensor_names and
tensor_numel."""
import numpy as np

KINDS = ("attention", "MLP", "embeddings", "norms", "biases", "other")


def kind(name):
    """The kind of a tensor; the first rule that matches wins (a LayerNorm bias is a norm)."""
    n = name.lower()
    if any(p in n for p in ("wte", "wpe", "embed", "lm_head")):
        return "embeddings"
    if any(p in n for p in ("ln", "norm")):
        return "norms"
    if n.endswith(".bias") or n.endswith("_bias"):
        return "biases"
    if any(p in n for p in ("attn", "attention", "q_proj", "k_proj", "v_proj", "o_proj")):
        return "attention"
    if any(p in n for p in ("mlp", "fc", "gate_proj", "up_proj", "down_proj", "ffn")):
        return "MLP"
    return "other"


def per_kind(run):
    """{kind: (elements, changed per step as an array)} for the kinds present in the run."""
    names = run.step_attrs["tensor_changed"].get("tensor_names") or run.attrs["tensor_names"]
    numel = dict(zip(run.attrs["tensor_names"], run.attrs["tensor_numel"]))
    changed = run.steps["tensor_changed"]
    out = {}
    for j, name in enumerate(names):
        kd = kind(name)
        elements, series = out.get(kd, (0, np.zeros(changed.shape[0])))
        out[kd] = (elements + int(numel[name]), series + changed[:, j])
    return {kd: out[kd] for kd in KINDS if kd in out}
