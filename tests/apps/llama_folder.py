"""Large Hugging Face model folder pairs made with numpy, one tensor at a time (the generator
holds two tensors, never the model): real Llama / Qwen2 tensor names and shapes, LLM-like BF16
values (normal, std 0.02), sharded as save_pretrained does (model-0000k-of-0000n.safetensors with
`format: pt`, model.safetensors.index.json), a config.json; the target has `fraction` of every
tensor's elements moved by 1 to 3 ulps, as an RL step moves them. For the bounded-memory test
(tests/apps/test_pulse_sync_bounded.py) and benchmark (apps/bench/big_folder_bench.py)."""
import json
import os
import struct

import numpy as np

# name -> (hidden, layers, vocab, intermediate, kv_dim, qkv_bias, tied, shards)
LAYOUTS = {
    # Llama-2-7B: 13.5 GB per version, in 2 shards as published
    "llama-7b": (4096, 32, 32000, 11008, 4096, False, False, 2),
    # Qwen2-1.5B: 3.1 GB, tied embeddings, q/k/v biases (published as one file; 2 shards here)
    "qwen2-1.5b": (1536, 28, 151936, 8960, 256, True, True, 2),
    # for the test: 0.54 GB per version, the largest tensor 32 MiB
    "small": (1024, 20, 16384, 2816, 1024, False, False, 3),
    # for unit tests: 1.3 MB
    "tiny": (64, 2, 4096, 160, 64, False, False, 2),
}


def layout(name):
    """[(tensor name, shape)] in save_pretrained's order, and the shard count."""
    hidden, layers, vocab, inter, kv, bias, tied, shards = LAYOUTS[name]
    out = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out.append((p + "self_attn.q_proj.weight", (hidden, hidden)))
        out.append((p + "self_attn.k_proj.weight", (kv, hidden)))
        out.append((p + "self_attn.v_proj.weight", (kv, hidden)))
        if bias:
            out += [(p + "self_attn.q_proj.bias", (hidden,)), (p + "self_attn.k_proj.bias", (kv,)),
                    (p + "self_attn.v_proj.bias", (kv,))]
        out.append((p + "self_attn.o_proj.weight", (hidden, hidden)))
        out += [(p + "mlp.gate_proj.weight", (inter, hidden)), (p + "mlp.up_proj.weight", (inter, hidden)),
                (p + "mlp.down_proj.weight", (hidden, inter))]
        out += [(p + "input_layernorm.weight", (hidden,)), (p + "post_attention_layernorm.weight", (hidden,))]
    out.append(("model.norm.weight", (hidden,)))
    if not tied:
        out.append(("lm_head.weight", (vocab, hidden)))
    return out, shards


def nbytes(shape):
    return 2 * int(np.prod(shape))


def bf16_normal(rng, n):
    """n LLM-like BF16 bit patterns: N(0, 0.02) rounded to nearest even."""
    bits = (rng.standard_normal(n, dtype=np.float32) * np.float32(0.02)).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def header(tensors, metadata):
    """A safetensors header (padded to 8 bytes) for [(name, shape)] in file order, all BF16, laid
    out as Hugging Face's writer does (compact JSON, "__metadata__" first, spaces to pad)."""
    h, offset = {"__metadata__": metadata}, 0
    for name, shape in tensors:
        h[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes(shape)]}
        offset += nbytes(shape)
    text = json.dumps(h, separators=(",", ":")).encode()  # compact, as Hugging Face's writer
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text


def write_pair(base, target, name, fraction=0.01, seed=0):
    """Writes the base and target folders; returns (bytes per version, changed elements, largest
    tensor's bytes)."""
    tensors, shards = layout(name)
    total = sum(nbytes(s) for _, s in tensors)
    groups, acc = [[] for _ in range(shards)], 0
    for t in tensors:
        groups[min(shards - 1, acc * shards // total)].append(t)
        acc += nbytes(t[1])
    hidden, layers, vocab = LAYOUTS[name][:3]
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": hidden, "num_hidden_layers": layers,
              "vocab_size": vocab, "torch_dtype": "bfloat16", "model_type": "llama"}
    rng = np.random.default_rng(seed)
    changed = 0
    for folder in (base, target):
        os.makedirs(folder, exist_ok=True)
    weight_map = {}
    for k, group in enumerate(groups):
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        weight_map.update({n: file for n, _ in group})
        with open(os.path.join(base, file), "wb") as fb, open(os.path.join(target, file), "wb") as ft:
            head = header(group, {"format": "pt"})
            fb.write(head)
            ft.write(head)
            for _, shape in group:
                n = int(np.prod(shape))
                a = bf16_normal(rng, n)
                fb.write(a.data)
                hit = np.flatnonzero(rng.random(n, dtype=np.float32) < fraction)
                step = rng.integers(1, 4, hit.size, dtype=np.uint16)
                a[hit] = np.where(rng.random(hit.size) < 0.5, a[hit] + step, a[hit] - step)
                changed += hit.size
                ft.write(a.data)
                del a, hit, step
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    for folder in (base, target):
        with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
            f.write(json.dumps(index, indent=2) + "\n")
        with open(os.path.join(folder, "config.json"), "w") as f:
            f.write(json.dumps(config, indent=2) + "\n")
    return total, changed, max(nbytes(s) for _, s in tensors)
