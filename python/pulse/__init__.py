"""pulse: lossless sparse weight patches (PULSESync) for PyTorch and numpy states.

A state is a dict[str, tensor] of CPU torch tensors, numpy arrays or pulse.Tensor (any other
safetensors dtype as raw bytes). pulse reads and writes the tensors' memory in place, through the
buffer protocol, and releases the GIL while it encodes, applies and hashes. Everything is done
by pulse's C++ library (src/sync); the patch format is src/sync/FORMAT.md.

    patch = pulse.encode(before, after, base_version=0, target_version=1)
    pulse.apply(weights, patch)          # in place; pulse.PatchError leaves weights unchanged
"""
import dataclasses
import os

from . import _pulse
from ._pulse import Error, PatchError
from ._state import Tensor, entries, framework_of, state_from_entries

__all__ = ["Error", "PatchError", "Tensor", "diff", "encode", "apply", "digest", "inspect", "load", "save",
           "generate_keypair", "Sender", "Receiver", "Relay"]


def _coding(values, indices, compressor, level):
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


def encode(base, target, *, base_version, target_version, values="keydiff", indices="gap-varint",
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


def load(path, *, framework=None, metadata=False):
    """A state from a .safetensors file (or .safetensors.zst): torch tensors when torch is
    imported (framework="torch"), else numpy arrays; each tensor owns its slice of the file's
    bytes, read once. With metadata=True returns (state, metadata dict)."""
    if os.path.isdir(path):
        return _load_folder(path, framework=framework, metadata=metadata)
    items, meta = _pulse.load(os.fspath(path))
    state = state_from_entries(items, framework or ("torch" if _state_torch() else "numpy"))
    return (state, meta) if metadata else state


def save(state, path, *, metadata=None):
    """Writes state to a .safetensors file atomically (tensors in dict order)."""
    if os.path.isdir(path):
        return _save_folder(state, path, metadata=metadata)
    _pulse.save(entries(state), os.fspath(path), metadata or {})


def _load_folder(path, **kwargs):
    # Seam for Hugging Face model folders (sharded safetensors + index), which pulse's C++
    # library does not read yet.
    raise Error(f"{path} is a folder; pulse.load reads single .safetensors files")


def _save_folder(state, path, **kwargs):
    raise Error(f"{path} is a folder; pulse.save writes single .safetensors files")


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

    def __init__(self, state, *, version=0, values="keydiff", indices="gap-varint", compressor="zstd", level=3,
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
                signing_key=None, values="keydiff", indices="gap-varint", compressor="zstd", level=3):
        """Publishes state as `version`: a patch from `previous` (the head version's weights) when
        given, an anchor every anchor_every versions, then HEAD."""
        self._relay.publish(version, entries(state), None if previous is None else entries(previous), anchor_every,
                            keep_anchors, compress_anchors, _coding(values, indices, compressor, level),
                            _key(signing_key, 64, "signing_key"))

    def pull(self, state=None, version=0, *, public_key=None, min_version=0, framework=None):
        """Brings `state` (at `version`) to HEAD: patches from it (fast path) or the newest anchor
        (slow path); the result is a new state, its digest checked against HEAD."""
        items, info = self._relay.pull(None if state is None else entries(state), version,
                                       _key(public_key, 32, "public_key"), min_version)
        framework = framework or (framework_of(state) if state else ("torch" if _state_torch() else "numpy"))
        return Pull(state=state_from_entries(items, framework), **info)
