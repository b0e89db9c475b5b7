"""Model states as pulse's C++ library sees them, without copies.

A state is a dict[str, tensor]: CPU torch tensors, numpy arrays, or pulse.Tensor for a dtype that
neither has (the FP8 dtypes in older torch, say). Each becomes a (name, dtype, shape, buffer)
entry whose buffer is a numpy view of the tensor's own memory: `tensor.detach().numpy()`, through
a same-width integer view for BF16 (int16) and FP8 (uint8), which numpy lacks. The C++ side reads
and writes that memory through the buffer protocol.
"""
import sys

import numpy as np

from . import _pulse

NUMPY_DTYPES = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "U16": np.uint16,
                "F16": np.float16, "I32": np.int32, "U32": np.uint32, "F32": np.float32, "C64": np.complex64,
                "F64": np.float64, "I64": np.int64, "U64": np.uint64}
_BY_NUMPY = {np.dtype(v): k for k, v in NUMPY_DTYPES.items()}
# Integer views of the same width, for dtypes numpy has no type for.
_INT_VIEW = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}


class Tensor:
    """A tensor of any safetensors dtype as raw bytes: `data` is a numpy array (any integer view)
    holding exactly the tensor's bytes, C-contiguous, e.g. FP8 weights as uint8."""

    def __init__(self, dtype, shape, data):
        self.dtype, self.shape, self.data = dtype, tuple(int(d) for d in shape), data

    def __repr__(self):
        return f"pulse.Tensor({self.dtype!r}, {self.shape}, {self.data.nbytes} bytes)"


def _torch_tables(torch):
    names = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "float64": "F64", "int8": "I8",
             "uint8": "U8", "int16": "I16", "int32": "I32", "int64": "I64", "bool": "BOOL", "complex64": "C64",
             "uint16": "U16", "uint32": "U32", "uint64": "U64", "float8_e4m3fn": "F8_E4M3",
             "float8_e5m2": "F8_E5M2", "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2fnuz": "F8_E5M2FNUZ",
             "float8_e8m0fnu": "F8_E8M0"}
    to_pulse = {getattr(torch, n): d for n, d in names.items() if hasattr(torch, n)}
    return to_pulse, {d: t for t, d in to_pulse.items()}


def _torch():
    """torch if the program imported it (pulse itself never needs it)."""
    return sys.modules.get("torch")


def entry(name, value, writable=False):
    """(name, dtype, shape, numpy view) of one tensor; writable views for apply."""
    torch = _torch()
    if torch is not None and isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            raise _pulse.Error(f"tensor {name} is on {value.device}; pulse reads CPU tensors (use .cpu())")
        t = value.detach()
        if not t.is_contiguous():
            if writable:
                raise _pulse.Error(f"tensor {name} is not contiguous; pulse writes it in place")
            t = t.contiguous()
        to_pulse, _ = _torch_tables(torch)
        if t.dtype not in to_pulse:
            raise _pulse.Error(f"tensor {name}: torch dtype {t.dtype} has no safetensors dtype")
        dtype = to_pulse[t.dtype]
        if dtype not in NUMPY_DTYPES:
            t = t.view(getattr(torch, {1: "uint8", 2: "int16"}[t.element_size()]))
        return (name, dtype, tuple(value.shape), t.numpy())
    if isinstance(value, Tensor):
        return (name, value.dtype, value.shape, value.data)
    if isinstance(value, np.ndarray):
        if value.dtype.name == "bfloat16":  # ml_dtypes
            return (name, "BF16", value.shape, value.view(np.int16))
        if value.dtype not in _BY_NUMPY:
            raise _pulse.Error(f"tensor {name}: numpy dtype {value.dtype} has no safetensors dtype")
        if not value.flags.c_contiguous and not writable:
            value = np.ascontiguousarray(value)
        return (name, _BY_NUMPY[value.dtype], value.shape, value)
    raise _pulse.Error(f"tensor {name}: {type(value).__name__} is not a torch tensor, numpy array or pulse.Tensor")


def entries(state, writable=False):
    if not isinstance(state, dict):
        raise _pulse.Error(f"a state is a dict of tensors, not {type(state).__name__}")
    return [entry(name, value, writable) for name, value in state.items()]


def value(dtype, shape, data, framework):
    """A tensor over `data` (uint8 bytes from the C++ side, kept alive by the result), no copy:
    a torch tensor when framework is "torch" and torch has the dtype, else a numpy array, else
    a pulse.Tensor."""
    shape = tuple(shape)
    if framework == "torch":
        import torch
        _, from_pulse = _torch_tables(torch)
        if dtype == "BF16":
            return torch.from_numpy(data.view(np.int16).reshape(shape)).view(torch.bfloat16)
        if dtype in from_pulse and dtype not in NUMPY_DTYPES:  # FP8: bytes viewed as the dtype
            return torch.from_numpy(data.reshape(shape)).view(from_pulse[dtype])
        if dtype in from_pulse:
            try:
                return torch.from_numpy(data.view(NUMPY_DTYPES[dtype]).reshape(shape))
            except TypeError:  # numpy dtype that this torch cannot wrap (uint16 before torch 2.3)
                pass
    if dtype in NUMPY_DTYPES:
        return data.view(NUMPY_DTYPES[dtype]).reshape(shape)
    return Tensor(dtype, shape, data)


def framework_of(state):
    torch = _torch()
    if torch is not None and any(isinstance(v, torch.Tensor) for v in state.values()):
        return "torch"
    return "numpy"


def state_from_entries(items, framework):
    return {name: value(dtype, shape, data, framework) for name, dtype, shape, data in items}


def _span(buffer):
    """(first byte address, bytes) of a numpy view of a tensor's memory."""
    return buffer.__array_interface__["data"][0], buffer.nbytes


def synced_entries(state, writable=False):
    """entries(state) with each tensor synced once: a tensor that is the same memory (same bytes,
    dtype and shape) as one earlier in the dict, as tied weights are (an embedding shared with
    the LM head, both in state_dict()), is left out and returned as an alias of it. Tensors that
    overlap otherwise (a view of part of another) are refused: neither can be written alone.
    Returns (entries, {alias name: name synced})."""
    flat = entries(state, writable)
    spans = sorted(((*_span(e[3]), i) for i, e in enumerate(flat) if e[3].nbytes), key=lambda s: (s[0], -s[1], s[2]))
    aliases, keep = {}, [True] * len(flat)
    end, owner = -1, None  # the furthest-reaching span so far and its entry
    for start, size, i in spans:
        if start < end:
            o = flat[owner]
            if (start, size) != _span(o[3]) or flat[i][1:3] != o[1:3]:
                raise _pulse.Error(f"tensors '{o[0]}' and '{flat[i][0]}' share memory without being the same tensor "
                                   "(one is a view of part of the other); pulse syncs each tensor's bytes once: keep one")
            aliases[flat[i][0]] = o[0]
            keep[i] = False
            continue
        end, owner = start + size, i
    return [e for e, k in zip(flat, keep) if k], aliases
