#pragma once
// The exact size of the PULSESync patch that sync::encode_patch writes between two versions of
// one of pulse-measure's work units, computed from the changed elements pulse-measure finds
// anyway, so a patch's size costs no second pass over the weights and no hashing (the digests
// in a patch have a fixed size). It covers what a unit is: the same tensors (names, dtypes,
// shapes) and metadata on both sides, all of sparse-coded dtypes (BF16, F16, F32), encoded with
// the default options (gap-varint indices, keydiff values, zstd) and unsigned. The format is
// src/sync/FORMAT.md; tests/measure/test_patch_size.cpp holds this equal to encode_patch's size.
#include <cstdint>
#include <string>
#include <vector>

#include "sync/patch.hpp"
#include "coding/varint.hpp"

namespace pulse::measure {

class UnitPatchSize {
 public:
  // Starts a unit; its tensors come next, in any order. Buffers are kept from unit to unit.
  void clear() { used_ = 0; }

  // Adds a tensor of the unit (as encode_patch sees it: a name, a dtype, an element count);
  // its changed elements are then added in increasing index order.
  void add_tensor(const std::string& name, const std::string& dtype, std::uint64_t numel);

  // Element `index` of the tensor added last went from old_bits to new_bits (which differ).
  void add_change(std::uint64_t index, std::uint32_t new_bits, std::uint32_t old_bits) {
    Tensor& t = tensors_[used_ - 1];
    sync::SegmentStreams& s = segment_of(t, index);
    sync::put_varint(s.index, index - t.next_index);  // gap-varint
    t.next_index = index + 1;
    sync::put_varint(s.value, sync::zigzag(std::int64_t(key(new_bits, t.element_bytes)) -
                                           std::int64_t(key(old_bits, t.element_bytes))));  // keydiff
    ++s.count;
  }

  // The changes of a block at element `first` of the tensor added last: the positions
  // (increasing, from first) of the elements whose bits (Word: 2 or 4 bytes, at now and before)
  // differ. The same as add_change for each, coded a run at a time straight into the streams'
  // buffers, not a byte at a time.
  template <class Word>
  void add_block(std::uint64_t first, const std::vector<std::uint16_t>& positions, const std::byte* now,
                 const std::byte* before);

  // Bytes of the unit's patch at this zstd level.
  std::uint64_t bytes(int level);

 private:
  struct Tensor {
    std::string name, dtype;
    std::uint64_t numel = 0, next_index = 0, segment_begin = 0, segment_elements = 0;
    unsigned element_bytes = 0;
    std::vector<sync::SegmentStreams> segments;  // the first used_segments: up to the last with a change
    std::size_t used_segments = 0;
  };

  // The streams of the segment that holds element `index` (at or after the last change's):
  // the patch's segments each code their first gap from their begin.
  static sync::SegmentStreams& segment_of(Tensor& t, std::uint64_t index) {
    while (t.used_segments == 0 || index >= t.segment_begin + t.segment_elements) {
      if (t.used_segments > 0) t.segment_begin += t.segment_elements;
      if (t.used_segments == t.segments.size()) t.segments.emplace_back();
      sync::SegmentStreams& next = t.segments[t.used_segments++];
      next.count = 0, next.index.clear(), next.value.clear();  // buffers kept
      t.next_index = t.segment_begin;
    }
    return t.segments[t.used_segments - 1];
  }

  // The monotone integer order of a sign-magnitude float's bits (sync's key of BF16/F16/F32).
  static std::uint32_t key(std::uint32_t bits, unsigned element_bytes) {
    const std::uint32_t sign = element_bytes == 2 ? 0x8000u : 0x80000000u;
    const std::uint32_t mask = element_bytes == 2 ? 0xFFFFu : 0xFFFFFFFFu;
    return bits & sign ? ~bits & mask : bits | sign;
  }

  std::vector<Tensor> tensors_;  // the first used_ are the unit's
  std::size_t used_ = 0;
};

}  // namespace pulse::measure
