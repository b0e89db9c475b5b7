"""pulse.SlicedApply under torch.distributed (gloo, CPU): receivers that hold row, column and
flat slices of BF16 tensors apply a keydiff patch of the full state, all-reduce their partial
sums with SUM and finish; every slice must equal the target's bytes, and a wrong base on one
process must leave every process's slices as they were."""
import json
import os
import sys
import tempfile

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import pulse

SHAPES = {"attn.q": (64, 256), "mlp.up": (32, 256), "norm": (1024,), "embed": (16, 128)}


def states():
    g = torch.Generator().manual_seed(7)
    base = {n: torch.randn(s, generator=g).bfloat16() for n, s in SHAPES.items()}
    target = {}
    for n, t in base.items():
        t2 = t.clone().reshape(-1)
        idx = torch.randperm(t2.numel(), generator=g)[: max(1, t2.numel() // 50)]
        t2[idx] = (t2[idx].float() * 1.01 + 0.001).bfloat16()
        target[n] = t2.reshape(t.shape)
    return base, target


def pieces(world, rank):
    """(name, spec) this rank holds: attn.q by rows, mlp.up by columns, norm flat, embed whole on rank 0."""
    out = [("attn.q", ("rows", 64 // world * rank, 64 // world * (rank + 1))),
           ("mlp.up", ("cols", 256 // world * rank, 256 // world * (rank + 1))),
           ("norm", ("flat", 1024 // world * rank, 1024 // world * (rank + 1)))]
    if rank == 0:
        out.append(("embed", ("rows", 0, 16)))
    return out


def cut(t, spec):
    kind, b, e = spec
    if kind == "rows":
        return t[b:e]
    if kind == "cols":
        return t[:, b:e]
    return t.reshape(-1)[b:e]


def slices_of(base, world, rank):
    """Each piece copied out of base; a column piece lives in a wider buffer (rows apart)."""
    out = []
    for name, spec in pieces(world, rank):
        piece = cut(base[name], spec)
        if spec[0] == "cols":
            wide = torch.zeros(piece.shape[0], piece.shape[1] + 64, dtype=piece.dtype)
            wide[:, : piece.shape[1]] = piece
            buf = wide[:, : piece.shape[1]]
        else:
            buf = piece.clone()
        out.append((name, buf, spec))
    return out


def bits(t):
    return t.contiguous().view(torch.int16).numpy().tobytes()


def run_rank(rank, world, init, patch, wrong_rank, out_dir):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    base, target = states()
    slices = slices_of(base, world, rank)
    if rank == wrong_rank:
        slices[0][1].view(-1)[3] += 1  # this receiver's base differs
    before = [bits(buf) for _, buf, _ in slices]
    layout = {n: torch.empty(t.shape, dtype=t.dtype, device="meta") for n, t in base.items()}
    a = pulse.SlicedApply(patch, layout, slices, threads=1)
    summed = a.partial.clone()
    dist.all_reduce(summed)  # SUM
    result = {"error": None}
    try:
        a.finish(summed)
    except pulse.PatchError as e:
        result["error"] = str(e)
    result["target"] = all(bits(buf) == bits(cut(target[n], spec)) for n, buf, spec in slices)
    result["before"] = all(bits(buf) == b for (_, buf, _), b in zip(slices, before))
    result["written"] = a.written
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


def spawn(world, wrong_rank):
    base, target = states()
    patch = pulse.encode(base, target, base_version=0, target_version=1, values="keydiff")
    with tempfile.TemporaryDirectory() as d:
        init = "file://" + os.path.join(d, "rendezvous")
        mp.spawn(run_rank, args=(world, init, patch, wrong_rank, d), nprocs=world, join=True)
        return [json.load(open(os.path.join(d, f"{r}.json"))) for r in range(world)]


@pytest.mark.parametrize("world", [2, 4])
def test_gloo_slices_reach_target(world):
    results = spawn(world, -1)
    for r in results:
        assert r["error"] is None and r["target"], r
    assert sum(r["written"] for r in results) > 0


@pytest.mark.parametrize("world", [2, 4])
def test_gloo_wrong_base_rolls_back_everywhere(world):
    results = spawn(world, world - 1)
    for r in results:
        assert r["error"] and "\n" not in r["error"] and "base version" in r["error"], r
        assert r["before"] and not r["target"], r


def test_refusal_reaches_every_rank():
    """Simulated ranks (partials summed here): one rank's slices overlap, so it refuses; every
    rank's finish raises and the others roll back."""
    base, target = states()
    patch = pulse.encode(base, target, base_version=0, target_version=1, values="keydiff")
    layout = [(n, "BF16", t.shape) for n, t in base.items()]
    ranks = [slices_of(base, 2, r) for r in range(2)]
    ranks[1].append(("attn.q", ranks[1][0][1].clone(), ranks[1][0][2]))  # held twice
    before = [[bits(b) for _, b, _ in s] for s in ranks]
    applies = [pulse.SlicedApply(patch, layout, s) for s in ranks]
    assert applies[0].error is None and "overlap" in applies[1].error
    summed = sum(a.partial for a in applies)
    for a in applies:
        with pytest.raises(pulse.PatchError, match="refused|overlap"):
            a.finish(summed)
    assert [[bits(b) for _, b, _ in s] for s in ranks] == before


def test_numpy_slices_and_carries():
    """numpy buffers, ranks simulated: partial words stay below 2^32 and their sum carries."""
    base, target = states()
    patch = pulse.encode(base, target, base_version=0, target_version=1, values="keydiff")
    nb = {n: t.view(torch.int16).numpy().copy() for n, t in base.items()}
    layout = [(n, "BF16", t.shape) for n, t in base.items()]
    ranks = [[(n, pulse.Tensor("BF16", cut(torch.from_numpy(nb[n]), s).shape,
                               np.ascontiguousarray(cut(torch.from_numpy(nb[n]), s).numpy())), s)
              for n, s in pieces(4, r)] for r in range(4)]
    applies = [pulse.SlicedApply(patch, layout, s) for s in ranks]
    parts = [a.partial for a in applies]
    assert all(isinstance(p, np.ndarray) and p.dtype == np.int64 and p.min() >= 0 and p.max() < 2**32 for p in parts)
    summed = np.sum(parts, axis=0)
    assert summed.max() >= 2**32  # digests' limbs carry
    for a in applies:
        a.finish(summed)
    for r, s in enumerate(ranks):
        for n, t, spec in s:
            assert t.data.tobytes() == bits(cut(target[n], spec))
    with pytest.raises(pulse.PatchError, match="finished"):
        applies[0].rollback()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
