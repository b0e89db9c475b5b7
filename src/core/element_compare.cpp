#include "core/element_compare.hpp"

#if defined(__AVX512BW__)
#include <immintrin.h>
#endif
// Where the CPU can, find_changes writes a line's positions with one compress store.
#if defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VBMI2__)
#define PULSE_COMPRESS_POSITIONS 1
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
std::size_t find_changes_of(const std::byte* now, const std::byte* before, std::size_t n, std::uint16_t* at) {
  constexpr std::size_t lanes = 64 / sizeof(Word);  // a cache line: one mask of lanes, vectorised
  std::size_t count = 0, i = 0;
  for (; i + lanes <= n; i += lanes) {
    __builtin_prefetch(before + i * sizeof(Word) + kPrefetchBytes);
    __builtin_prefetch(now + i * sizeof(Word) + kPrefetchBytes);
    const std::uint64_t differ = differing_lanes<Word>(now + i * sizeof(Word), before + i * sizeof(Word));
#if defined(PULSE_COMPRESS_POSITIONS)
    if constexpr (lanes >= 16) {
      // Every line's positions compressed into place, whether or not it holds one: no branch on
      // which lines do, which at a few changes per 1,000 elements would be mispredicted.
      const __m512i first_32 = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15,
                                                14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
      for (std::size_t half = 0; half < lanes; half += 32) {  // 32 positions a store
        const auto part = std::uint32_t(differ >> half);
        const __m512i positions = _mm512_add_epi16(first_32, _mm512_set1_epi16(short(std::uint16_t(i + half))));
        _mm512_storeu_si512(at + count, _mm512_maskz_compress_epi16(part, positions));
        count += std::size_t(__builtin_popcount(part));
      }
      continue;
    }
#endif
    for (std::uint64_t d = differ; d; d &= d - 1) at[count++] = std::uint16_t(i + std::size_t(__builtin_ctzll(d)));
  }
  for (; i < n; ++i)
    if (std::memcmp(now + i * sizeof(Word), before + i * sizeof(Word), sizeof(Word)) != 0) at[count++] = std::uint16_t(i);
  return count;
}

}  // namespace

std::uint64_t count_differing(const std::byte* a, const std::byte* b, std::size_t n, std::size_t element_bytes) {
  return with_element_word(element_bytes, "count_differing",
                           [&](auto word) { return count_differing_of<decltype(word)>(a, b, n); });
}

FoundChanges find_changes(const std::byte* now, const std::byte* before, std::size_t n, std::size_t element_bytes) {
  PULSE_CHECK(n <= kMaxFindElements,
              "find_changes: " + std::to_string(n) + " elements, more than 16-bit positions hold");
  // Room for the most positions and the 32 the last vector store may write past them.
  thread_local std::vector<std::uint16_t> found(kMaxFindElements + 32);
  const std::size_t count = with_element_word(
      element_bytes, "find_changes", [&](auto word) { return find_changes_of<decltype(word)>(now, before, n, found.data()); });
  return {found.data(), count};
}

std::uint64_t find_changes(const std::byte* now, const std::byte* before, std::size_t n, std::size_t element_bytes,
                           std::vector<std::uint16_t>& positions) {
  const FoundChanges found = find_changes(now, before, n, element_bytes);
  positions.insert(positions.end(), found.positions, found.positions + found.count);
  return found.count;
}

}  // namespace pulse
