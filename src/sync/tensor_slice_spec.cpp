#include "sync/tensor_slice_spec.hpp"

#include "core/error.hpp"
#include "sync/patch_table.hpp"

namespace pulse::sync {

std::uint64_t element_count(const TensorLayout& tensor) { return patch_bytes::numel_of(tensor.shape); }

unsigned element_bytes(const TensorLayout& tensor) {
  const std::uint64_t n = element_count(tensor);
  const std::uint64_t bytes = patch_bytes::layout_bytes(tensor.name, tensor.dtype, tensor.shape);
  if (n == 0) return 1;
  PULSE_CHECK(bytes % n == 0 && bytes / n > 0,
              "tensor '" + tensor.name + "' of " + tensor.dtype + " has elements of less than a byte: it cannot be sliced");
  return unsigned(bytes / n);
}

std::vector<SliceRun> slice_runs(const TensorLayout& tensor, const SliceSpec& spec, std::uint64_t row_stride) {
  const std::uint64_t n = element_count(tensor);
  const unsigned w = element_bytes(tensor);
  const std::uint64_t rows = tensor.shape.empty() ? 1 : std::uint64_t(tensor.shape[0]);
  const std::uint64_t cols = rows == 0 ? 0 : n / rows;
  const char* kind = spec.kind == SliceSpec::Kind::elements ? "elements" : spec.kind == SliceSpec::Kind::rows ? "rows" : "columns";
  const std::uint64_t limit = spec.kind == SliceSpec::Kind::elements ? n : spec.kind == SliceSpec::Kind::rows ? rows : cols;
  const std::string what = "slice " + std::string(kind) + " [" + std::to_string(spec.begin) + ", " +
                           std::to_string(spec.end) + ") of tensor '" + tensor.name + "'";
  PULSE_CHECK(spec.begin <= spec.end && spec.end <= limit,
              what + " lies outside it (" + std::to_string(limit) + " " + kind + ")");
  std::vector<SliceRun> runs;
  if (spec.kind == SliceSpec::Kind::elements) {
    if (spec.begin < spec.end) runs.push_back({spec.begin, spec.end, 0});
  } else if (spec.kind == SliceSpec::Kind::rows) {
    if (spec.begin < spec.end && cols > 0) runs.push_back({spec.begin * cols, spec.end * cols, 0});
  } else {
    const std::uint64_t width = spec.end - spec.begin;
    const std::uint64_t stride = row_stride ? row_stride : width;
    PULSE_CHECK(stride >= width, what + ": row stride " + std::to_string(stride) + " is less than its width");
    if (width == cols) {  // every column: the rows lie end to end when the stride is the width
      if (stride == width && width > 0) runs.push_back({0, n, 0});
      else for (std::uint64_t r = 0; r < rows && width > 0; ++r) runs.push_back({r * cols, r * cols + cols, r * stride});
    } else {
      for (std::uint64_t r = 0; r < rows && width > 0; ++r)
        runs.push_back({r * cols + spec.begin, r * cols + spec.end, r * stride});
    }
  }
  if (spec.kind == SliceSpec::Kind::rows && row_stride != 0)
    PULSE_CHECK(row_stride == cols, what + ": a row range is held whole (row stride " + std::to_string(cols) + ")");
  for (const SliceRun& run : runs)
    PULSE_CHECK((run.begin * w) % kDigestBlockBytes == 0 && (run.end == n || (run.end * w) % kDigestBlockBytes == 0),
                what + " cuts the 128-byte digest grid at element " +
                    std::to_string((run.begin * w) % kDigestBlockBytes ? run.begin : run.end) +
                    " (slices must begin and end on multiples of " + std::to_string(kDigestBlockBytes / w) +
                    " elements, or at the tensor's end)");
  return runs;
}

}  // namespace pulse::sync
