#pragma once
// Which elements of a tensor a rank holds (sharded senders and resharding receivers,
// sharded_sender.hpp and sharded_receiver.hpp): a flat element range (FSDP: FSDP1's flat shard,
// FSDP2's Shard(0) as the range of its rows), or a row or column range of the tensor seen as a
// matrix [shape[0], numel / shape[0]] (tensor parallelism; a 1-D tensor is [n, 1], so its row
// range is its element range). Pieces are resolved into runs, contiguous element ranges of the
// tensor; digests add up over pieces only when every run begins and ends on the 128-byte grid
// of the tensor digest (FORMAT.md), which is checked here.
#include <cstdint>
#include <string>
#include <vector>

#include "sync/patch.hpp"

namespace pulse::sync {

struct SliceSpec {
  enum class Kind : std::uint8_t { elements, rows, columns };
  Kind kind = Kind::elements;
  std::uint64_t begin = 0, end = 0;  // elements, rows or columns [begin, end)
  static SliceSpec elements(std::uint64_t begin, std::uint64_t end) { return {Kind::elements, begin, end}; }
  static SliceSpec rows(std::uint64_t begin, std::uint64_t end) { return {Kind::rows, begin, end}; }
  static SliceSpec columns(std::uint64_t begin, std::uint64_t end) { return {Kind::columns, begin, end}; }
};

// Elements [begin, end) of the tensor, held at element `local` of the rank's buffer.
struct SliceRun {
  std::uint64_t begin = 0, end = 0, local = 0;
};

// The runs of a piece, in order: one for an element or row range, one per row for a column
// range. The rank's buffer holds the piece row by row, row_stride elements apart (0: the piece's
// width; a fused tensor's buffer holds pieces of several tensors side by side). Throws a
// one-line pulse::Error for a piece outside the tensor or off the 128-byte digest grid.
std::vector<SliceRun> slice_runs(const TensorLayout& tensor, const SliceSpec& spec, std::uint64_t row_stride = 0);

// Bytes per element of a tensor (a dtype of whole bytes), and its elements.
unsigned element_bytes(const TensorLayout& tensor);
std::uint64_t element_count(const TensorLayout& tensor);

}  // namespace pulse::sync
