#pragma once
// Element comparisons by bits (differ or not), for elements of 1, 2, 4 or 8 bytes: the counts and
// positions of changes that pulse-measure and the Python recorder log (core/block_change_log.hpp).
#include <cstddef>
#include <cstdint>
#include <vector>

namespace pulse {

// Elements (of element_bytes 1, 2, 4 or 8) whose bits differ between a and b, blocks in cache; a
// plain loop over lanes, which the compiler vectorises.
std::uint64_t count_differing(const std::byte* a, const std::byte* b, std::size_t n, std::size_t element_bytes);

// The most elements find_changes takes at once: its positions are 16-bit.
constexpr std::size_t kMaxFindElements = std::size_t(1) << 16;

// Appends the positions (0-based, increasing) of the elements of now that differ from before to
// positions, and returns their number; n <= kMaxFindElements. A cache line at a time: a
// vectorised mask of the lanes that differ, then its set bits.
std::uint64_t find_changes(const std::byte* now, const std::byte* before, std::size_t n, std::size_t element_bytes,
                           std::vector<std::uint16_t>& positions);

// The same positions in this thread's own buffer, valid until its next find_changes: for the hot
// loops, which would otherwise copy them.
struct FoundChanges {
  const std::uint16_t* positions;
  std::size_t count;
};
FoundChanges find_changes(const std::byte* now, const std::byte* before, std::size_t n, std::size_t element_bytes);

}  // namespace pulse
