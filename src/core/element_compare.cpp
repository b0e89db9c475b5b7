#include "core/element_compare.hpp"

#if defined(__AVX512BW__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <string>

#include "core/element_word.hpp"
#include "core/error.hpp"

namespace pulse {

namespace {

// How far ahead find_changes fetches the blocks from memory: the hardware prefetcher stops at
// each 4 KiB page. (count_differing compares blocks in cache: a prefetch per line made it a
// quarter slower, measured.)
constexpr std::size_t kPrefetchBytes = 4096;

// Bit l set when lane l of the cache lines at a and b differs (64, 32, 16 or 8 lanes).
template <class Word>
std::uint64_t differing_lanes(const std::byte* a, const std::byte* b) {
#if defined(__AVX512BW__)
  // 2-byte lanes: one compare into a mask register; the loop below compiles to a dozen
  // instructions. (Not for 4-byte lanes: GCC 12 spills their 16-bit mask and reloads 32 bits.)
  if constexpr (sizeof(Word) == 2) return _mm512_cmpneq_epi16_mask(_mm512_loadu_si512(a), _mm512_loadu_si512(b));
#endif
  constexpr std::size_t lanes = 64 / sizeof(Word);
  std::uint64_t differ = 0;
  for (std::size_t l = 0; l < lanes; ++l) {
    Word x, y;
    std::memcpy(&x, a + l * sizeof(Word), sizeof(Word));
    std::memcpy(&y, b + l * sizeof(Word), sizeof(Word));
    differ |= std::uint64_t(x != y) << l;
  }
  return differ;
}

template <class Word>
std::uint64_t count_differing_of(const std::byte* a, const std::byte* b, std::size_t n) {
  constexpr std::size_t lanes = 64 / sizeof(Word);  // a cache line
  auto differ = [&](std::size_t i) {
    Word x, y;
    std::memcpy(&x, a + i * sizeof(Word), sizeof(Word));
    std::memcpy(&y, b + i * sizeof(Word), sizeof(Word));
    return std::uint32_t(x != y);
  };
  std::uint64_t count = 0;
  std::size_t i = 0;
#if defined(__AVX512BW__)
  if constexpr (sizeof(Word) == 2) {  // a mask per cache line and its popcount: half the instructions
    for (; i + lanes <= n; i += lanes)
      count += std::uint64_t(__builtin_popcountll(differing_lanes<Word>(a + i * sizeof(Word), b + i * sizeof(Word))));
  }
#endif
  constexpr std::size_t chunk = std::size_t(1) << 20;  // 32-bit lanes count it: twice as many per vector
  while (i + lanes <= n) {
    const std::size_t end = std::min(n, i + chunk) / lanes * lanes;
    std::uint32_t in_chunk = 0;
    for (; i < end; i += lanes)
      for (std::size_t l = 0; l < lanes; ++l) in_chunk += differ(i + l);
    count += in_chunk;
  }
  for (; i < n; ++i) count += differ(i);
  return count;
}

template <class Word>
std::uint64_t find_changes_of(const std::byte* now, const std::byte* before, std::size_t n,
                              std::vector<std::uint16_t>& positions) {
  constexpr std::size_t lanes = 64 / sizeof(Word);  // a cache line: one mask of lanes, vectorised
  const std::size_t first = positions.size();
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    __builtin_prefetch(before + i * sizeof(Word) + kPrefetchBytes);
    __builtin_prefetch(now + i * sizeof(Word) + kPrefetchBytes);
    for (std::uint64_t differ = differing_lanes<Word>(now + i * sizeof(Word), before + i * sizeof(Word)); differ;
         differ &= differ - 1)
      positions.push_back(std::uint16_t(i + std::size_t(__builtin_ctzll(differ))));
  }
  for (; i < n; ++i)
    if (std::memcmp(now + i * sizeof(Word), before + i * sizeof(Word), sizeof(Word)) != 0)
      positions.push_back(std::uint16_t(i));
  return positions.size() - first;
}

}  // namespace

std::uint64_t count_differing(const std::byte* a, const std::byte* b, std::size_t n, std::size_t element_bytes) {
  return with_element_word(element_bytes, "count_differing",
                           [&](auto word) { return count_differing_of<decltype(word)>(a, b, n); });
}

std::uint64_t find_changes(const std::byte* now, const std::byte* before, std::size_t n, std::size_t element_bytes,
                           std::vector<std::uint16_t>& positions) {
  PULSE_CHECK(n <= kMaxFindElements,
              "find_changes: " + std::to_string(n) + " elements, more than 16-bit positions hold");
  return with_element_word(element_bytes, "find_changes",
                           [&](auto word) { return find_changes_of<decltype(word)>(now, before, n, positions); });
}

}  // namespace pulse
