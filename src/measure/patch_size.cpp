#include "measure/patch_size.hpp"

#include <algorithm>
#include <cstring>
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

namespace {

// Writes v as a varint at out; returns the bytes written (as sync::put_varint codes it).
inline std::size_t write_varint(std::uint8_t* out, std::uint64_t v) {
  std::size_t n = 0;
  for (; v >= 0x80; v >>= 7) out[n++] = static_cast<std::uint8_t>(v | 0x80);
  out[n++] = static_cast<std::uint8_t>(v);
  return n;
}

constexpr std::size_t kMaxVarintBytes = 10;

}  // namespace

template <class Word>
void UnitPatchSize::add_block(std::uint64_t first, const std::vector<std::uint16_t>& positions, const std::byte* now,
                              const std::byte* before) {
  Tensor& t = tensors_[used_ - 1];
  const std::uint16_t* at = positions.data();
  const std::uint16_t* const end = at + positions.size();
  while (at != end) {
    sync::SegmentStreams& s = segment_of(t, first + *at);
    const std::uint64_t segment_end = t.segment_begin + t.segment_elements;
    const std::uint16_t* run_end = at;
    while (run_end != end && first + *run_end < segment_end) ++run_end;
    const std::size_t count = std::size_t(run_end - at), index_bytes = s.index.size(), value_bytes = s.value.size();
    s.index.resize(index_bytes + count * kMaxVarintBytes);
    s.value.resize(value_bytes + count * kMaxVarintBytes);
    std::uint8_t* index_out = s.index.data() + index_bytes;
    std::uint8_t* value_out = s.value.data() + value_bytes;
    std::uint64_t next = t.next_index;
    for (; at != run_end; ++at) {
      const std::uint64_t index = first + *at;
      Word x, y;
      std::memcpy(&x, now + std::size_t(*at) * sizeof(Word), sizeof(Word));
      std::memcpy(&y, before + std::size_t(*at) * sizeof(Word), sizeof(Word));
      index_out += write_varint(index_out, index - next);  // gap-varint
      next = index + 1;
      value_out += write_varint(value_out, sync::zigzag(std::int64_t(key(x, sizeof(Word))) -
                                                        std::int64_t(key(y, sizeof(Word)))));  // keydiff
    }
    t.next_index = next;
    s.count += count;
    s.index.resize(std::size_t(index_out - s.index.data()));
    s.value.resize(std::size_t(value_out - s.value.data()));
  }
}

template void UnitPatchSize::add_block<std::uint16_t>(std::uint64_t, const std::vector<std::uint16_t>&,
                                                      const std::byte*, const std::byte*);
template void UnitPatchSize::add_block<std::uint32_t>(std::uint64_t, const std::vector<std::uint16_t>&,
                                                      const std::byte*, const std::byte*);

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
