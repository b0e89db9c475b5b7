"""pulse: lossless sparse weight patches (PULSESync) for PyTorch and numpy states.

A state is a dict[str, tensor] of CPU torch tensors, numpy arrays or pulse.Tensor (any other
safetensors dtype as raw bytes). pulse reads and writes the tensors' memory in place, through the
buffer protocol, and releases the GIL while it encodes, applies and hashes. Everything is done
by pulse's C++ library (src/sync); the patch format is src/sync/FORMAT.md.

    patch = pulse.encode(before, after, base_version=0, target_version=1)
    pulse.apply(weights, patch)          # in place; pulse.PatchError leaves weights unchanged
"""
import dataclasses
import json
import os

import numpy as np

from . import _pulse
from ._pulse import Error, PatchError
from ._state import NUMPY_DTYPES, Tensor, entries, framework_of, state_from_entries, synced_entries, value

__all__ = ["Error", "PatchError", "Tensor", "diff", "encode", "apply", "decode", "digest", "inspect", "load", "save",
           "generate_keypair", "Sender", "Receiver", "Relay", "Decoded", "Changes", "SlicedApply"]


def _coding(values, indices, compressor, level, threads=0):
    # expclass codes positions and values together: its index coding goes with it unless named.
    if indices is None:
        indices = "expclass" if values == "expclass" else "gap-varint"
    return _pulse.Coding(values, indices, compressor, level, _threads(threads))


def _threads(threads):
    """threads= of encode, apply, decode, Sender and Receiver: the patch's parts coded or decoded
    at once (0 or None: every core). The bytes and the result do not depend on it."""
    if threads is None:
        return 0
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise Error(f"threads must be a count >= 0 (0: every core), not {threads!r}")
    return threads


def _key(key, size, what):
    """A key as bytes, or read from a key file (`pulse-sync keygen` writes raw key bytes)."""
    if key is None or isinstance(key, (bytes, bytearray)):
        return None if key is None else bytes(key)
    if isinstance(key, (str, os.PathLike)):
        with open(key, "rb") as f:
            data = f.read(size + 1)
        if len(data) != size:
            raise Error(f"{what} file {os.fspath(key)} holds {len(data)} bytes, not {size}")
        return data
    raise Error(f"{what} must be bytes or a key file path, not {type(key).__name__}")


def diff(base, target):
    """Per-tensor and per-dtype changed elements and sparsity between two states: the object of
    `pulse-sync diff --json` without its paths, {"tensors": [{name, dtype, elements, changed,
    sparsity_percent} or {name, dtype, status: "added" | "removed" | "re-declared"}, ...],
    "totals": {dtype: {elements, changed, sparsity_percent}}, "metadata_changed": False}."""
    return _pulse.diff(entries(base), entries(target))


def encode(base, target, *, base_version, target_version, values="keydiff", indices=None,
           compressor="zstd", level=3, signing_key=None, threads=0):
    """The patch from base to target as bytes (the same bytes `pulse-sync encode` writes, at any
    `threads`: the parts coded at once, 0 for every core). Tensors that share memory (tied
    weights) are synced once, under their first name."""
    return _pulse.encode(synced_entries(base)[0], synced_entries(target)[0], base_version, target_version,
                         _coding(values, indices, compressor, level, threads), _key(signing_key, 64, "signing_key"))


def apply(state, patch, *, public_key=None, threads=0):
    """Applies a patch to state in place. Transactional: everything is checked before the first
    write and the target digest after it; on any failure PatchError says why in one line and the
    tensors are unchanged. Tensors the patch adds or removes are added to or removed from the dict.
    Returns the patch's target version. threads: the parts decoded at once (0: every core)."""
    receiver = Receiver(state, threads=threads)
    receiver._apply(patch, _key(public_key, 32, "public_key"), rehash=False)  # hashed just now, by Receiver()
    return receiver.version


def digest(state):
    """The canonical xxh3-128 state digest (hex) that patches and `pulse-sync verify` use; tensors
    that share memory (tied weights) count once, under their first name, as pulse syncs them."""
    return _pulse.digest(synced_entries(state)[0])


def inspect(patch):
    """A patch's header: versions, digests, coding, stream sizes, per-dtype summary, layout change;
    the object of `pulse-sync inspect --json` (docs/pulse-sync.md)."""
    return _pulse.inspect(patch)


@dataclasses.dataclass
class Changes:
    """One tensor's changes in a decoded patch: `indices` the changed elements' flat (row-major)
    indices, int64, sorted; `values` their new values, in the tensor's dtype (torch tensors or
    numpy arrays as the base; a dtype neither has, as bits: the same-width integers). For
    `tensor.view(-1).index_copy_(0, indices, values)` on any device."""
    indices: object
    values: object
    dtype: str
    shape: tuple


@dataclasses.dataclass
class Decoded:
    """A patch decoded against a base state (pulse.decode); every check passed.

    changes: {name: Changes} of the sparse-coded tensors it changes; whole: {name: new tensor} of
    the base's tensors it carries whole; added: {name: tensor} it adds; removed: [names] it drops;
    metadata: the target's `__metadata__` when it changes it, else None; files: a model folder's
    other files it changes ({relative path: new bytes, None when removed}; base given as a
    folder); aliases: the base's tied tensors, {alias: name decoded} (written through the memory
    they share). target_digest is what pulse.digest gives for the patched state."""
    base_version: int
    target_version: int
    base_digest: str
    target_digest: str
    signed: bool
    changes: dict
    whole: dict
    added: dict
    removed: list
    metadata: object
    files: dict
    aliases: dict

    def write(self, tensors):
        """Writes the changes into a dict of tensors that holds the base (torch tensors on any
        device, numpy arrays, pulse.Tensor), in place: index_copy_ of each tensor's changes, the
        tensors carried whole copied in, added ones put in the dict (on the CPU), removed ones
        (and their aliases) taken out. Not transactional: check first with pulse.decode, then
        confirm with pulse.digest(tensors) == target_digest (CPU tensors)."""
        for name, c in self.changes.items():
            _scatter(name, tensors[name], c.indices, c.values)
        for name, new in self.whole.items():
            _copy_whole(name, tensors[name], new)
        for name in self.removed:
            tensors.pop(name, None)
            for alias in [a for a, of in self.aliases.items() if of == name]:
                tensors.pop(alias, None)
        tensors.update(self.added)
        return tensors


def _flat_view(name, t):
    torch = _state_torch_module()
    if torch is not None and isinstance(t, torch.Tensor):
        if not t.is_contiguous():
            raise Error(f"tensor {name} is not contiguous; Decoded.write writes it in place")
        return t.view(-1)
    data = t.data if isinstance(t, Tensor) else t
    if not isinstance(data, np.ndarray) or not data.flags.c_contiguous:
        raise Error(f"tensor {name}: Decoded.write writes C-contiguous torch tensors, numpy arrays or pulse.Tensor")
    return data.reshape(-1)


def _scatter(name, t, indices, values):
    torch = _state_torch_module()
    flat = _flat_view(name, t)
    if torch is not None and isinstance(flat, torch.Tensor):
        if not isinstance(values, torch.Tensor):  # bits of a dtype this torch lacks
            flat, values = flat.view(_torch_int(torch, flat.element_size())), torch.from_numpy(values)
        elif values.dtype != flat.dtype and values.element_size() == flat.element_size():
            values = values.view(flat.dtype)
        flat.index_copy_(0, indices.to(flat.device), values.to(flat.device))
        return
    if isinstance(values, np.ndarray) and values.dtype != flat.dtype:
        flat = flat.view(np.uint8).reshape(-1, values.itemsize).view(values.dtype).reshape(-1)
    flat[indices] = values


def _copy_whole(name, t, new):
    torch = _state_torch_module()
    flat = _flat_view(name, t)
    if torch is not None and isinstance(flat, torch.Tensor):
        src = new.reshape(-1) if isinstance(new, torch.Tensor) else torch.from_numpy(_bytes_of(new))
        if src.dtype != flat.dtype:
            flat, src = flat.view(torch.uint8), src.view(torch.uint8)
        flat.copy_(src.to(flat.device))
        return
    flat.view(np.uint8)[:] = _bytes_of(new)


def _bytes_of(v):
    torch = _state_torch_module()
    if isinstance(v, Tensor):
        v = v.data
    elif torch is not None and isinstance(v, torch.Tensor):
        v = v.reshape(-1).view(torch.uint8).numpy() if v.numel() else np.zeros(0, np.uint8)
    return np.ascontiguousarray(v).reshape(-1).view(np.uint8)


def _torch_int(torch, width):
    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[width]


def _state_torch_module():
    from ._state import _torch
    return _torch()


def _values(dtype, data, framework, like):
    """The new values of one tensor's changes (its bytes, `data`), in the tensor's dtype."""
    count = data.size // _ELEMENT_BYTES[dtype]
    if framework == "torch":
        v = value(dtype, (count,), data, "torch")
        if not isinstance(v, Tensor):
            return v
    if isinstance(like, np.ndarray) and like.dtype.itemsize == _ELEMENT_BYTES[dtype]:
        return data.view(like.dtype)  # numpy's dtype, or ml_dtypes' bfloat16
    if dtype in NUMPY_DTYPES:
        return data.view(NUMPY_DTYPES[dtype])
    return data.view({1: np.uint8, 2: np.int16, 4: np.int32}[_ELEMENT_BYTES[dtype]])  # bits


_ELEMENT_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E4M3FNUZ": 1, "F8_E5M2FNUZ": 1,
                  "F8_E8M0": 1}  # the dtypes a patch codes sparsely (sync::is_sparse_dtype)


def decode(patch, base, *, metadata=None, public_key=None, framework=None, threads=0):
    """The changes a patch makes to `base`, decoded without writing anything, as a Decoded: per
    tensor it changes, the flat indices (int64) and new values, to scatter into tensors pulse
    does not hold (GPU parameters: `p.view(-1).index_copy_(0, c.indices.cuda(), c.values.cuda())`,
    an inference engine's weight loader), and the tensors it carries whole, adds and removes.

    base: the receiver's state, which the patch's codings read (expclass codes each change in the
    context of the old weight): a dict of CPU torch tensors / numpy arrays / pulse.Tensor, or a
    .safetensors file or model folder path (read as pulse.load reads it: the state with its
    metadata and a folder's files, as pulse-sync's patches cover it, else the tensors alone, as
    pulse.Sender's do). metadata: a dict base's `__metadata__` when the patch's states have one (a patch
    of pulse-sync encode on files: pulse.load(..., metadata=True)). Everything apply checks is
    checked before anything is returned: structure, sizes, checksum, the signature (given
    public_key, an unsigned patch is refused), the base's layout and digest, every index and
    value, and the target state digest of base + changes; a failure raises PatchError in one line.
    Values are torch tensors when the base holds torch tensors (or framework="torch"), else numpy."""
    key = _key(public_key, 32, "public_key")
    if isinstance(base, (str, os.PathLike)):
        items, meta = _pulse.load(os.fspath(base))
        aliases, like = {}, {}
        framework = framework or ("torch" if _state_torch() else "numpy")
        try:  # the state pulse-sync's patches cover: metadata and a folder's files included
            r = _pulse.decode(items, meta if metadata is None else metadata, patch, key, _threads(threads))
        except PatchError as whole_state:
            tensors = [e for e in items if not e[0].startswith(FILE_PREFIX)]
            try:  # the tensors alone, as pulse.Sender's patches cover them
                r = _pulse.decode(tensors, metadata or {}, patch, key, _threads(threads))
            except PatchError:
                raise whole_state from None
    else:
        flat, aliases = synced_entries(base)
        like = {name: (v.data if isinstance(v, Tensor) else v) for name, v in base.items()}
        framework = framework or framework_of(base)
        r = _pulse.decode(flat, metadata or {}, patch, key, _threads(threads))
    changes, whole, added, files = {}, {}, {}, {}
    for name, dtype, shape, indices, data in r["changes"]:
        indices = indices.view(np.int64)
        values = _values(dtype, data, framework, like.get(name))
        if framework == "torch":
            import torch
            indices = torch.from_numpy(indices)
            if isinstance(values, np.ndarray):
                values = torch.from_numpy(values)
        changes[name] = Changes(indices, values, dtype, tuple(shape))
    for out, key in ((whole, "whole"), (added, "added")):
        for name, dtype, shape, data in r[key]:
            if name.startswith(FILE_PREFIX):
                files[name[len(FILE_PREFIX):]] = bytes(data)
            else:
                out[name] = value(dtype, shape, data, framework)
    removed = []
    for name in r["removed"]:
        if name.startswith(FILE_PREFIX):
            files.setdefault(name[len(FILE_PREFIX):], None)
        else:
            removed.append(name)
    return Decoded(r["base_version"], r["target_version"], r["base_digest"], r["target_digest"], r["signed"], changes,
                   whole, added, removed, r["metadata"], files, aliases)


def _layout_entry(name, t):
    """(name, dtype, shape) of a layout entry: a (dtype, shape) pair or any tensor (torch meta too)."""
    if isinstance(t, tuple) and len(t) == 2 and isinstance(t[0], str):
        return (name, t[0], tuple(int(d) for d in t[1]))
    torch = _state_torch_module()
    if torch is not None and isinstance(t, torch.Tensor):
        return (name, entries({name: torch.empty(0, dtype=t.dtype)})[0][1], tuple(t.shape))
    return entries({name: t})[0][:3]


def _slice_buffer(name, t):
    """A writable numpy view of a slice's memory (rows may be apart: a column slice of a wider buffer)."""
    torch = _state_torch_module()
    if torch is not None and isinstance(t, torch.Tensor):
        if t.device.type != "cpu":
            raise Error(f"slice of tensor {name} is on {t.device}; SlicedApply writes CPU tensors")
        t = t.detach()
        if t.dtype.is_floating_point and t.dtype not in (torch.float16, torch.float32, torch.float64):
            t = t.view(getattr(torch, {1: "uint8", 2: "int16"}[t.element_size()]))
        return t.numpy()
    if isinstance(t, Tensor):
        return t.data
    if isinstance(t, np.ndarray):
        return t.view(np.int16) if t.dtype.name == "bfloat16" else t
    raise Error(f"slice of tensor {name}: {type(t).__name__} is not a torch tensor, numpy array or pulse.Tensor")


class SlicedApply:
    """A resharding receiver's share of applying a patch (tensor parallel): this process holds
    slices of some tensors, writes the patch's changes into them in place, and verifies the
    whole state together with the other processes through one integer SUM all-reduce:

        a = pulse.SlicedApply(patch, layout, [("w", w_rows, ("rows", 0, 512))])
        summed = a.partial.clone(); torch.distributed.all_reduce(summed)   # SUM of int64
        a.finish(summed)   # PatchError (one line) on every process if any check fails; all roll back

    layout is every tensor of the state, the same on every process: {name: tensor} (meta tensors
    do) or {name: (dtype, shape)} or [(name, dtype, shape)]. A slice is (name, tensor, spec), spec
    ("rows", begin, end), ("cols", begin, end) or ("flat", begin, end) of the tensor seen as
    [shape[0], numel / shape[0]]; the tensor is a CPU buffer of those elements, C-contiguous (a
    column slice may be a view of a wider buffer, e.g. a fused tensor's). Slices must begin and
    end on the 128-byte grid of the tensor digest. Every element of the layout must be held by
    exactly one process. The patch must keep the layout (keydiff or raw values for any slicing).

    A process that refuses the patch does not raise here, so that every process reaches the
    all-reduce: .error says why, its .partial tells the others, and finish raises on every
    process. .partial is int64 (a torch tensor when the slices are torch tensors); rollback()
    puts this process's slices back (before finish)."""

    def __init__(self, patch, layout, slices, *, metadata=None, public_key=None, threads=0):
        items = layout.items() if isinstance(layout, dict) else [(n, (d, s)) for n, d, s in layout]
        lay = [_layout_entry(n, t) for n, t in items]
        torch = _state_torch_module()
        self._torch = torch is not None and any(isinstance(t, torch.Tensor) for _, t, _ in slices)
        pieces = []
        for name, t, spec in slices:
            kind, begin, end = spec
            pieces.append((name, _slice_buffer(name, t), kind, int(begin), int(end)))
        key = _key(public_key, 32, "public_key")
        patch = patch if isinstance(patch, (bytes, bytearray, memoryview)) else _bytes_of(patch)
        self._impl = _pulse.SlicedApply(patch, lay, pieces, dict(metadata or {}), key, _threads(threads))
        self._slices = slices  # their memory is written until finish

    @property
    def partial(self):
        p = self._impl.partial()
        return _state_torch_module().from_numpy(p) if self._torch else p

    @property
    def error(self):
        """This process's refusal (one line), or None."""
        return self._impl.error

    @property
    def written(self):
        """Elements this process changed."""
        return self._impl.written

    def finish(self, summed):
        torch = _state_torch_module()
        if torch is not None and isinstance(summed, torch.Tensor):
            summed = summed.cpu().numpy()
        self._impl.finish(np.ascontiguousarray(summed, dtype=np.int64))

    def rollback(self):
        self._impl.rollback()


def generate_keypair():
    """(public_key, secret_key) bytes for signing patches and relay state (Ed25519)."""
    return _pulse.generate_keypair()


FILE_PREFIX = "__file__/"  # a model folder's other files in pulse's flat state (src/sync/FORMAT.md)
INDEX_NAME = "model.safetensors.index.json"


class FolderFiles(dict):
    """load(files=True)'s {relative path: bytes}, which also remembers the folder's index and
    shard metadata, so that save(state, path, files=files) lays the shards out as they were
    (same shards, same tensor order, same `__metadata__`, the index kept byte for byte) while
    the state still has exactly the index's tensors."""

    def __init__(self, files, index=None, metadata=None):
        super().__init__(files)
        self.index = index
        self.metadata = dict(metadata or {})

    def layout_for(self, state_names):
        """(index bytes, shard metadata) to keep for a state of these tensor names, or (None,
        the metadata every shard had) when the tensors are no longer the index's."""
        if self.index is not None:
            try:
                weight_map = json.loads(self.index)["weight_map"]
            except (ValueError, KeyError, TypeError):
                weight_map = None
            if isinstance(weight_map, dict) and set(weight_map) == set(state_names):
                return self.index, self.metadata
        return None, {k: v for k, v in self.metadata.items() if not k.startswith("__shard__/")}


def load(path, *, framework=None, metadata=False, files=False):
    """A state from a .safetensors file (or .safetensors.zst) or a Hugging Face model folder
    (shards named by model.safetensors.index.json, or one model.safetensors; tensors matched by
    name across shards): torch tensors when torch is imported (framework="torch"), else numpy
    arrays; each tensor owns its slice of the file's bytes, read once.

    metadata=True also returns the __metadata__ dict (of a folder: the pairs every shard has,
    the others as "__shard__/<file>/<key>"); files=True also returns the folder's other files as
    {relative path: bytes} (config.json, tokenizer files, ...; not the index, which save writes),
    a FolderFiles that also keeps the index and shard metadata: save(state, path, files=files)
    then writes the folder as it was, byte for byte where nothing changed.
    Returns state, or a tuple (state, metadata?, files?) in that order."""
    items, meta = _pulse.load(os.fspath(path))
    other = {name[len(FILE_PREFIX):]: bytes(data) for name, _, _, data in items if name.startswith(FILE_PREFIX)}
    items = [item for item in items if not item[0].startswith(FILE_PREFIX)]
    other = FolderFiles(other, other.pop(INDEX_NAME, None), meta)
    state = state_from_entries(items, framework or ("torch" if _state_torch() else "numpy"))
    out = (state,) + ((meta,) if metadata else ()) + ((other,) if files else ())
    return out if len(out) > 1 else state


def save(state, path, *, metadata=None, files=None, max_shard_bytes=None, shards=None):
    """Writes state atomically (tensors in dict order) to a .safetensors file, or to a Hugging
    Face model folder when path is an existing folder or files, max_shard_bytes or shards is
    given.

    A folder gets shards as save_pretrained writes them: model-0000k-of-0000n.safetensors, at
    most max_shard_bytes each (a larger tensor gets a shard of its own) or `shards` files of
    about equal size, and model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map"});
    one shard is model.safetensors without an index. metadata goes into every shard. files is
    {relative path: bytes or str}; load(..., files=True)'s (a FolderFiles) also brings back the
    loaded folder's shards, index and metadata when neither max_shard_bytes nor shards is given
    and the state holds exactly the index's tensors (metadata, when given, replaces the
    metadata). Without files, an existing folder keeps its other files. The folder is written whole beside the old one and swapped in,
    so it holds either its old content or all of the new."""
    path = os.fspath(path)
    if files is None and max_shard_bytes is None and shards is None and not os.path.isdir(path):
        _pulse.save(entries(state), path, metadata or {})
        return
    if files is None:
        files = _other_files(path) if os.path.isdir(path) and _holds_model(path) else {}
    flat = entries(state)
    for name, _, _, _ in flat:
        if name.startswith(FILE_PREFIX) or name.startswith("__shard__/"):
            raise Error(f"tensor {name}: the prefixes {FILE_PREFIX} and __shard__/ are reserved for model folders")
    kept_index = None
    if isinstance(files, FolderFiles) and max_shard_bytes is None and shards is None:
        kept_index, kept_metadata = files.layout_for(name for name, _, _, _ in flat)
        if metadata is None:
            metadata = kept_metadata
    groups = [flat[:]] if kept_index is not None else _shard_groups(flat, max_shard_bytes, shards)
    carried = {}
    for rel, data in files.items():
        if rel == INDEX_NAME or ("/" not in rel and rel.endswith(".safetensors")):
            raise Error(f"files: {rel} is written by pulse.save from the state, not passed in files")
        carried[rel] = data.encode() if isinstance(data, str) else bytes(data)
    if kept_index is not None:
        carried[INDEX_NAME] = kept_index  # the C++ side lays the shards out as it says
    elif len(groups) > 1:
        weight_map = {}
        for k, group in enumerate(groups):
            weight_map.update({name: f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors" for name, _, _, _ in group})
        total = sum(_nbytes(e) for e in flat)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        carried[INDEX_NAME] = (json.dumps(index, indent=2, sort_keys=True) + "\n").encode()
    for rel, data in sorted(carried.items()):
        array = np.frombuffer(data, dtype=np.uint8) if data else np.zeros(0, np.uint8)
        flat.append((FILE_PREFIX + rel, "U8", (len(data),), array))
    _pulse.save_folder(flat, path, metadata or {})


def _nbytes(entry):
    return int(entry[3].nbytes)


def _shard_groups(flat, max_shard_bytes, shards):
    """Tensors in dict order into shards: a new shard when the next tensor would pass
    max_shard_bytes, or `shards` groups of about equal bytes."""
    if max_shard_bytes is not None and shards is not None:
        raise Error("save: give max_shard_bytes or shards, not both")
    groups = [[]]
    if max_shard_bytes is not None:
        if max_shard_bytes <= 0:
            raise Error(f"save: max_shard_bytes must be positive, not {max_shard_bytes}")
        size = 0
        for e in flat:
            if groups[-1] and size + _nbytes(e) > max_shard_bytes:
                groups.append([])
                size = 0
            groups[-1].append(e)
            size += _nbytes(e)
    elif shards is not None:
        if shards < 1:
            raise Error(f"save: shards must be at least 1, not {shards}")
        total = sum(_nbytes(e) for e in flat) or 1
        groups = [[] for _ in range(shards)]
        acc = 0
        for e in flat:
            groups[min(shards - 1, acc * shards // total)].append(e)
            acc += _nbytes(e)
        groups = [g for g in groups if g] or [[]]
    else:
        groups = [flat[:]]
    return groups


def _holds_model(path):
    return any(f.endswith(".safetensors") for f in os.listdir(path))


def _other_files(folder):
    """A model folder's files but its top-level shards and index, as load(files=True) gives them."""
    out = {}
    for root, _, names in os.walk(folder, followlinks=True):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/")
            if rel != INDEX_NAME and not ("/" not in rel and rel.endswith(".safetensors")):
                with open(os.path.join(root, name), "rb") as f:
                    out[rel] = f.read()
    return out


def _state_torch():
    return _state_torch_module() is not None


def _mirror_layout(state, change, framework, aliases):
    """Mirrors a committed patch's added and removed tensors in the dict (a removed tensor's
    aliases go with it)."""
    for name in change["removed"]:
        state.pop(name, None)
        for alias in [a for a, of in aliases.items() if of == name]:
            state.pop(alias, None)
            del aliases[alias]
    state.update(state_from_entries(change["added"], framework))


def _same_ties(state, aliases, who, writable=False):
    """The state's entries to sync, refused in one line when its tied tensors are not the ones
    seen at construction (the patches' layout would change under the peer)."""
    flat, now = synced_entries(state, writable)
    if now != aliases:
        gone = sorted(set(aliases.items()) - set(now.items()))
        new = sorted(set(now.items()) - set(aliases.items()))
        what = (f"'{gone[0][0]}' no longer shares memory with '{gone[0][1]}'" if gone else
                f"'{new[0][0]}' now shares memory with '{new[0][1]}'")
        raise Error(f"{who}: tensor {what}, unlike at construction; build a new {who} for the new layout")
    return flat


class Sender:
    """The trainer's side: holds the last version sent and its digests, and `patch()` after each
    optimizer step returns the patch from that version to the state now.

    copy=True (the default): the Sender keeps a copy of the version sent, so the trainer writes
    the next version into the same tensors (state and copy: 2x the model). copy="compressed": the
    same, the copy kept compressed (each tensor's sign-and-exponent bytes zstd-compressed, the
    mantissa bytes as they are: about 0.7x of LLM-like BF16 weights, so state and copy take about
    1.7x), for CPU time at each patch (the copy is read back and the new version compressed;
    `threads` of them at once); the patches are the same bytes. copy=False: it keeps
    the tensors of the version sent themselves, for a trainer that makes each version as new
    tensors (`patch(new_state)`, e.g. a checkpoint it loads or casts): the two versions, 2x, and no
    copy. Writing a sent version in place is then refused at the next patch (it is hashed again).
    `kept_bytes`: the bytes the Sender holds of the version sent.
    Tensors that share memory (tied weights: both names in state_dict(), one storage) are synced
    once, under the first name in the dict; `aliases` names the others ({alias: name synced})."""

    _KEPT = {True: "copy", "compressed": "compressed", False: "reference"}

    def __init__(self, state, *, version=0, values="keydiff", indices=None, compressor="zstd", level=3,
                 signing_key=None, copy=True, threads=0):
        if not any(copy is k or (isinstance(copy, str) and copy == k) for k in self._KEPT):
            raise Error(f"Sender: copy must be True, False or \"compressed\", not {copy!r}")
        kept = self._KEPT[copy]
        self.state = state
        self._coding = _coding(values, indices, compressor, level, threads)
        self._key = _key(signing_key, 64, "signing_key")
        flat, self.aliases = synced_entries(state)
        self._sender = _pulse.Sender(flat, version, kept, _threads(threads))
        self._sent = flat if kept == "reference" else None  # the version sent, held by reference

    @property
    def kept_bytes(self):
        return self._sender.kept_bytes

    @property
    def version(self):
        return self._sender.version

    def patch(self, state=None):
        """The patch from the version sent to `state` (given: it becomes self.state), or to
        self.state as it is now."""
        if state is not None:
            self.state = state
        flat = _same_ties(self.state, self.aliases, "Sender")
        patch = self._sender.patch(flat, self._sent, self._coding, self._key)
        if self._sent is not None:
            self._sent = flat
        return patch


class Receiver:
    """The inference side: applies each patch to its state in place (transactionally, see apply).
    Before each patch it checks that the state is still the version it last wrote (every tensor
    hashed, on every core), so a dict that another writer changed is refused in one line instead
    of diverging silently from the sender (every byte: torch's version counters miss writes
    through .data or numpy views). Tensors that share memory (tied weights) are received
    once, under the first name in the dict, and written through their shared memory; `aliases`
    names the others ({alias: name received})."""

    def __init__(self, state, *, version=0, public_key=None, threads=0):
        self.state = state
        self._key = _key(public_key, 32, "public_key")
        flat, self.aliases = synced_entries(state)
        self._receiver = _pulse.Receiver(flat, version, _threads(threads))

    @property
    def version(self):
        return self._receiver.version

    def apply(self, patch, *, public_key=None):
        key = _key(public_key, 32, "public_key") if public_key is not None else self._key
        return self._apply(patch, key, rehash=True)

    def _apply(self, patch, key, rehash):
        flat = _same_ties(self.state, self.aliases, "Receiver", writable=True)
        change = self._receiver.apply(flat, patch, key, rehash)
        if change["removed"] or change["added"]:
            _mirror_layout(self.state, change, framework_of(self.state), self.aliases)
        return change["written"]


@dataclasses.dataclass
class Pull:
    version: int
    state: dict
    fast_path: bool
    patches_applied: int
    anchor: int
    fallback: str
    metadata: dict


class Relay:
    """A relay folder (shared filesystem) as `pulse-sync publish` and `pull` use it."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self._relay = _pulse.Relay(self.path)

    def head(self, *, public_key=None):
        """{"version", "state", "signed"} of HEAD, or None when nothing is published."""
        return self._relay.head(_key(public_key, 32, "public_key"))

    def publish(self, version, state, previous=None, *, anchor_every=10, keep_anchors=2, compress_anchors=False,
                signing_key=None, values="keydiff", indices=None, compressor="zstd", level=3):
        """Publishes state as `version`: a patch from `previous` (the head version's weights) when
        given, an anchor every anchor_every versions, then HEAD."""
        previous = None if previous is None else synced_entries(previous)[0]
        self._relay.publish(version, synced_entries(state)[0], previous, anchor_every,
                            keep_anchors, compress_anchors, _coding(values, indices, compressor, level),
                            _key(signing_key, 64, "signing_key"))

    def pull(self, state=None, version=None, *, public_key=None, min_version=0, framework=None):
        """Brings `state` (at `version`) to HEAD: patches from it (fast path) or the newest anchor
        (slow path); the result is a new state, its digest checked against HEAD. A state needs its
        version: taken as 0, any older HEAD (a rollback) would be accepted."""
        if state is not None and version is None:
            raise ValueError("Relay.pull: give the version of `state` (pull(state, version)); without it an older "
                             "HEAD could not be refused")
        version = 0 if version is None else version
        items, info = self._relay.pull(None if state is None else synced_entries(state)[0], version,
                                       _key(public_key, 32, "public_key"), min_version)
        framework = framework or (framework_of(state) if state else ("torch" if _state_torch() else "numpy"))
        return Pull(state=state_from_entries(items, framework), **info)
