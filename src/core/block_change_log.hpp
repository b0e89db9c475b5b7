#pragma once
// The changes from one version of an array to the next, block by block, compact: for each block,
// the positions (16-bit, within the block) and old bits of the elements that changed, or the
// whole old block where that takes less memory (most changed). Reverting a block of the newer
// version with its log gives the older version's block exactly, so a history of versions costs
// their changes, not copies, and reverting it runs on one block at a time, in cache.
// pulse-measure's k-step history (measure/kstep_history.hpp) and the Python recorder's
// (python/src/change_logs.hpp) are logs of this kind.
//
// A log is written in one of two ways: block after block (record), or laid out for all blocks at
// once from their counts of changes and then filled block by block from the positions found, in
// any order, from several threads (lay_out, fill). Elements are of 1, 2, 4 or 8 bytes, one width per block.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace pulse {

class BlockChangeLog {
 public:
  // Empties the log (its buffers are kept).
  void clear();

  // Records the next block: the elements of now that differ from before (m elements of
  // element_bytes, m <= kMaxFindElements of core/element_compare.hpp). Returns the positions of
  // the changed elements, increasing, valid until the next call.
  const std::vector<std::uint16_t>& record(const std::byte* now, const std::byte* before, std::size_t m,
                                           std::size_t element_bytes);

  // Empties the log and makes room for blocks of block_elements (the last one shorter) over n
  // elements of element_bytes, block b with changed[b] elements that differ, for fill.
  void lay_out(const std::vector<std::uint32_t>& changed, std::size_t n, std::size_t block_elements,
               std::size_t element_bytes);

  // Writes block b of the layout: the positions of its changed elements (increasing, as
  // find_changes of core/element_compare.hpp gives them; changed[b] of them, checked) and the old
  // bits of its m elements at before. Blocks are filled once each, in any order, several at once.
  void fill(std::size_t b, const std::vector<std::uint16_t>& positions, const std::byte* before, std::size_t m,
            std::size_t element_bytes);

  // Turns block b of the newer version (its m elements at block) into the older one's.
  void revert(std::size_t b, std::byte* block, std::size_t m, std::size_t element_bytes) const;

  // Bytes the log holds: a sparse block's positions (2 bytes each) and old bits, a whole one's old bits.
  std::size_t bytes() const { return entries_.size(); }

 private:
  // A block's entries lie together in entries_, so reverting a block reads one run of memory:
  // a sparse block's positions then the old bits at them, or a whole block's old bits.
  struct Block {
    std::uint64_t first;  // into entries_
    std::uint32_t count;  // changed elements
    bool whole;           // entries_ holds the whole old block
  };
  static Block place(std::uint64_t first, std::size_t count, std::size_t m, std::size_t element_bytes);
  static std::size_t entry_bytes(const Block& block, std::size_t m, std::size_t element_bytes);
  void write(const Block& block, const std::vector<std::uint16_t>& positions, const std::byte* before, std::size_t m,
             std::size_t element_bytes);
  void prefetch_after(std::size_t b) const;

  std::vector<Block> blocks_;
  std::vector<std::byte> entries_;
  std::vector<std::uint16_t> found_;  // the last recorded block's positions
};

}  // namespace pulse
