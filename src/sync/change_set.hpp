#pragma once
// One step's changes to a flat state of 16-bit elements (the BF16 weights), in the one form that
// goes from AdamW's staging to the patch encoder, the change history and the host copies of the
// versions: sorted flat indices and their new bits, split by tensor with begin offsets (filled
// from the staging's per-segment counts, so nothing searches the list to split it again), and,
// once the change is applied in place, the bits it overwrote (what undoes it).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/index.hpp"

namespace pulse::sync {

struct ChangeSet {
  std::vector<index_t> indices;         // flat (tensors in table order, end to end), sorted, each once
  std::vector<index_t> tensor_begin;    // num_tensors + 1: tensor t's changes are [tensor_begin[t], tensor_begin[t + 1])
  std::vector<std::uint16_t> new_bits;  // the new bits of indices[j]
  std::vector<std::uint16_t> old_bits;  // empty, or the bits indices[j] held before (apply_change_set)

  std::size_t size() const { return indices.size(); }
  std::size_t num_tensors() const { return tensor_begin.empty() ? 0 : tensor_begin.size() - 1; }
  index_t count(std::size_t tensor) const { return tensor_begin[tensor + 1] - tensor_begin[tensor]; }
};

// tensor_begin for sorted flat `indices` over tensors at flat `offsets` (num_tensors + 1), by
// binary search: for a list made without per-tensor counts (a comparison of two versions).
std::vector<index_t> tensor_begins(const std::vector<index_t>& indices, const std::vector<index_t>& offsets);

// Throws pulse::Error unless the set fits tensors at flat `offsets`: one begin per tensor and
// one more, the indices sorted and distinct with each inside its tensor, as many new bits (and
// none or as many old bits) as indices.
void check_change_set(const ChangeSet& set, const std::vector<index_t>& offsets);

// Writes the new bits into `state` (n elements), keeping the bits they overwrite in set.old_bits.
void apply_change_set(ChangeSet& set, std::uint16_t* state, std::size_t n);
// Writes the old bits back: the state apply_change_set left becomes the one it found.
void revert_change_set(const ChangeSet& set, std::uint16_t* state, std::size_t n);

}  // namespace pulse::sync
