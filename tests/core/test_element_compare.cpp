// The element comparisons against plain element loops: counts of differing elements and the
// positions found, for 1-, 2-, 4- and 8-byte elements, lengths that are not multiples of a cache
// line, unaligned starts, and changes in the first and last lanes.
#include <gtest/gtest.h>

#include <random>

#include "core/element_compare.hpp"
#include "core/error.hpp"

using namespace pulse;

namespace {

struct Case {
  std::vector<std::byte> before, now;
  std::vector<std::uint16_t> changed;  // element positions, increasing
};

Case make_case(std::mt19937_64& rng, std::size_t n, std::size_t esz, double fraction, std::size_t misalign) {
  Case c;
  c.before.resize(misalign + n * esz);
  for (auto& b : c.before) b = std::byte(rng());
  c.now = c.before;
  std::bernoulli_distribution flip(fraction);
  for (std::size_t i = 0; i < n; ++i)
    if (flip(rng) || (n > 2 && (i == 0 || i == n - 1))) {
      const std::size_t byte = misalign + i * esz + rng() % esz;
      c.now[byte] ^= std::byte(1 + rng() % 255);
      c.changed.push_back(std::uint16_t(i));
    }
  return c;
}

}  // namespace

TEST(ElementCompare, CountsAndPositionsMatchAPlainLoop) {
  std::mt19937_64 rng(5);
  for (const std::size_t esz : {1u, 2u, 4u, 8u})
    for (const std::size_t n : {1u, 7u, 31u, 32u, 33u, 64u, 65u, 1000u, 8192u, 65536u})
      for (const double fraction : {0.0, 0.01, 0.3, 1.0})
        for (const std::size_t misalign : {0u, 2u}) {
          const Case c = make_case(rng, n, esz, fraction, misalign);
          const std::byte* now = c.now.data() + misalign;
          const std::byte* before = c.before.data() + misalign;
          SCOPED_TRACE("esz " + std::to_string(esz) + " n " + std::to_string(n) + " fraction " +
                       std::to_string(fraction));
          EXPECT_EQ(count_differing(now, before, n, esz), c.changed.size());
          std::vector<std::uint16_t> found = {7};  // appended to
          EXPECT_EQ(find_changes(now, before, n, esz, found), c.changed.size());
          found.erase(found.begin());
          EXPECT_EQ(found, c.changed);
        }
}

TEST(ElementCompare, OneUlpStepsInLongRuns) {
  std::mt19937_64 rng(9);
  const std::size_t n = 1 << 21;
  std::vector<std::uint16_t> before(n), now(n);
  for (auto& v : before) v = std::uint16_t(0x3c00 + rng() % 0x380);
  now = before;
  for (auto& v : now)
    if (rng() % 100 == 0) ++v;
  std::vector<std::uint16_t> found;
  for (std::size_t b = 0; b < n; b += 8192) {
    const auto* x = reinterpret_cast<const std::byte*>(now.data() + b);
    const auto* y = reinterpret_cast<const std::byte*>(before.data() + b);
    found.clear();
    ASSERT_EQ(find_changes(x, y, 8192, 2, found), count_differing(x, y, 8192, 2)) << b;
    for (const std::uint16_t p : found) ASSERT_NE(now[b + p], before[b + p]);
  }
}

TEST(ElementCompare, RefusesWhatDoesNotFit) {
  const std::vector<std::byte> a(3 * (kMaxFindElements + 1));
  std::vector<std::uint16_t> found;
  EXPECT_THROW(count_differing(a.data(), a.data(), 1, 3), pulse::Error);
  EXPECT_THROW(find_changes(a.data(), a.data(), 1, 3, found), pulse::Error);
  EXPECT_THROW(find_changes(a.data(), a.data(), kMaxFindElements + 1, 1, found), pulse::Error);
}
