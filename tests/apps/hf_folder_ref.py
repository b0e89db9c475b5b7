"""Hugging Face model folders for the pulse-sync folder tests and benchmark, written and read
here without pulse: a Llama-like state made with torch, sharded as save_pretrained does
(model-0000k-of-0000n.safetensors, model.safetensors.index.json with metadata.total_size and
weight_map), config, generation config and tokenizer files (tokenizer.model is binary). The
reader is pure Python (struct + json) from the safetensors spec."""
import json
import os
import struct

import numpy as np
import torch

import safetensors_ref  # noqa: E402  (beside this file, on the path of every script that imports it)

WIDTH = {"BF16": 2, "F16": 2, "F32": 4, "U8": 1, "I64": 8}


def to_bytes(t):
    """A torch tensor's bytes, little-endian as safetensors stores them."""
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


DTYPE_OF = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}


def llama_state(hidden, layers, vocab, intermediate, seed):
    """name -> torch tensor: BF16 attention and MLP weights, an F16 lm_head, F32 norms."""
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *shape: torch.randn(*shape, generator=g) * 0.02
    state = {"model.embed_tokens.weight": rnd(vocab, hidden).to(torch.bfloat16)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for proj in ("q", "k", "v", "o"):
            state[p + f"self_attn.{proj}_proj.weight"] = rnd(hidden, hidden).to(torch.bfloat16)
        state[p + "mlp.gate_proj.weight"] = rnd(intermediate, hidden).to(torch.bfloat16)
        state[p + "mlp.up_proj.weight"] = rnd(intermediate, hidden).to(torch.bfloat16)
        state[p + "mlp.down_proj.weight"] = rnd(hidden, intermediate).to(torch.bfloat16)
        state[p + "input_layernorm.weight"] = (1 + rnd(hidden)).to(torch.float32)
        state[p + "post_attention_layernorm.weight"] = (1 + rnd(hidden)).to(torch.float32)
    state["model.norm.weight"] = (1 + rnd(hidden)).to(torch.float32)
    state["lm_head.weight"] = rnd(vocab, hidden).to(torch.float16)
    return state


def write_safetensors(path, tensors, metadata):
    """tensors: list of (name, torch tensor); written by safetensors_ref (BF16 as uint16 bits)."""
    def as_numpy(t):
        t = t.contiguous()
        return t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()
    safetensors_ref.write(path, [(name, DTYPE_OF[t.dtype], as_numpy(t)) for name, t in tensors], metadata)


def write_folder(folder, state, shards, metadata, files):
    """state sharded in order into `shards` files of about equal bytes (one: model.safetensors,
    no index), each with `metadata`; files: {relative path: bytes}."""
    os.makedirs(folder, exist_ok=True)
    items = list(state.items())
    total = sum(len(to_bytes(t)) for _, t in items)
    groups, acc = [[] for _ in range(shards)], 0
    for name, t in items:
        k = min(shards - 1, acc * shards // total)
        groups[k].append((name, t))
        acc += len(to_bytes(t))
    if shards == 1:
        write_safetensors(os.path.join(folder, "model.safetensors"), groups[0], metadata)
    else:
        weight_map = {}
        for k, group in enumerate(groups):
            name = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            write_safetensors(os.path.join(folder, name), group, metadata)
            weight_map.update({n: name for n, _ in group})
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
            f.write(json.dumps(index, indent=2) + "\n")
    for rel, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(folder, rel)) or folder, exist_ok=True)
        with open(os.path.join(folder, rel), "wb") as f:
            f.write(data)


def model_files(hidden, layers, vocab, seed):
    """config.json, generation_config.json, tokenizer.json, tokenizer_config.json and a binary
    tokenizer.model (random bytes with NULs, as a sentencepiece protobuf has)."""
    rng = np.random.default_rng(seed)
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": hidden, "num_hidden_layers": layers,
              "vocab_size": vocab, "torch_dtype": "bfloat16", "model_type": "llama"}
    vocab_map = {f"tok{i}": i for i in range(min(vocab, 2000))}
    return {"config.json": json.dumps(config, indent=2).encode(),
            "generation_config.json": json.dumps({"bos_token_id": 1, "eos_token_id": 2}).encode(),
            "tokenizer.json": json.dumps({"model": {"type": "BPE", "vocab": vocab_map}}).encode(),
            "tokenizer_config.json": json.dumps({"model_max_length": 4096}).encode(),
            "tokenizer.model": bytes(rng.integers(0, 256, 40000, dtype=np.uint8))}


def one_ulp(state, fraction, seed):
    """A copy with `fraction` of every floating tensor's elements moved by one ulp (the lowest bit)."""
    g = torch.Generator().manual_seed(seed)
    out, changed = {}, 0
    for name, t in state.items():
        ints = t.clone().view({2: torch.int16, 4: torch.int32}[t.element_size()])
        hit = torch.rand(ints.shape, generator=g) < fraction
        ints[hit] ^= 1
        changed += int(hit.sum())
        out[name] = ints.view(t.dtype)
    return out, changed


def read_safetensors(path):
    """({name: (dtype, shape, bytes)}, metadata) with nothing but struct and json."""
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    metadata = header.pop("__metadata__", {})
    return {name: (i["dtype"], tuple(i["shape"]), data[8 + n + i["data_offsets"][0]:8 + n + i["data_offsets"][1]])
            for name, i in header.items()}, metadata


def read_folder(folder):
    """(tensors {name: (dtype, shape, bytes)}, shard metadata {file: metadata}, other files
    {relative path: bytes}); tensors in two shards or missing shards raise."""
    tensors, metadata, files = {}, {}, {}
    folder = os.fspath(folder)
    for root, _, names in os.walk(folder):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), folder)
            if root == folder and name.endswith(".safetensors"):
                t, m = read_safetensors(os.path.join(folder, name))
                assert not set(t) & set(tensors), f"tensor in two shards: {set(t) & set(tensors)}"
                tensors.update(t)
                metadata[name] = m
            else:
                files[rel] = open(os.path.join(root, name), "rb").read()
    if "model.safetensors.index.json" in files:
        weight_map = json.loads(files["model.safetensors.index.json"])["weight_map"]
        assert set(weight_map.values()) == set(metadata), "index and shard files disagree"
        assert set(weight_map) == set(tensors), "index and tensors disagree"
    return tensors, metadata, files
