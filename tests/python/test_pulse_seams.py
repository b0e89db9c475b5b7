"""`import pulse` where the weights live elsewhere: pulse.decode (a patch's changes per tensor,
checked, against numpy's own comparison of the two states), tied weights through Sender and
Receiver, a Receiver whose dict another writer changed, and the Sender/Receiver's peak memory.
Run: test_pulse_seams.py --app build/apps/pulse-sync (PYTHONPATH=build/python)."""
import argparse
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import pulse

HERE = os.path.dirname(os.path.abspath(__file__))
APP = os.environ.get("PULSE_SYNC_APP")
CODINGS = ["keydiff", "expclass", "raw"]


def bits(t):
    """A tensor's bytes as a flat integer array of its element width (numpy, torch or pulse.Tensor)."""
    if isinstance(t, pulse.Tensor):
        return t.data.view(np.uint8).copy()
    if isinstance(t, torch.Tensor):
        t = t.detach().contiguous().reshape(-1)
        return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]).numpy().copy()
    return np.ascontiguousarray(t).reshape(-1).view({1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}[t.itemsize]).copy()


def clone(state):
    return {k: v.clone() for k, v in state.items()}


def step_states(seed=0, fraction=0.03):
    """A base and a target as an RL step makes them: floats moved by a few ulps at ~fraction of
    the elements, an integer tensor changed (carried whole), one tensor removed, one added."""
    g = torch.Generator().manual_seed(seed)
    base = {"embed": (torch.randn(300, 64, generator=g) * 0.02).bfloat16(),
            "layer.weight": (torch.randn(128, 64, generator=g) * 0.02).half(),
            "layer.bias": torch.randn(128, generator=g),
            "norm": torch.ones(64, dtype=torch.bfloat16),
            "positions": torch.arange(40, dtype=torch.int32),
            "old": torch.zeros(5)}
    target = clone(base)
    for name in ("embed", "layer.weight", "layer.bias"):
        b = target[name].view(-1).view({2: torch.int16, 4: torch.int32}[target[name].element_size()])
        hit = torch.rand(b.numel(), generator=g) < fraction
        b[hit] += torch.randint(1, 4, (int(hit.sum()),), generator=g, dtype=b.dtype)
    target["positions"][7] = -1
    del target["old"]
    target["new"] = torch.full((3, 2), 2.5)
    return base, target


@pytest.mark.parametrize("values", CODINGS)
def test_decode_equals_numpy_comparison(values):
    base, target = step_states()
    patch = pulse.encode(base, target, base_version=4, target_version=5, values=values)
    held = clone(base)
    d = pulse.decode(patch, held)
    for name, t in base.items():  # the base is only read
        assert np.array_equal(bits(held[name]), bits(t))
    assert (d.base_version, d.target_version) == (4, 5)
    assert d.base_digest == pulse.digest(base) and d.target_digest == pulse.digest(target)
    for name in ("embed", "layer.weight", "layer.bias"):
        old, new = bits(base[name]), bits(target[name])
        expected = np.flatnonzero(old != new)
        c = d.changes[name]
        assert c.indices.dtype == torch.int64 and c.values.dtype == target[name].dtype
        assert np.array_equal(c.indices.numpy(), expected)
        assert np.array_equal(bits(c.values), new[expected])
        assert (c.dtype, c.shape) == ({torch.bfloat16: "BF16", torch.float16: "F16"}.get(base[name].dtype, "F32"),
                                      tuple(base[name].shape))
    assert set(d.changes) == {"embed", "layer.weight", "layer.bias"}  # norm is unchanged: not listed
    assert list(d.whole) == ["positions"] and torch.equal(d.whole["positions"], target["positions"])
    assert list(d.added) == ["new"] and torch.equal(d.added["new"], target["new"])
    assert d.removed == ["old"] and d.metadata is None and d.files == {} and not d.signed


@pytest.mark.parametrize("values", CODINGS)
def test_decoded_changes_scattered_with_index_copy(values):
    """What an engine does with the decoded patch: index_copy_ into its own tensors (on the GPU
    when there is one), then pulse.digest of them equals the patch's target digest."""
    base, target = step_states(seed=1)
    patch = pulse.encode(base, target, base_version=0, target_version=1, values=values)
    d = pulse.decode(patch, base)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    engine = {k: v.to(device, copy=True) for k, v in base.items()}
    for name, c in d.changes.items():
        engine[name].view(-1).index_copy_(0, c.indices.to(device), c.values.to(device))
    for name, t in d.whole.items():
        engine[name].copy_(t.to(device))
    for name in d.removed:
        del engine[name]
    engine.update({k: v.to(device) for k, v in d.added.items()})
    on_host = {k: v.cpu() for k, v in engine.items()}
    assert pulse.digest(on_host) == d.target_digest
    assert set(on_host) == set(target) and all(np.array_equal(bits(on_host[k]), bits(target[k])) for k in target)
    # Decoded.write does the same into a dict, and agrees with pulse.apply's transactional write
    written, applied = d.write(clone(base)), clone(base)
    pulse.apply(applied, patch)
    assert pulse.digest(written) == pulse.digest(applied) == d.target_digest


def test_decode_from_an_empty_base():
    target = {"a": torch.ones(3), "empty": torch.zeros(0, dtype=torch.bfloat16)}
    d = pulse.decode(pulse.encode({}, target, base_version=0, target_version=1), {})
    assert sorted(d.added) == ["a", "empty"] and d.changes == {} and d.target_digest == pulse.digest(target)
    assert pulse.digest(d.write({})) == d.target_digest


def test_decode_numpy_base():
    """A numpy base gives numpy values: its own dtype, and BF16 (no numpy dtype) as int16 bits."""
    base, target = step_states(seed=2)
    as_numpy = lambda s: {k: (pulse.Tensor("BF16", v.shape, v.view(torch.int16).numpy().copy()) if v.dtype == torch.bfloat16
                              else v.numpy().copy()) for k, v in s.items()}
    patch = pulse.encode(as_numpy(base), as_numpy(target), base_version=0, target_version=1, values="expclass")
    d = pulse.decode(patch, as_numpy(base))
    assert d.changes["embed"].values.dtype == np.int16 and d.changes["layer.weight"].values.dtype == np.float16
    assert d.changes["embed"].indices.dtype == np.int64
    state = d.write(as_numpy(base))
    assert pulse.digest(state) == d.target_digest == pulse.digest(target)


def test_decode_checks_everything_before_returning():
    base, target = step_states(seed=3)
    public, secret = pulse.generate_keypair()
    other_public, _ = pulse.generate_keypair()
    patch = pulse.encode(base, target, base_version=0, target_version=1, values="expclass", signing_key=secret)
    assert pulse.decode(patch, base, public_key=public).signed
    with pytest.raises(pulse.PatchError, match="signature"):
        pulse.decode(patch, base, public_key=other_public)
    unsigned = pulse.encode(base, target, base_version=0, target_version=1)
    with pytest.raises(pulse.PatchError, match="not signed"):
        pulse.decode(unsigned, base, public_key=public)
    moved = clone(base)
    moved["norm"][0] = 2  # a tensor the patch does not touch: the base digest still refuses it
    with pytest.raises(pulse.PatchError, match="not the patch's base"):
        pulse.decode(unsigned, moved)
    with pytest.raises(pulse.PatchError, match="layout"):
        pulse.decode(unsigned, target)
    # every single-byte corruption of a small patch: refused, one line
    small_base = {"w": (torch.randn(40) * 0.02).bfloat16()}
    small_target = clone(small_base)
    small_target["w"][3] += 0.01
    for values in CODINGS:
        p = pulse.encode(small_base, small_target, base_version=0, target_version=1, values=values)
        for i in range(len(p)):
            bad = bytearray(p)
            bad[i] ^= 0x41
            with pytest.raises(pulse.PatchError) as e:
                pulse.decode(bytes(bad), small_base)
            assert "\n" not in str(e.value)


@pytest.mark.skipif(not APP, reason="needs --app pulse-sync")
def test_decode_against_files_and_folders(tmp_path):
    """A base given as a path: a .safetensors file with metadata, and a model folder whose
    config.json changes, with patches written by pulse-sync encode."""
    base, target = step_states(seed=4)
    del target["new"]  # same layout: files keep one order
    target["old"] = base["old"]
    pulse.save(base, tmp_path / "a.safetensors", metadata={"format": "pt"})
    pulse.save(target, tmp_path / "b.safetensors", metadata={"format": "pt", "step": "1"})
    subprocess.run([APP, "encode", "--base", tmp_path / "a.safetensors", "--target", tmp_path / "b.safetensors",
                    "-o", tmp_path / "p.pulse", "--values", "expclass"], check=True, capture_output=True)
    patch = (tmp_path / "p.pulse").read_bytes()
    d = pulse.decode(patch, tmp_path / "a.safetensors")
    assert d.metadata == {"format": "pt", "step": "1"}
    state, meta = pulse.load(tmp_path / "a.safetensors", metadata=True)
    assert pulse.decode(patch, state, metadata=meta).target_digest == d.target_digest
    with pytest.raises(pulse.PatchError, match="not the patch's base"):
        pulse.decode(patch, state)  # without its metadata the base's digest differs
    d.write(state)
    assert all(np.array_equal(bits(state[k]), bits(target[k])) for k in target)

    for name, s, config in (("fa", base, b'{"v": 1}\n'), ("fb", target, b'{"v": 2}\n')):
        pulse.save(s, tmp_path / name, shards=2, files={"config.json": config})
    subprocess.run([APP, "encode", "--base", tmp_path / "fa", "--target", tmp_path / "fb", "-o", tmp_path / "f.pulse"],
                   check=True, capture_output=True)
    d = pulse.decode((tmp_path / "f.pulse").read_bytes(), tmp_path / "fa")
    assert d.files == {"config.json": b'{"v": 2}\n'}
    assert set(d.changes) == {"embed", "layer.weight", "layer.bias"}
    held = pulse.load(tmp_path / "fa")
    d.write(held)
    assert all(np.array_equal(bits(held[k]), bits(target[k])) for k in target)
    # a patch of the tensors alone (pulse.Sender's, pulse.encode's) decodes against the folder too
    sent = pulse.encode(pulse.load(tmp_path / "fa"), target, base_version=0, target_version=1)
    d = pulse.decode(sent, tmp_path / "fa")
    assert d.files == {} and d.target_digest == pulse.digest(target)


class Tied(torch.nn.Module):
    """A small LM whose head shares the embedding's weight (both in state_dict())."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(97, 32)
        self.mid = torch.nn.Linear(32, 32)
        self.head = torch.nn.Linear(32, 97, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x):
        return self.head(torch.tanh(self.mid(self.embed(x))))


@pytest.mark.parametrize("values", CODINGS)
def test_tied_weights_sender_receiver_round_trip(values):
    torch.manual_seed(0)
    trainer = Tied().to(torch.bfloat16)
    server = Tied().to(torch.bfloat16)
    server.load_state_dict(trainer.state_dict())
    assert list(trainer.state_dict()) == ["embed.weight", "mid.weight", "mid.bias", "head.weight"]
    sender = pulse.Sender(trainer.state_dict(), values=values)
    receiver = pulse.Receiver(server.state_dict())
    assert sender.aliases == receiver.aliases == {"head.weight": "embed.weight"}
    opt = torch.optim.AdamW(trainer.parameters(), lr=3e-3)
    for step in range(8):
        loss = torch.nn.functional.cross_entropy(trainer(torch.randint(0, 97, (16,))).float(), torch.randint(0, 97, (16,)))
        loss.backward()
        opt.step()
        opt.zero_grad()
        patch = sender.patch()
        assert pulse.inspect(patch)["total_changed"] > 0
        receiver.apply(patch)
        for (name, a), b in zip(trainer.state_dict().items(), server.state_dict().values()):
            assert np.array_equal(bits(a), bits(b)), (step, name)
    assert server.head.weight.data_ptr() == server.embed.weight.data_ptr()  # still tied
    assert receiver.version == 8
    # decode against the tied state names the alias, and writing the decoded changes keeps the tie
    before = clone(server.state_dict())
    with torch.no_grad():
        trainer.embed.weight[3, 4] += 1
    d = pulse.decode(sender.patch(), server.state_dict())
    assert d.aliases == {"head.weight": "embed.weight"} and set(d.changes) == {"embed.weight"}
    d.write(server.state_dict())
    assert pulse.digest(server.state_dict()) == d.target_digest
    assert not torch.equal(server.head.weight, before["head.weight"])


def test_tied_weights_one_digest_and_clear_refusals():
    w = torch.randn(10, 4)
    tied = {"a": w, "b": torch.ones(2), "c": w}
    assert pulse.digest(tied) == pulse.digest({"a": w, "b": torch.ones(2)})
    held = {"a": w.clone(), "b": torch.ones(2)}
    held["c"] = held["a"]
    target = {"a": w + 1, "b": torch.ones(2)}
    pulse.apply(held, pulse.encode({"a": w, "b": torch.ones(2)}, target, base_version=0, target_version=1))
    assert torch.equal(held["c"], w + 1)
    # a view of part of another tensor: refused at construction, one line
    partial = {"qkv": torch.zeros(12, 4)}
    partial["q"] = partial["qkv"][:4]
    for make in (pulse.Sender, pulse.Receiver):
        with pytest.raises(pulse.Error, match="share memory without being the same tensor") as e:
            make(partial)
        assert "\n" not in str(e.value)
    # a tie broken after construction: refused at the next patch, not left to fail silently
    state = {"a": torch.zeros(8), "b": torch.ones(3)}
    state["c"] = state["a"]
    sender, receiver = pulse.Sender(state), pulse.Receiver(clone(state))
    state["c"] = state["a"].clone()
    with pytest.raises(pulse.Error, match="'c' no longer shares memory with 'a'"):
        sender.patch()
    receiver.state["c"] = receiver.state["a"]
    with pytest.raises(pulse.Error, match="'c' now shares memory with 'a'"):
        receiver.apply(b"")


def test_receiver_refuses_a_dict_another_writer_changed():
    torch.manual_seed(1)
    sent = {"a": torch.randn(1000).bfloat16(), "b": torch.randn(50, 20), "c": torch.randn(7).half()}
    held = clone(sent)
    sender, receiver = pulse.Sender(sent), pulse.Receiver(held)
    sent["a"][:10] += 1
    receiver.apply(sender.patch())
    for writer in ("untouched", "touched", "replaced"):
        snapshot = clone(held)
        if writer == "untouched":
            held["b"][3, 3] += 1  # a tensor the next patch does not touch
        elif writer == "touched":
            held["a"][500] = 9
        else:
            held["c"] = torch.zeros(7, dtype=torch.half)  # a new tensor under the name
        sent["a"][20:30] += 1
        patch = sender.patch()
        with pytest.raises(pulse.PatchError, match="changed since") as e:
            receiver.apply(patch)
        assert "\n" not in str(e.value)
        changed = {"untouched": "b", "touched": "a", "replaced": "c"}[writer]
        assert f"tensor '{changed}'" in str(e.value)
        assert receiver.version == sender.version - 1
        held[changed] = snapshot[changed]  # the other writer's change undone: the patch applies
        assert all(np.array_equal(bits(held[k]), bits(snapshot[k])) for k in held)
        receiver.apply(patch)
        assert all(np.array_equal(bits(held[k]), bits(sent[k])) for k in sent)
    # a tensor replaced by an equal one is the same version: accepted, written into the new one
    held["b"] = held["b"].clone()
    sent["b"][0, 0] += 1
    receiver.apply(sender.patch())
    assert torch.equal(held["b"], sent["b"])


@pytest.mark.parametrize("values", ["keydiff", "expclass"])
def test_sender_without_copy_new_tensors_each_version(values):
    """Sender(copy=False) holds the version sent by reference: versions given as new tensors
    round-trip bit for bit; a sent version written in place is refused at the next patch."""
    torch.manual_seed(2)
    version = {"w": (torch.randn(400, 30) * 0.02).bfloat16(), "b": torch.randn(30), "n": torch.arange(6)}
    sender = pulse.Sender(version, values=values, copy=False)
    held = clone(version)
    receiver = pulse.Receiver(held)
    for step in range(5):
        new = clone(version)  # the trainer's next version, as new tensors
        new["w"].view(-1)[step::37] += 0.01
        new["b"][step] -= 1
        receiver.apply(sender.patch(new))
        assert all(np.array_equal(bits(held[k]), bits(new[k])) for k in new)
        version = new
    version["b"][0] = 5  # the version sent, written in place
    with pytest.raises(pulse.Error, match="'b' of version 5 was written after it was sent") as e:
        sender.patch()
    assert "\n" not in str(e.value) and sender.version == 5


@pytest.mark.parametrize("values", ["keydiff", "expclass"])
def test_threads_give_the_same_bytes_and_states(values):
    """threads=1, 2, 3: the same patch bytes (encode and Sender), the same applied state (apply and
    Receiver) and the same decoded changes; a tensor of 41M elements is 3 parts of 2^24."""
    g = torch.Generator().manual_seed(30)
    base = {"big": (torch.randn(5000, 8192, generator=g) * 0.02).bfloat16(), "small": torch.randn(100, generator=g),
            "step": torch.arange(4)}
    target = clone(base)
    b = target["big"].view(-1).view(torch.int16)
    hit = torch.rand(b.numel(), generator=g) < 0.01
    b[hit] += 1
    target["small"][3] += 1.0
    target["step"][0] = 7
    patches = [pulse.encode(base, target, base_version=0, target_version=1, values=values, threads=n) for n in (1, 2, 3)]
    assert patches[0] == patches[1] == patches[2]
    sent = [pulse.Sender(clone(base), values=values, threads=n).patch(clone(target)) for n in (1, 2, 3)]
    assert sent[0] == sent[1] == sent[2]
    for n in (1, 2, 3):
        state = clone(base)
        assert pulse.apply(state, patches[0], threads=n) == 1
        assert all(np.array_equal(bits(state[k]), bits(target[k])) for k in target)
        state = clone(base)
        pulse.Receiver(state, threads=n).apply(sent[0])
        assert all(np.array_equal(bits(state[k]), bits(target[k])) for k in target)
    one, two = pulse.decode(patches[0], base, threads=1), pulse.decode(patches[0], base, threads=2)
    assert sorted(one.changes) == sorted(two.changes) == ["big", "small"]
    for name in one.changes:
        assert np.array_equal(bits(one.changes[name].indices), bits(two.changes[name].indices))
        assert np.array_equal(bits(one.changes[name].values), bits(two.changes[name].values))
    for bad in (-1, 1.5, True):
        with pytest.raises(pulse.Error):
            pulse.encode(base, target, base_version=0, target_version=1, threads=bad)


@pytest.mark.parametrize("values", CODINGS)
def test_sender_compressed_copy_same_patches(values):
    """Sender(copy="compressed") keeps the version sent compressed: over steps written in place
    (every dtype, tensors of several 1 MiB chunks and a partial one, an empty one, a layout change)
    its patches are the bytes of pulse.encode from a copy of the version sent, at 1 and 2 threads,
    and the receiver follows bit for bit; LLM-like BF16 weights are kept in under 0.75 of their bytes."""
    g = torch.Generator().manual_seed(40)
    state = {"embed": (torch.randn(1500, 1003, generator=g) * 0.02).bfloat16(),  # 2.9 chunks
             "f32": torch.randn(300_001, generator=g), "f16": (torch.randn(777, generator=g) * 0.1).half(),
             "i64": torch.arange(40), "u8": torch.randint(0, 255, (70,), generator=g, dtype=torch.uint8),
             "mask": torch.rand(33, generator=g) < 0.5, "empty": torch.zeros(0, dtype=torch.bfloat16)}
    if hasattr(torch, "float8_e4m3fn"):
        state["fp8"] = torch.randn(5000, generator=g).to(torch.float8_e4m3fn)
    senders = [pulse.Sender(state, values=values, copy="compressed", threads=n) for n in (1, 2)]
    held = clone(state)
    receiver = pulse.Receiver(held)
    for step in range(4):
        sent = clone(state)
        for name in ("embed", "f32", "f16", "fp8"):
            if name in state:
                b = state[name].view(-1).view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[state[name].element_size()])
                hit = torch.rand(b.numel(), generator=g) < 0.01
                b[hit] += torch.randint(1, 4, (int(hit.sum()),), generator=g, dtype=b.dtype)
        state["i64"][step] = -step
        if step == 2:  # a layout change: one tensor removed, one added
            del state["u8"]
            state["new"] = torch.full((3, 5), 1.5)
        expected = pulse.encode(sent, state, base_version=step, target_version=step + 1, values=values)
        patches = [s.patch() for s in senders]
        assert patches[0] == patches[1] == expected, step
        receiver.apply(expected)
        assert all(np.array_equal(bits(held[k]), bits(state[k])) for k in state)
    embed_bytes = state["embed"].numel() * 2
    model = sum(t.numel() * t.element_size() for t in state.values())
    assert senders[0].kept_bytes < model and senders[0].kept_bytes - (model - embed_bytes) < 0.75 * embed_bytes
    with pytest.raises(pulse.Error, match="copy must be True, False or \"compressed\"") as e:
        pulse.Sender(state, copy="zstd")
    assert "\n" not in str(e.value)


def test_sender_receiver_peak_memory_at_most_twice_the_model():
    """Sender: the state and one copy of the version sent (2x the model), or the version sent and
    the new one (copy=False), plus the interpreter; with the copy compressed, under 1.8x; Receiver
    and decode: the state (1x).
    Measured in fresh processes on a 0.54 GB folder (sync_memory.py)."""
    env = dict(os.environ)
    probe = subprocess.run([sys.executable, "-c", "import resource, torch, pulse; "
                            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)"],
                           capture_output=True, text=True, check=True, env=env)
    interpreter = int(probe.stdout)
    r = subprocess.run([sys.executable, os.path.join(HERE, "sync_memory.py"), "--layout", "small"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    m = json.loads(r.stdout)
    model = m["model_gib"] * (1 << 30)
    for role, bound in (("sender", 2.0), ("sender_compressed", 1.8), ("sender_loads_reference", 2.0), ("receiver", 1.0),
                        ("decode", 1.0)):
        assert m[role]["rc"] == 0, m[role]
        extra = m["largest_tensor_gib"] * (1 << 30) if role not in ("sender", "sender_compressed") else 0  # a tensor read
        assert m[role]["peak_rss_gib"] * (1 << 30) <= bound * model + interpreter + extra + 64e6, (role, m, interpreter)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--app", help="pulse-sync binary")
    args = parser.parse_args()
    if args.app:
        os.environ["PULSE_SYNC_APP"] = args.app
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
