#include "measure/patch_size.hpp"

#include <algorithm>
#include <numeric>

#include "core/error.hpp"
#include "sync/patch.hpp"

namespace pulse::measure {

void UnitPatchSize::add_tensor(const std::string& name, const std::string& dtype, std::uint64_t numel) {
  PULSE_CHECK(dtype == "BF16" || dtype == "F16" || dtype == "F32", "patch size of a " + dtype + " tensor");
  if (used_ == tensors_.size()) tensors_.emplace_back();
  Tensor& t = tensors_[used_++];
  t.name = name;
  t.dtype = dtype;
  t.numel = numel;
  t.next_index = t.segment_begin = 0;
  t.element_bytes = dtype == "F32" ? 4 : 2;
  t.segment_elements = sync::patch_segment_elements(sync::EncodeOptions{}, t.element_bytes);
  t.used_segments = 0;
}

std::uint64_t UnitPatchSize::bytes(int level) {
  // encode_patch writes the entries, and their streams, in name order.
  std::vector<std::size_t> order(used_);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return tensors_[a].name < tensors_[b].name; });
  std::vector<sync::TensorLayout> layout;
  std::vector<std::vector<sync::SegmentStreams>> segments;  // lent by the tensors, not copied
  for (const std::size_t i : order) {
    Tensor& t = tensors_[i];
    layout.push_back({t.name, t.dtype, {std::int64_t(t.numel)}});
    t.segments.resize(t.used_segments);
    segments.push_back(std::move(t.segments));
  }
  sync::EncodeOptions options;  // gap-varint, keydiff, zstd: the defaults this class codes
  options.level = level;
  const std::uint64_t bytes = sync::sparse_patch_bytes(options, layout, segments);
  for (std::size_t j = 0; j < order.size(); ++j) tensors_[order[j]].segments = std::move(segments[j]);
  return bytes;
}

}  // namespace pulse::measure
