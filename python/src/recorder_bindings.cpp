// The hot loops of pulse.torch's SparsityRecorder: the k-step history as change logs, the Adam
// ratios and their quantiles by radix select, the gradient's magnitude counts. Each works on
// numpy arrays in place, without the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "adam_ratio.hpp"
#include "bindings.hpp"
#include "change_logs.hpp"
#include "coding/parallel.hpp"
#include "radix_quantiles.hpp"

namespace py = pybind11;

namespace pulse::python {
namespace {

// The values of magnitude at most each threshold (NaN is none), one pass over them.
std::vector<std::uint64_t> count_magnitude_at_most(const float* values, std::size_t n,
                                                   const std::vector<double>& thresholds, unsigned threads) {
  constexpr std::size_t kChunk = std::size_t(1) << 18;
  const std::size_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<float> at_most;  // each threshold as the compare on FP32 values sees it
  for (const double t : thresholds) at_most.push_back(float(t));
  std::vector<std::uint64_t> counts(chunks * at_most.size(), 0);
  sync::parallel_for(threads, chunks, [&](std::size_t c) {
    const std::size_t begin = c * kChunk, end = std::min(n, begin + kChunk);
    for (std::size_t t = 0; t < at_most.size(); ++t) {
      std::uint32_t count = 0;
      for (std::size_t i = begin; i < end; ++i) count += std::fabs(values[i]) <= at_most[t];
      counts[c * at_most.size() + t] = count;
    }
  });
  std::vector<std::uint64_t> out(at_most.size(), 0);
  for (std::size_t c = 0; c < chunks; ++c)
    for (std::size_t t = 0; t < at_most.size(); ++t) out[t] += counts[c * at_most.size() + t];
  return out;
}

// A one-dimensional contiguous buffer of elements of element_bytes: its first byte and length.
std::pair<std::byte*, std::size_t> flat_buffer(const py::buffer& b, std::size_t element_bytes, bool writable,
                                               const char* what) {
  const py::buffer_info info = b.request(writable);
  PULSE_CHECK(info.ndim == 1 && std::size_t(info.itemsize) == element_bytes &&
                  (info.shape[0] <= 1 || info.strides[0] == info.itemsize),
              std::string(what) + ": a contiguous 1-D array of " + std::to_string(element_bytes) +
                  "-byte elements is needed");
  return {static_cast<std::byte*>(info.ptr), std::size_t(info.shape[0])};
}

class PyChangeLogs {
 public:
  PyChangeLogs(std::size_t element_bytes, std::size_t keep)
      : element_bytes_(element_bytes), logs_(std::make_unique<ChangeLogs>(element_bytes, keep)) {}

  std::vector<std::uint64_t> log(const py::buffer& now, const py::buffer& recorded, const std::vector<std::uint64_t>& ends,
                                 unsigned threads) {
    const auto [now_data, n] = flat_buffer(now, element_bytes_, false, "ChangeLogs.log now");
    const auto [recorded_data, m] = flat_buffer(recorded, element_bytes_, false, "ChangeLogs.log recorded");
    PULSE_CHECK(n == m, "ChangeLogs.log: now holds " + std::to_string(n) + " elements, recorded " + std::to_string(m));
    py::gil_scoped_release release;
    return logs_->log(now_data, recorded_data, n, ends, threads);
  }

  std::map<std::size_t, std::uint64_t> differing(const py::buffer& latest, const std::vector<std::size_t>& ks,
                                                 unsigned threads) const {
    const auto [data, n] = flat_buffer(latest, element_bytes_, false, "ChangeLogs.differing latest");
    py::gil_scoped_release release;
    return logs_->differing(data, n, ks, threads);
  }

  std::size_t depth() const { return logs_->depth(); }
  std::size_t bytes() const { return logs_->bytes(); }

 private:
  std::size_t element_bytes_;
  std::unique_ptr<ChangeLogs> logs_;
};

}  // namespace

void bind_recorder(py::module_& m) {
  py::class_<PyChangeLogs>(m, "ChangeLogs")
      .def(py::init<std::size_t, std::size_t>(), py::arg("element_bytes"), py::arg("keep"))
      .def("log", &PyChangeLogs::log, py::arg("now"), py::arg("recorded"), py::arg("ends"), py::arg("threads"))
      .def("differing", &PyChangeLogs::differing, py::arg("latest"), py::arg("ks"), py::arg("threads"))
      .def_property_readonly("depth", &PyChangeLogs::depth)
      .def("bytes", &PyChangeLogs::bytes);
  m.def(
      "quantiles",
      [](const py::buffer& values, const std::vector<double>& qs, unsigned threads) {
        const auto [data, n] = flat_buffer(values, sizeof(float), false, "quantiles values");
        py::gil_scoped_release release;
        return radix_quantiles(reinterpret_cast<const float*>(data), n, qs, threads);
      },
      py::arg("values"), py::arg("qs"), py::arg("threads"));
  m.def(
      "count_magnitude_at_most",
      [](const py::buffer& values, const std::vector<double>& thresholds, unsigned threads) {
        const auto [data, n] = flat_buffer(values, sizeof(float), false, "count_magnitude_at_most values");
        py::gil_scoped_release release;
        return count_magnitude_at_most(reinterpret_cast<const float*>(data), n, thresholds, threads);
      },
      py::arg("values"), py::arg("thresholds"), py::arg("threads"));
  // The recorder's copy of a BF16 gradient as FP32, on the calling thread (not torch's: its
  // threads wait on each other while the recorder's background thread holds a core).
  m.def(
      "bf16_to_fp32",
      [](const py::buffer& bits, const py::buffer& out) {
        const auto [from, n] = flat_buffer(bits, sizeof(std::uint16_t), false, "bf16_to_fp32 bits");
        const auto [to, m] = flat_buffer(out, sizeof(float), true, "bf16_to_fp32 out");
        PULSE_CHECK(n == m, "bf16_to_fp32: " + std::to_string(n) + " values into " + std::to_string(m));
        py::gil_scoped_release release;
        const auto* in = reinterpret_cast<const std::uint16_t*>(from);
        auto* wide = reinterpret_cast<float*>(to);
        for (std::size_t i = 0; i < n; ++i) wide[i] = bf16_to_float(in[i]);
      },
      py::arg("bits"), py::arg("out"));
  // moments: [(m, v, out, bf16, 1 - beta1^t, 1 - beta2^t, eps)], m and v FP32 or BF16 bits (16-bit integers).
  m.def(
      "adam_ratios",
      [](const py::list& moments, unsigned threads) {
        std::vector<AdamMoments> parts;
        for (const py::handle item : moments) {
          const auto t = item.cast<py::tuple>();
          PULSE_CHECK(t.size() == 7, "adam_ratios: a moment is (m, v, out, bf16, m_scale, v_scale, eps)");
          const bool bf16 = t[3].cast<bool>();
          const std::size_t width = bf16 ? 2 : 4;
          const auto [m_data, n] = flat_buffer(t[0].cast<py::buffer>(), width, false, "adam_ratios m");
          const auto [v_data, nv] = flat_buffer(t[1].cast<py::buffer>(), width, false, "adam_ratios v");
          const auto [out, no] = flat_buffer(t[2].cast<py::buffer>(), sizeof(float), true, "adam_ratios out");
          PULSE_CHECK(n == nv && n == no, "adam_ratios: m, v and out differ in length");
          parts.push_back({m_data, v_data, reinterpret_cast<float*>(out), n, bf16, t[4].cast<double>(),
                           t[5].cast<double>(), t[6].cast<double>()});
        }
        py::gil_scoped_release release;
        adam_ratios(parts, threads);
      },
      py::arg("moments"), py::arg("threads"));
}

}  // namespace pulse::python
