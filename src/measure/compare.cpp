#include "measure/compare.hpp"

#include <algorithm>
#include <cstring>

namespace pulse::measure {

namespace {

template <class Word>
std::uint64_t count_differing_of(const std::byte* a, const std::byte* b, std::size_t n) {
  std::uint64_t count = 0;
  constexpr std::size_t chunk = std::size_t(1) << 20;  // 32-bit lanes count it: twice as many per vector
  for (std::size_t begin = 0; begin < n; begin += chunk) {
    const std::size_t end = std::min(n, begin + chunk);
    std::uint32_t in_chunk = 0;
    for (std::size_t i = begin; i < end; ++i) {
      Word x, y;
      std::memcpy(&x, a + i * sizeof(Word), sizeof(Word));
      std::memcpy(&y, b + i * sizeof(Word), sizeof(Word));
      in_chunk += x != y;
    }
    count += in_chunk;
  }
  return count;
}

template <class Word>
std::uint64_t add_changes_of(const std::byte* now, const std::byte* before, std::size_t n, std::uint64_t first_index,
                             UnitPatchSize& patch) {
  constexpr std::size_t lanes = 64 / sizeof(Word);  // a cache line: one mask of lanes, vectorised
  std::uint64_t count = 0;
  auto load = [](const std::byte* p, std::size_t i) {
    Word w;
    std::memcpy(&w, p + i * sizeof(Word), sizeof(Word));
    return w;
  };
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    std::uint64_t differ = 0;
    for (std::size_t l = 0; l < lanes; ++l) differ |= std::uint64_t(load(now, i + l) != load(before, i + l)) << l;
    count += std::uint64_t(__builtin_popcountll(differ));
    for (; differ; differ &= differ - 1) {
      const std::size_t at = i + std::size_t(__builtin_ctzll(differ));
      patch.add_change(first_index + at, load(now, at), load(before, at));
    }
  }
  for (; i < n; ++i)
    if (load(now, i) != load(before, i)) ++count, patch.add_change(first_index + i, load(now, i), load(before, i));
  return count;
}

}  // namespace

std::uint64_t count_differing(const std::byte* a, const std::byte* b, std::size_t n, std::size_t element_bytes) {
  return element_bytes == 4 ? count_differing_of<std::uint32_t>(a, b, n) : count_differing_of<std::uint16_t>(a, b, n);
}

std::uint64_t add_changes(const std::byte* now, const std::byte* before, std::size_t n, std::size_t element_bytes,
                          std::uint64_t first_index, UnitPatchSize& patch) {
  return element_bytes == 4 ? add_changes_of<std::uint32_t>(now, before, n, first_index, patch)
                            : add_changes_of<std::uint16_t>(now, before, n, first_index, patch);
}

}  // namespace pulse::measure
