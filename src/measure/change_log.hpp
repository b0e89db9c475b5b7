#pragma once
// pulse-measure's history of a rank's share, compact: instead of whole earlier versions, the
// changes from each checkpoint to the next, block by block: the positions and old bits of the
// elements that changed, or the whole old block where that takes less memory (most changed).
// Reverting a block of the newer version with its log gives the older version's block exactly,
// so every k-step comparison runs on blocks in cache, and the history of a share whose weights
// change sparsely holds a few percent of the share per checkpoint (never more than the share).
#include <cstddef>
#include <cstdint>
#include <vector>

namespace pulse::measure {

class ChangeLog {
 public:
  // Starts an empty log (buffers are kept) of the changes from the checkpoint of step base_step.
  void clear(std::int64_t base_step);
  std::int64_t base_step() const { return base_step_; }

  // Records the next block (blocks are recorded in one order, each once): the elements of now
  // that differ from before (m elements of element_bytes, m <= kMaxFindElements). Returns the
  // positions of the changed elements, valid until the next call.
  const std::vector<std::uint16_t>& record(const std::byte* now, const std::byte* before, std::size_t m,
                                           std::size_t element_bytes);

  // Turns block b of the newer version (its m elements at block) into the older one's.
  void revert(std::size_t b, std::byte* block, std::size_t m, std::size_t element_bytes) const;

  // Bytes the log holds.
  std::size_t bytes() const;

 private:
  void prefetch_after(std::size_t b) const;

  // A block's entries lie together in entries_, so reverting a block reads one run of memory:
  // a sparse block's positions (16-bit) then the old bits at them, or a whole block's old bits.
  struct Block {
    std::uint64_t first;  // into entries_
    std::uint32_t count;  // changed elements
    bool whole;           // entries_ holds the whole old block
  };
  std::int64_t base_step_ = 0;
  std::vector<Block> blocks_;
  std::vector<std::byte> entries_;
  std::vector<std::uint16_t> found_;  // the last block's positions
};

}  // namespace pulse::measure
