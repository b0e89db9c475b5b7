// pulse.SlicedApply: a resharding receiver (src/shard/sliced_apply.hpp) for frameworks that sum
// over ranks themselves (torch.distributed). A rank that refuses the patch does not throw here:
// it adds failed_partial to the all-reduce, so that every rank reaches the collective, and its
// error is raised by finish (the others raise that a receiver refused and roll back).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>

#include "bindings.hpp"
#include "shard/sliced_apply.hpp"
#include "sync/relay.hpp"

namespace py = pybind11;
using namespace pulse::sync;

namespace pulse::python {
namespace {

class PySlicedApply {
 public:
  // layout: [(name, dtype, shape)]; slices: [(name, buffer, kind, begin, end)], kind "rows",
  // "cols" or "flat"; a buffer's rows may be apart (a column slice of a wider buffer).
  PySlicedApply(const py::buffer& patch_buffer, const py::list& layout, const py::list& slices,
                const Metadata& metadata, const std::optional<py::bytes>& public_key, unsigned threads)
      : tensors_(layout.size()) {
    try {
      const std::optional<PublicKey> key = public_key_from(public_key);
      std::vector<TensorLayout> tensors;
      std::vector<TensorRef> refs;
      for (const py::handle item : layout) {
        const auto t = item.cast<py::tuple>();
        PULSE_CHECK(t.size() == 3, "a layout entry is (name, dtype, shape)");
        tensors.push_back({t[0].cast<std::string>(), t[1].cast<std::string>(), t[2].cast<std::vector<std::int64_t>>()});
        refs.push_back({tensors.back().name, tensors.back().dtype, tensors.back().shape, nullptr, 0});
      }
      std::vector<ReceiverSlice> pieces;
      for (const py::handle item : slices) {
        const auto s = item.cast<py::tuple>();
        PULSE_CHECK(s.size() == 5, "a slice is (name, buffer, kind, begin, end)");
        ReceiverSlice r;
        r.name = s[0].cast<std::string>();
        const std::string kind = s[2].cast<std::string>();
        const auto begin = s[3].cast<std::uint64_t>(), end = s[4].cast<std::uint64_t>();
        PULSE_CHECK(kind == "rows" || kind == "cols" || kind == "flat",
                    "slice of tensor '" + r.name + "': kind must be rows, cols or flat, not " + kind);
        r.spec = kind == "rows" ? SliceSpec::rows(begin, end)
                 : kind == "cols" ? SliceSpec::columns(begin, end) : SliceSpec::elements(begin, end);
        py::buffer_info info = s[1].cast<py::buffer>().request(true);
        // Elements side by side in each row; rows row_stride elements apart (columns only).
        const py::ssize_t w = info.itemsize;
        bool packed = true;
        py::ssize_t expected = w;
        for (py::ssize_t i = info.ndim - 1; i >= 0; --i) {
          if (info.shape[i] > 1 && info.strides[i] != expected) packed = packed && kind == "cols" && i == 0 && info.ndim == 2;
          expected *= info.shape[i];
        }
        PULSE_CHECK(packed && (info.ndim < 2 || info.shape[1] <= 1 || info.strides[1] == w),
                    "slice of tensor '" + r.name + "': its buffer must be contiguous (a column slice: 2-D, "
                    "contiguous in each row)");
        if (kind == "cols" && info.ndim == 2 && info.shape[0] > 1) {
          PULSE_CHECK(info.strides[0] > 0 && info.strides[0] % w == 0,
                      "slice of tensor '" + r.name + "': rows of its buffer are not whole elements apart");
          r.row_stride = std::uint64_t(info.strides[0] / w);
        }
        r.data = static_cast<std::byte*>(info.ptr);
        pieces.push_back(r);
        buffers_.push_back(std::move(info));
      }
      const PatchBytes patch(patch_buffer);
      py::gil_scoped_release release;
      PatchLimits limits;
      limits.max_patch_bytes = patch_bytes_limit(refs);
      const ParsedPatch p = parse_patch(patch.data(), patch.size(), limits, key ? &*key : nullptr);
      apply_.emplace(p, tensors, pieces, metadata, threads);
    } catch (const Error& e) {
      error_ = e.what();
    }
  }

  py::array_t<std::int64_t> partial() const {
    const std::vector<std::int64_t> v = apply_ ? apply_->partial() : SlicedApply::failed_partial(tensors_);
    return py::array_t<std::int64_t>(py::ssize_t(v.size()), v.data());
  }

  void finish(const py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>& summed) {
    const std::vector<std::int64_t> s(summed.data(), summed.data() + summed.size());
    if (!apply_) throw PatchError(error_);
    try {
      py::gil_scoped_release release;
      apply_->finish(s);
    } catch (const Error& e) {
      throw PatchError(e.what());
    }
  }

  void rollback() {
    if (!apply_) return;
    try {
      apply_->rollback();
    } catch (const Error& e) {
      throw PatchError(e.what());
    }
  }

  std::uint64_t written() const { return apply_ ? apply_->written() : 0; }
  py::object error() const { return apply_ ? py::none() : py::cast(error_); }

 private:
  std::size_t tensors_;
  std::vector<py::buffer_info> buffers_;  // the slices' memory, held until this is dropped
  std::optional<SlicedApply> apply_;
  std::string error_;  // this rank's refusal, when apply_ is empty
};

}  // namespace

void bind_sliced(py::module_& m) {
  py::class_<PySlicedApply>(m, "SlicedApply")
      .def(py::init<const py::buffer&, const py::list&, const py::list&, const Metadata&,
                    const std::optional<py::bytes>&, unsigned>(),
           py::arg("patch"), py::arg("layout"), py::arg("slices"), py::arg("metadata"), py::arg("public_key"),
           py::arg("threads"))
      .def("partial", &PySlicedApply::partial)
      .def("finish", &PySlicedApply::finish, py::arg("summed"))
      .def("rollback", &PySlicedApply::rollback)
      .def_property_readonly("written", &PySlicedApply::written)
      .def_property_readonly("error", &PySlicedApply::error);
}

}  // namespace pulse::python
