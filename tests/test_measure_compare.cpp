// pulse-measure's comparisons against a plain element loop: counts of differing elements and the
// changes added to a patch size (which equals the size of the patch from exactly those changes),
// for 2- and 4-byte elements, lengths that are not multiples of a cache line, unaligned starts,
// and changes in the first and last lanes.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "measure/compare.hpp"

using namespace pulse::measure;

namespace {

struct Case {
  std::vector<std::byte> before, now;
  std::vector<std::size_t> changed;  // element indices, increasing
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
      c.changed.push_back(i);
    }
  return c;
}

std::uint32_t bits(const std::vector<std::byte>& v, std::size_t at, std::size_t esz) {
  std::uint32_t x = 0;
  std::memcpy(&x, v.data() + at, esz);
  return x;
}

}  // namespace

TEST(MeasureCompare, CountsAndChangesMatchAPlainLoop) {
  std::mt19937_64 rng(5);
  for (const std::size_t esz : {2u, 4u})
    for (const std::size_t n : {1u, 7u, 31u, 32u, 33u, 64u, 1000u, 8192u})
      for (const double fraction : {0.0, 0.01, 0.3, 1.0})
        for (const std::size_t misalign : {0u, 2u}) {
          const Case c = make_case(rng, n, esz, fraction, misalign);
          const std::byte* now = c.now.data() + misalign;
          const std::byte* before = c.before.data() + misalign;
          SCOPED_TRACE("esz " + std::to_string(esz) + " n " + std::to_string(n) + " fraction " + std::to_string(fraction));
          EXPECT_EQ(count_differing(now, before, n, esz), c.changed.size());
          // The changes add_changes records give the patch size of the same changes added one by one.
          const std::string dtype = esz == 4 ? "F32" : "BF16";
          UnitPatchSize found, expected;
          found.add_tensor("t", dtype, 1000 + n);
          expected.add_tensor("t", dtype, 1000 + n);
          EXPECT_EQ(add_changes(now, before, n, esz, 1000, found), c.changed.size());
          for (const std::size_t i : c.changed)
            expected.add_change(1000 + i, bits(c.now, misalign + i * esz, esz), bits(c.before, misalign + i * esz, esz));
          EXPECT_EQ(found.bytes(3), expected.bytes(3));
        }
}

TEST(MeasureCompare, LongRunsOfOneUlpSteps) {
  std::mt19937_64 rng(9);
  const std::size_t n = 1 << 21;
  std::vector<std::uint16_t> before(n), now(n);
  for (auto& v : before) v = std::uint16_t(0x3c00 + rng() % 0x380);
  now = before;
  std::size_t changed = 0;
  for (auto& v : now)
    if (rng() % 100 == 0) ++v, ++changed;
  UnitPatchSize patch;
  patch.add_tensor("t", "BF16", n);
  for (std::size_t b = 0; b < n; b += 8192) {
    const auto* x = reinterpret_cast<const std::byte*>(now.data() + b);
    const auto* y = reinterpret_cast<const std::byte*>(before.data() + b);
    ASSERT_EQ(add_changes(x, y, 8192, 2, b, patch), count_differing(x, y, 8192, 2)) << b;
  }
  EXPECT_GT(changed, 0u);
}
