#include "state.hpp"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "core/error.hpp"
#include "io/safetensors.hpp"

namespace py = pybind11;

namespace pulse::python {

std::vector<sync::MutableTensor> StateBuffers::mutables() const {
  std::vector<sync::MutableTensor> out;
  for (const auto& t : refs) out.push_back({t.name, t.dtype, t.shape, const_cast<std::byte*>(t.data), t.bytes});
  return out;
}

StateBuffers state_buffers(const py::handle& state, bool writable) {
  StateBuffers out;
  for (const py::handle item : state) {
    const auto entry = item.cast<py::tuple>();
    PULSE_CHECK(entry.size() == 4, "a state entry is (name, dtype, shape, buffer)");
    sync::TensorRef ref;
    ref.name = entry[0].cast<std::string>();
    ref.dtype = entry[1].cast<std::string>();
    ref.shape = entry[2].cast<std::vector<std::int64_t>>();
    py::buffer_info info = entry[3].cast<py::buffer>().request(writable);
    std::size_t numel = 1;
    for (const auto d : ref.shape) {
      PULSE_CHECK(d >= 0, "tensor " + ref.name + ": negative dimension");
      numel *= std::size_t(d);
    }
    // C-contiguous: each stride is the product of the later dimensions (size-1 dims are free).
    py::ssize_t expected = info.itemsize;
    for (py::ssize_t i = info.ndim - 1; i >= 0; --i) {
      PULSE_CHECK(info.shape[i] <= 1 || info.strides[i] == expected,
                  "tensor " + ref.name + " is not contiguous (call .contiguous() first)");
      expected *= info.shape[i];
    }
    std::size_t bytes = 0;
    PULSE_CHECK(io::tensor_bytes(io::parse_dtype(ref.dtype), numel, bytes) &&
                    bytes == std::size_t(info.size * info.itemsize),
                "tensor " + ref.name + ": its buffer holds " + std::to_string(info.size * info.itemsize) +
                    " bytes, dtype " + ref.dtype + " and its shape need " + std::to_string(bytes));
    ref.data = static_cast<const std::byte*>(info.ptr);
    ref.bytes = bytes;
    out.refs.push_back(std::move(ref));
    out.buffers.push_back(std::move(info));
  }
  return out;
}

py::object bytes_array(std::vector<std::byte>&& bytes) {
  auto* owned = new std::vector<std::byte>(std::move(bytes));
  py::capsule owner(owned, [](void* p) { delete static_cast<std::vector<std::byte>*>(p); });
  return py::array_t<std::uint8_t>({py::ssize_t(owned->size())}, {py::ssize_t(1)},
                                   reinterpret_cast<const std::uint8_t*>(owned->data()), owner);
}

py::tuple state_entry(const sync::TensorRef& layout, std::vector<std::byte>&& bytes) {
  return py::make_tuple(layout.name, layout.dtype, py::tuple(py::cast(layout.shape)), bytes_array(std::move(bytes)));
}

}  // namespace pulse::python
