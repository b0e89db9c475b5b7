#pragma once
// Model states handed over from Python: a list of (name, dtype, shape, buffer) tuples whose
// buffers (numpy arrays, torch tensors through .numpy()) are read or written in place, never
// copied. The buffer_info objects keep the exporters' memory pinned; they must be released with
// the GIL held, so a StateBuffers lives in the scope that holds the GIL.
#include <pybind11/pybind11.h>

#include <vector>

#include "sync/patch.hpp"

namespace pulse::python {

struct StateBuffers {
  std::vector<pybind11::buffer_info> buffers;
  std::vector<sync::TensorRef> refs;
  std::vector<sync::MutableTensor> mutables() const;
};

// Checks every buffer: C-contiguous, as many bytes as the dtype and shape need, writable when asked.
StateBuffers state_buffers(const pybind11::handle& state, bool writable);

// A byte vector handed to Python without a copy: a 1-D uint8 numpy array that owns it.
pybind11::object bytes_array(std::vector<std::byte>&& bytes);

// (name, dtype, shape, uint8 array) tuples, the form Python turns into tensors.
pybind11::tuple state_entry(const sync::TensorRef& layout, std::vector<std::byte>&& bytes);

}  // namespace pulse::python
