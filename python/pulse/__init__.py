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
from ._state import Tensor, entries, framework_of, state_from_entries

__all__ = ["Error", "PatchError", "Tensor", "diff", "encode", "apply", "digest", "inspect", "load", "save",
           "generate_keypair", "Sender", "Receiver", "Relay"]


def _coding(values, indices, compressor, level):
    # expclass codes positions and values together: its index coding goes with it unless named.
    if indices is None:
        indices = "expclass" if values == "expclass" else "gap-varint"
    return _pulse.Coding(values, indices, compressor, level)


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
    """Per-tensor and per-dtype changed elements and sparsity between two states:
    {"tensors": {name: {dtype, elements, changed, sparsity, differs}}, "dtypes": {dtype: {elements,
    changed, sparsity}}, "added": [...], "removed": [...]}."""
    return _pulse.diff(entries(base), entries(target))


def encode(base, target, *, base_version, target_version, values="keydiff", indices=None,
           compressor="zstd", level=3, signing_key=None):
    """The patch from base to target as bytes (the same bytes `pulse-sync encode` writes)."""
    return _pulse.encode(entries(base), entries(target), base_version, target_version,
                         _coding(values, indices, compressor, level), _key(signing_key, 64, "signing_key"))


def apply(state, patch, *, public_key=None):
    """Applies a patch to state in place. Transactional: everything is checked before the first
    write and the target digest after it; on any failure PatchError says why in one line and the
    tensors are unchanged. Tensors the patch adds or removes are added to or removed from the dict.
    Returns the patch's target version."""
    receiver = Receiver(state)
    receiver.apply(patch, public_key=public_key)
    return receiver.version


def digest(state):
    """The canonical xxh3-128 state digest (hex) that patches and `pulse-sync verify` use."""
    return _pulse.digest(entries(state))


def inspect(patch):
    """A patch's header: versions, digests, coding, stream sizes, per-dtype summary, layout change."""
    return _pulse.inspect(patch)


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
    from ._state import _torch
    return _torch() is not None


def _mirror_layout(state, change, framework):
    """Mirrors a committed patch's added and removed tensors in the dict."""
    for name in change["removed"]:
        state.pop(name, None)
    state.update(state_from_entries(change["added"], framework))


class Sender:
    """The trainer's side: holds the last version sent (a copy of its bytes and its digests), and
    `patch()` after each optimizer step returns the patch from that version to the state now."""

    def __init__(self, state, *, version=0, values="keydiff", indices=None, compressor="zstd", level=3,
                 signing_key=None):
        self.state = state
        self._coding = _coding(values, indices, compressor, level)
        self._key = _key(signing_key, 64, "signing_key")
        self._sender = _pulse.Sender(entries(state), version)

    @property
    def version(self):
        return self._sender.version

    def patch(self):
        return self._sender.patch(entries(self.state), self._coding, self._key)


class Receiver:
    """The inference side: applies each patch to its state in place (transactionally, see apply)
    and keeps the state's digests, so a patch hashes only the tensors it touches. It assumes it
    is the only writer of the state."""

    def __init__(self, state, *, version=0, public_key=None):
        self.state = state
        self._key = _key(public_key, 32, "public_key")
        self._receiver = _pulse.Receiver(entries(state), version)

    @property
    def version(self):
        return self._receiver.version

    def apply(self, patch, *, public_key=None):
        key = _key(public_key, 32, "public_key") if public_key is not None else self._key
        change = self._receiver.apply(entries(self.state, writable=True), patch, key)
        if change["removed"] or change["added"]:
            _mirror_layout(self.state, change, framework_of(self.state))
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
        self._relay.publish(version, entries(state), None if previous is None else entries(previous), anchor_every,
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
        items, info = self._relay.pull(None if state is None else entries(state), version,
                                       _key(public_key, 32, "public_key"), min_version)
        framework = framework or (framework_of(state) if state else ("torch" if _state_torch() else "numpy"))
        return Pull(state=state_from_entries(items, framework), **info)
