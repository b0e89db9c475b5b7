"""`import pulse`: round trips of every dtype, corrupted patches, Sender/Receiver over AdamW
steps, bytes equal to pulse-sync's, relay, and the GIL released while encoding.
Run: test_pulse_module.py --app build/apps/pulse-sync (PYTHONPATH=build/python)."""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

import pulse

APP = os.environ.get("PULSE_SYNC_APP")
rng = np.random.default_rng(7)

TORCH_DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16,
                torch.int32, torch.int64, torch.bool, torch.complex64]
NUMPY_ONLY = [np.uint16, np.uint32, np.uint64]
RAW = ["F8_E4M3", "F8_E5M2", "F8_E8M0", "F4"]  # neither torch 1.13 nor numpy has these


def random_bytes(n):
    return rng.integers(0, 256, size=n, dtype=np.uint8)


def random_state():
    """One tensor per dtype pulse supports, as torch, numpy or pulse.Tensor."""
    state = {}
    for i, dt in enumerate(TORCH_DTYPES):
        shape = (17, 33) if i % 2 else (5, 7, 11)
        if dt == torch.bool:
            t = torch.from_numpy(rng.integers(0, 2, size=shape).astype(bool))
        else:
            size = torch.empty((), dtype=dt).element_size()
            t = torch.from_numpy(random_bytes(int(np.prod(shape)) * size)).view(dt).reshape(shape)
        state[f"torch.{str(dt)[6:]}"] = t
    for dt in NUMPY_ONLY:
        state[f"numpy.{np.dtype(dt).name}"] = rng.integers(0, np.iinfo(dt).max, size=(300,), dtype=dt)
    for d in RAW:
        n = 256
        state[f"raw.{d}"] = pulse.Tensor(d, (n,), random_bytes(n // 2 if d == "F4" else n))
    state["scalar"] = torch.tensor(3.5, dtype=torch.float32)
    return state


def raw_bytes(v):
    if isinstance(v, torch.Tensor):
        return v.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if v.numel() else b""
    if isinstance(v, pulse.Tensor):
        return v.data.tobytes()
    return v.tobytes()


def copy_state(state):
    out = {}
    for k, v in state.items():
        if isinstance(v, torch.Tensor):
            out[k] = v.clone()
        elif isinstance(v, pulse.Tensor):
            out[k] = pulse.Tensor(v.dtype, v.shape, v.data.copy())
        else:
            out[k] = v.copy()
    return out


def perturb(state, fraction=0.02):
    """Changes about `fraction` of the bytes of every tensor, in place."""
    for v in state.values():
        if isinstance(v, torch.Tensor):
            b = v.view(-1).view(torch.uint8).numpy() if v.dim() else v.view(1).view(torch.uint8).numpy()
        elif isinstance(v, pulse.Tensor):
            b = v.data
        else:
            b = v.view(np.uint8).reshape(-1)
        idx = rng.choice(b.size, size=max(1, int(b.size * fraction)), replace=False)
        b[idx] ^= rng.integers(1, 256, size=idx.size, dtype=np.uint8)


def assert_same(a, b):
    assert list(a) == list(b) or sorted(a) == sorted(b)
    for k in a:
        assert raw_bytes(a[k]) == raw_bytes(b[k]), k


def test_round_trip_every_dtype():
    base = random_state()
    target = copy_state(base)
    perturb(target)
    for values in ("keydiff", "raw", "expclass"):  # expclass: its own index coding, not named
        for compressor in ("zstd", "lz4", "none"):
            patch = pulse.encode(base, target, base_version=1, target_version=2, values=values,
                                 compressor=compressor)
            info = pulse.inspect(patch)
            assert (info["base_version"], info["target_version"]) == (1, 2)
            assert info["target_state"] == pulse.digest(target)
            got = copy_state(base)
            assert pulse.apply(got, patch) == 2
            assert_same(got, target)
            assert pulse.digest(got) == pulse.digest(target)


def test_diff_counts():
    a = {"w": torch.zeros(1000, dtype=torch.bfloat16), "x": np.zeros(10, np.float32)}
    b = copy_state(a)
    b["w"][[3, 5, 999]] = 1.0
    b["y"] = np.zeros(4, np.float32)  # added
    b["x"] = np.zeros(5, np.float32)  # re-declared
    d = pulse.diff(a, b)  # pulse-sync diff --json's object, without the paths
    rows = {t["name"]: t for t in d["tensors"]}
    assert rows["w"] == {"name": "w", "dtype": "BF16", "elements": 1000, "changed": 3,
                         "sparsity_percent": pytest.approx(100 * (1 - 3 / 1000))}
    assert rows["x"]["status"] == "re-declared" and rows["y"]["status"] == "added"
    assert d["totals"] == {"BF16": {"elements": 1000, "changed": 3, "sparsity_percent": rows["w"]["sparsity_percent"]}}
    assert d["metadata_changed"] is False
    assert [t["status"] for t in pulse.diff(b, a)["tensors"] if "status" in t] == ["removed", "re-declared"]


def test_every_corruption_rejected_state_unchanged():
    base = {"a": torch.randn(3000).to(torch.bfloat16), "b": torch.randn(200, dtype=torch.float32)}
    target = copy_state(base)
    target["a"][::97] += 1.0
    target["b"][::13] *= 2.0
    patch = pulse.encode(base, target, base_version=0, target_version=1)
    before = {k: raw_bytes(v) for k, v in base.items()}
    bad = [patch[:n] for n in range(len(patch))] + [patch + b"\0"]
    for i in range(len(patch)):
        bad.append(patch[:i] + bytes([patch[i] ^ 0x01]) + patch[i + 1:])
    for b in bad:
        with pytest.raises(pulse.PatchError) as e:
            pulse.apply(base, b)
        assert "\n" not in str(e.value)
        assert {k: raw_bytes(v) for k, v in base.items()} == before
    # a patch for another base, and a signature demanded but absent
    with pytest.raises(pulse.PatchError, match="digest"):
        pulse.apply(copy_state(target), patch)
    public, _ = pulse.generate_keypair()
    with pytest.raises(pulse.PatchError):
        pulse.apply(base, patch, public_key=public)
    assert {k: raw_bytes(v) for k, v in base.items()} == before
    pulse.apply(base, patch)
    assert_same(base, target)


def test_signed_patch():
    public, secret = pulse.generate_keypair()
    base = {"w": torch.randn(100).to(torch.bfloat16)}
    target = copy_state(base)
    target["w"][0] = 7
    patch = pulse.encode(base, target, base_version=0, target_version=1, signing_key=secret)
    assert pulse.inspect(patch)["signed"]
    other_public, _ = pulse.generate_keypair()
    with pytest.raises(pulse.PatchError):
        pulse.apply(base, patch, public_key=other_public)
    pulse.apply(base, patch, public_key=public)
    assert_same(base, target)


def adamw_steps(model, steps, on_step):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(64, 16)
    for t in range(steps):
        loss = (model(x.to(next(model.parameters()).dtype)).float() ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        on_step(t)


@pytest.mark.parametrize("precision", ["mixed", "bf16"])
def test_sender_receiver_50_adamw_steps(precision):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    if precision == "bf16":
        model = model.to(torch.bfloat16)
        sent = dict(model.named_parameters())  # the live parameters, read in place
    else:
        sent = {n: p.detach().to(torch.bfloat16) for n, p in model.named_parameters()}
    held = {n: t.detach().clone() for n, t in sent.items()}
    sender, receiver = pulse.Sender(sent), pulse.Receiver(held)
    sizes = []

    def on_step(t):
        if precision == "mixed":
            for n, p in model.named_parameters():
                sent[n].copy_(p.detach())
        patch = sender.patch()
        sizes.append(len(patch))
        receiver.apply(patch)
        assert receiver.version == sender.version == t + 1
        for n in sent:
            assert torch.equal(sent[n].detach().view(torch.int16), held[n].view(torch.int16)), (t, n)

    adamw_steps(model, 50, on_step)
    assert pulse.digest(held) == pulse.digest({n: t.detach() for n, t in sent.items()})


def test_layout_change_reaches_the_receiver():
    sent = {"a": torch.randn(10).to(torch.bfloat16), "b": torch.randn(4)}
    held = copy_state(sent)
    sender, receiver = pulse.Sender(sent), pulse.Receiver(held)
    del sent["b"]
    sent["c"] = torch.arange(6, dtype=torch.int64).reshape(2, 3)
    receiver.apply(sender.patch())
    assert sorted(held) == ["a", "c"] and torch.equal(held["c"], sent["c"])


def test_patch_bytes_equal_cli(tmp_path):
    assert APP, "run with --app build/apps/pulse-sync"
    base = {"w": torch.randn(4096).to(torch.bfloat16), "b": torch.randn(64), "n": torch.arange(5)}
    target = copy_state(base)
    target["w"][::31] += 0.5
    target["b"][3] = 0
    pulse.save(base, tmp_path / "a.safetensors")
    pulse.save(target, tmp_path / "b.safetensors")
    for values, level in (("keydiff", 3), ("raw", 9), ("expclass", 3)):
        out = tmp_path / f"p-{values}.patch"
        subprocess.run([APP, "encode", "--base", str(tmp_path / "a.safetensors"), "--target",
                        str(tmp_path / "b.safetensors"), "-o", str(out), "--base-version", "3", "--target-version",
                        "4", "--values", values, "--level", str(level)], check=True, capture_output=True)
        mine = pulse.encode(base, target, base_version=3, target_version=4, values=values, level=level)
        assert mine == out.read_bytes()
    # and the CLI's digest of the file equals pulse.digest of the state
    printed = subprocess.run([APP, "verify", str(tmp_path / "b.safetensors")], check=True, capture_output=True,
                             text=True).stdout.split()[0]
    assert printed == pulse.digest(target)


def test_load_save_round_trip(tmp_path):
    state = random_state()
    del state["raw.F4"]  # shape (256,) of F4 is fine too, but keep names simple
    pulse.save(state, tmp_path / "s.safetensors", metadata={"step": "7"})
    back, meta = pulse.load(tmp_path / "s.safetensors", metadata=True)
    assert meta == {"step": "7"}
    assert_same(back, state)
    assert isinstance(back["torch.bfloat16"], torch.Tensor) and back["torch.bfloat16"].dtype == torch.bfloat16
    assert pulse.digest(back) == pulse.digest(state)
    with pytest.raises(pulse.Error, match="model.safetensors"):
        pulse.load(tmp_path)  # a folder whose one file is not model.safetensors: its name would not travel


def hf_reader():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "apps"))
    import hf_folder_ref
    return hf_folder_ref


def test_model_folder_save_load(tmp_path):
    """save writes Hugging Face shards + index (checked by a pure-Python reader), load reads
    them back with the metadata and the other files; an existing folder keeps its files."""
    hf = hf_reader()
    state = hf.llama_state(32, 2, 128, 64, seed=4)
    files = {"config.json": '{"hidden_size": 32}', "tokenizer.model": bytes(range(256)) * 3,
             "sub/notes.txt": b"kept"}
    folder = tmp_path / "model"
    pulse.save(state, folder, max_shard_bytes=20000, files=files, metadata={"format": "pt"})
    tensors, shard_meta, other = hf.read_folder(folder)
    index = json.loads(other.pop("model.safetensors.index.json"))
    shard_names = sorted(shard_meta)
    assert len(shard_names) > 2 and shard_names[0] == f"model-00001-of-{len(shard_names):05d}.safetensors"
    assert all(os.path.getsize(folder / n) < 20000 + 4096 for n in shard_names)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in state.values())
    assert set(index["weight_map"]) == set(state) and set(index["weight_map"].values()) == set(shard_names)
    assert all(m == {"format": "pt"} for m in shard_meta.values())
    assert other == {k: v.encode() if isinstance(v, str) else v for k, v in files.items()}
    for name, t in state.items():
        assert tensors[name][2] == hf.to_bytes(t), name
    back, meta, got_files = pulse.load(folder, metadata=True, files=True)
    assert meta == {"format": "pt"} and got_files == other and list(back) != [] and set(back) == set(state)
    assert all(torch.equal(back[n].view(torch.uint8) if back[n].dim() else back[n], state[n].view(torch.uint8))
               for n in state)
    # shards=3 re-shards the same folder (files kept), then one shard is model.safetensors alone
    pulse.save(back, folder, shards=3)
    tensors3, meta3, other3 = hf.read_folder(folder)
    assert sorted(meta3) == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)] and tensors3 == tensors
    assert all(m == {} for m in meta3.values())
    assert {k: v for k, v in other3.items() if k != "model.safetensors.index.json"} == other
    pulse.save(back, folder)
    assert sorted(os.listdir(folder)) == ["config.json", "model.safetensors", "sub", "tokenizer.model"]
    # a folder torch wrote (hf_folder_ref) loads as the same tensors
    hf.write_folder(tmp_path / "torch", state, 2, {"format": "pt"}, {"config.json": b"{}"})
    loaded = pulse.load(tmp_path / "torch")
    assert all(torch.equal(loaded[n].view(torch.uint8), state[n].view(torch.uint8)) for n in state)
    with pytest.raises(pulse.Error, match="written by pulse.save"):
        pulse.save(back, tmp_path / "x", files={"model.safetensors.index.json": b"{}"})
    with pytest.raises(pulse.Error, match="reserved"):
        pulse.save({"__file__/a": torch.zeros(2)}, tmp_path / "y", shards=1)


def test_model_folder_round_trip_byte_for_byte(tmp_path):
    """load(files=True) -> save(files=files) gives back a save_pretrained-style folder (2 shards
    with `format: pt`, index, config) byte for byte when nothing changed; a changed tensor lands
    in the same shard; a state with a tensor more is sharded anew (one file, the common metadata)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "apps"))
    import llama_folder
    llama_folder.write_pair(tmp_path / "a", tmp_path / "b", "tiny", seed=3)
    original = {f: (tmp_path / "a" / f).read_bytes() for f in os.listdir(tmp_path / "a")}
    assert sum(f.endswith(".safetensors") for f in original) == 2
    state, files = pulse.load(tmp_path / "a", files=True)
    pulse.save(state, tmp_path / "out", files=files)
    assert {f: (tmp_path / "out" / f).read_bytes() for f in os.listdir(tmp_path / "out")} == original
    name = "model.layers.1.mlp.down_proj.weight"
    state[name].view(torch.int16)[0] += 1
    pulse.save(state, tmp_path / "out", files=files)
    back = pulse.load(tmp_path / "out")
    assert torch.equal(back[name].view(torch.int16), state[name].view(torch.int16))
    assert sorted(os.listdir(tmp_path / "out")) == sorted(original)
    state["extra"] = torch.zeros(3)
    pulse.save(state, tmp_path / "more", files=files)
    assert sorted(os.listdir(tmp_path / "more")) == ["config.json", "model.safetensors"]
    _, meta = pulse.load(tmp_path / "more", metadata=True)
    assert meta == {"format": "pt"}


def test_relay_publish_pull(tmp_path):
    relay = pulse.Relay(tmp_path / "relay")
    assert relay.head() is None
    w = {"w": torch.randn(2000).to(torch.bfloat16)}
    previous = None
    for v in range(1, 6):
        w["w"][v::50] += 1
        relay.publish(v, w, previous, anchor_every=3)
        previous = copy_state(w)
    assert relay.head()["version"] == 5
    slow = relay.pull()
    assert slow.version == 5 and not slow.fast_path
    assert_same(slow.state, w)
    w["w"][0] += 1
    relay.publish(6, w, previous, anchor_every=3)
    fast = relay.pull(slow.state, 5)
    assert fast.fast_path and fast.version == 6
    assert_same(fast.state, w)
    # A state without its version would count as version 0 and accept any older HEAD.
    with pytest.raises(ValueError, match="version of `state`"):
        relay.pull(slow.state)


def spinner_stamps_mid_call(call):
    """Runs call while a Python thread records timestamps; returns (seconds, timestamps taken in the
    middle half of the call). A call that holds the GIL lets the thread run only at its edges
    (the switch interval), so none fall in the middle: sorted() of a float list, which holds the
    GIL throughout, gives 0 here."""
    stamps, stop = [], threading.Event()

    def spin():
        while not stop.is_set():
            stamps.append(time.perf_counter())

    thread = threading.Thread(target=spin)
    thread.start()
    time.sleep(0.05)
    t0 = time.perf_counter()
    call()
    t1 = time.perf_counter()
    stop.set()
    thread.join()
    return t1 - t0, sum(t0 + 0.25 * (t1 - t0) < s < t0 + 0.75 * (t1 - t0) for s in stamps)


def test_gil_released_during_encode_and_apply():
    base = {"w": torch.randn(32 << 20).to(torch.bfloat16)}  # calls of 20-100 ms: the thread gets scheduled
    target = copy_state(base)
    target["w"][::50] += 1
    patch = pulse.encode(base, target, base_version=0, target_version=1)
    gen = np.random.default_rng(3)
    xs = gen.random(1 << 20).tolist()  # sorting these takes ~0.5 s, holding the GIL
    held_seconds, held_mid = spinner_stamps_mid_call(lambda: sorted(xs))
    assert held_mid == 0, "the check itself: a call holding the GIL must leave the thread idle"
    receiver = copy_state(base)
    back = pulse.encode(target, base, base_version=1, target_version=0)
    patches = iter([patch, back] * 5)  # the receiver goes forth and back, one version per call
    for call in (lambda: pulse.encode(base, target, base_version=0, target_version=1),
                 lambda: pulse.apply(receiver, next(patches)), lambda: pulse.digest(target)):
        # On a loaded machine the OS may not schedule the thread within a call: a few tries.
        tries = []
        while len(tries) < 10 and not any(mid > 0 for _, mid in tries):
            tries.append(spinner_stamps_mid_call(call))
        assert any(mid > 0 for _, mid in tries), tries


def test_bad_states_one_line_errors():
    with pytest.raises(pulse.Error, match="not contiguous"):
        pulse.apply({"w": torch.zeros(4, 4).t()}, b"")
    with pytest.raises(pulse.Error, match="not a torch tensor"):
        pulse.digest({"w": [1, 2]})


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--app", help="pulse-sync binary")
    args = parser.parse_args()
    if args.app:
        os.environ["PULSE_SYNC_APP"] = args.app
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
