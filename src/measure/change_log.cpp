#include "measure/change_log.hpp"

#include <cstring>

#include "measure/compare.hpp"

namespace pulse::measure {

namespace {

constexpr std::size_t kPrefetchLines = 8;  // of a block's entries
constexpr std::size_t kMetadataAhead = 8;  // blocks ahead whose place in the log is fetched

// Element copies of a width known at compile time (a memcpy call each otherwise): the gather
// of a block's changed elements, and their scatter back.
template <class Word>
void gather(const std::byte* from, const std::vector<std::uint16_t>& positions, std::byte* out) {
  for (std::size_t c = 0; c < positions.size(); ++c)
    std::memcpy(out + c * sizeof(Word), from + std::size_t(positions[c]) * sizeof(Word), sizeof(Word));
}

// The c-th of a block's 16-bit positions, as stored in its log entries.
inline std::size_t position(const std::byte* positions, std::size_t c) {
  std::uint16_t p;
  std::memcpy(&p, positions + c * sizeof p, sizeof p);
  return p;
}

template <class Word>
void scatter(const std::byte* values, const std::byte* positions, std::size_t count, std::byte* to) {
  for (std::size_t c = 0; c < count; ++c)
    std::memcpy(to + position(positions, c) * sizeof(Word), values + c * sizeof(Word), sizeof(Word));
}

}  // namespace

void ChangeLog::clear(std::int64_t base_step) {
  base_step_ = base_step;
  blocks_.clear();
  entries_.clear();
}

const std::vector<std::uint16_t>& ChangeLog::record(const std::byte* now, const std::byte* before, std::size_t m,
                                                    std::size_t element_bytes) {
  found_.clear();
  const std::size_t count = find_changes(now, before, m, element_bytes, found_);
  Block block{entries_.size(), std::uint32_t(count), false};
  const std::size_t position_bytes = count * sizeof(std::uint16_t);
  if (position_bytes + count * element_bytes >= m * element_bytes) {
    block.whole = true;
    entries_.insert(entries_.end(), before, before + m * element_bytes);
  } else {
    entries_.resize(entries_.size() + position_bytes + count * element_bytes);
    std::memcpy(entries_.data() + block.first, found_.data(), position_bytes);
    std::byte* out = entries_.data() + block.first + position_bytes;
    if (element_bytes == 4)
      gather<std::uint32_t>(before, found_, out);
    else
      gather<std::uint16_t>(before, found_, out);
  }
  blocks_.push_back(block);
  return found_;
}

void ChangeLog::prefetch_after(std::size_t b) const {
  // The next block's entries are fetched now: blocks are reverted in order, each log's few
  // hundred bytes at a time, too short a run for the hardware prefetcher; their place in the
  // log, a few blocks ahead.
  if (b + kMetadataAhead < blocks_.size()) __builtin_prefetch(&blocks_[b + kMetadataAhead]);
  if (b + 1 < blocks_.size()) {
    const char* next = reinterpret_cast<const char*>(entries_.data() + blocks_[b + 1].first);
    for (std::size_t line = 0; line < kPrefetchLines; ++line) __builtin_prefetch(next + 64 * line);
  }
}

void ChangeLog::revert(std::size_t b, std::byte* block, std::size_t m, std::size_t element_bytes) const {
  prefetch_after(b);
  const Block& r = blocks_[b];
  const std::byte* entries = entries_.data() + r.first;
  if (r.whole) {
    std::memcpy(block, entries, m * element_bytes);
    return;
  }
  const std::byte* positions = entries;
  const std::byte* old = entries + r.count * sizeof(std::uint16_t);
  if (element_bytes == 4)
    scatter<std::uint32_t>(old, positions, r.count, block);
  else
    scatter<std::uint16_t>(old, positions, r.count, block);
}

std::size_t ChangeLog::bytes() const {
  return blocks_.capacity() * sizeof(Block) + entries_.capacity();
}

}  // namespace pulse::measure
