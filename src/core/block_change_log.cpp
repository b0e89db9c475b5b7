#include "core/block_change_log.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/element_compare.hpp"
#include "core/element_word.hpp"
#include "core/error.hpp"

namespace pulse {

namespace {

constexpr std::size_t kPrefetchLines = 8;  // of a block's entries
constexpr std::size_t kMetadataAhead = 8;  // blocks ahead whose place in the log is fetched
using Position = std::uint16_t;

// Element copies of a width known at compile time (a memcpy call each otherwise): the gather
// of a block's changed elements, and their scatter back.
template <class Word>
void gather(const std::byte* from, const std::vector<Position>& positions, std::byte* out) {
  for (std::size_t c = 0; c < positions.size(); ++c)
    std::memcpy(out + c * sizeof(Word), from + std::size_t(positions[c]) * sizeof(Word), sizeof(Word));
}

// The c-th of a block's positions, as stored in its log entries.
inline std::size_t position(const std::byte* positions, std::size_t c) {
  Position p;
  std::memcpy(&p, positions + c * sizeof p, sizeof p);
  return p;
}

template <class Word>
void scatter(const std::byte* values, const std::byte* positions, std::size_t count, std::byte* to) {
  for (std::size_t c = 0; c < count; ++c)
    std::memcpy(to + position(positions, c) * sizeof(Word), values + c * sizeof(Word), sizeof(Word));
}

}  // namespace

void BlockChangeLog::clear() {
  blocks_.clear();
  entries_.clear();
}

BlockChangeLog::Block BlockChangeLog::place(std::uint64_t first, std::size_t count, std::size_t m,
                                            std::size_t element_bytes) {
  return {first, std::uint32_t(count), count * (sizeof(Position) + element_bytes) >= m * element_bytes};
}

std::size_t BlockChangeLog::entry_bytes(const Block& block, std::size_t m, std::size_t element_bytes) {
  return block.whole ? m * element_bytes : block.count * (sizeof(Position) + element_bytes);
}

void BlockChangeLog::write(const Block& block, const std::vector<Position>& positions, const std::byte* before,
                           std::size_t m, std::size_t element_bytes) {
  std::byte* out = entries_.data() + block.first;
  if (block.whole) {
    std::memcpy(out, before, m * element_bytes);
    return;
  }
  std::memcpy(out, positions.data(), positions.size() * sizeof(Position));
  with_element_word(element_bytes, "BlockChangeLog",
                    [&](auto word) { gather<decltype(word)>(before, positions, out + positions.size() * sizeof(Position)); });
}

const std::vector<Position>& BlockChangeLog::record(const std::byte* now, const std::byte* before, std::size_t m,
                                                    std::size_t element_bytes) {
  found_.clear();
  const std::size_t count = find_changes(now, before, m, element_bytes, found_);
  const Block block = place(entries_.size(), count, m, element_bytes);
  blocks_.push_back(block);
  if (block.whole) {  // appended as it is, not zeroed first
    entries_.insert(entries_.end(), before, before + m * element_bytes);
    return found_;
  }
  entries_.resize(entries_.size() + entry_bytes(block, m, element_bytes));
  write(block, found_, before, m, element_bytes);
  return found_;
}

void BlockChangeLog::lay_out(const std::vector<std::uint32_t>& changed, std::size_t n, std::size_t block_elements,
                             std::size_t element_bytes) {
  PULSE_CHECK(block_elements > 0 && changed.size() == (n + block_elements - 1) / block_elements,
              "BlockChangeLog.lay_out: one count per block");
  clear();
  std::uint64_t at = 0;
  for (std::size_t b = 0; b < changed.size(); ++b) {
    const std::size_t m = std::min(block_elements, n - b * block_elements);
    blocks_.push_back(place(at, changed[b], m, element_bytes));
    at += entry_bytes(blocks_.back(), m, element_bytes);
  }
  entries_.resize(at);
}

void BlockChangeLog::fill(std::size_t b, const std::vector<Position>& positions, const std::byte* before, std::size_t m,
                          std::size_t element_bytes) {
  const Block& block = blocks_.at(b);
  PULSE_CHECK(positions.size() == block.count,
              "BlockChangeLog.fill: block " + std::to_string(b) + " has " + std::to_string(positions.size()) +
                  " changed positions, its count is " + std::to_string(block.count));
  write(block, positions, before, m, element_bytes);
}

void BlockChangeLog::prefetch_after(std::size_t b) const {
  // The next block's entries are fetched now: blocks are reverted in order, each log's few
  // hundred bytes at a time, too short a run for the hardware prefetcher; their place in the
  // log, a few blocks ahead.
  if (b + kMetadataAhead < blocks_.size()) __builtin_prefetch(&blocks_[b + kMetadataAhead]);
  if (b + 1 < blocks_.size()) {
    const char* next = reinterpret_cast<const char*>(entries_.data() + blocks_[b + 1].first);
    for (std::size_t line = 0; line < kPrefetchLines; ++line) __builtin_prefetch(next + 64 * line);
  }
}

void BlockChangeLog::revert(std::size_t b, std::byte* block, std::size_t m, std::size_t element_bytes) const {
  prefetch_after(b);
  const Block& r = blocks_[b];
  const std::byte* entries = entries_.data() + r.first;
  if (r.whole) {
    std::memcpy(block, entries, m * element_bytes);
    return;
  }
  const std::byte* positions = entries;
  const std::byte* old = entries + r.count * sizeof(Position);
  with_element_word(element_bytes, "BlockChangeLog",
                    [&](auto word) { scatter<decltype(word)>(old, positions, r.count, block); });
}

}  // namespace pulse
