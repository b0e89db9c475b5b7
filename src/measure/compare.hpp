#pragma once
// The element comparisons of pulse-measure: bits differ or not, for 2- and 4-byte elements.
#include <cstddef>
#include <cstdint>

#include "measure/patch_size.hpp"

namespace pulse::measure {

// Elements (of element_bytes 2 or 4) whose bits differ between a and b; a plain loop over
// lanes, which the compiler vectorises.
std::uint64_t count_differing(const std::byte* a, const std::byte* b, std::size_t n, std::size_t element_bytes);

// Adds the elements of now that differ from before to patch, as changes of its last tensor
// (element 0 is the tensor's element first_index), and returns their number. A cache line at a
// time: a vectorised mask of the lanes that differ, then its set bits.
std::uint64_t add_changes(const std::byte* now, const std::byte* before, std::size_t n, std::size_t element_bytes,
                          std::uint64_t first_index, UnitPatchSize& patch);

}  // namespace pulse::measure
