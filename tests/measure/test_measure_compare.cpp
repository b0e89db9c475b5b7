// pulse-measure's comparisons and its history against plain element loops: counts of differing
// elements, the positions found, and change logs that revert a newer block to the older one
// exactly (sparse logs and whole-block logs), for 2- and 4-byte elements, lengths that are not
// multiples of a cache line, unaligned starts, and changes in the first and last lanes.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "measure/change_log.hpp"
#include "measure/compare.hpp"

using namespace pulse::measure;

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

TEST(MeasureCompare, CountsAndPositionsMatchAPlainLoop) {
  std::mt19937_64 rng(5);
  for (const std::size_t esz : {2u, 4u})
    for (const std::size_t n : {1u, 7u, 31u, 32u, 33u, 64u, 1000u, 8192u, 65536u})
      for (const double fraction : {0.0, 0.01, 0.3, 1.0})
        for (const std::size_t misalign : {0u, 2u}) {
          const Case c = make_case(rng, n, esz, fraction, misalign);
          const std::byte* now = c.now.data() + misalign;
          const std::byte* before = c.before.data() + misalign;
          SCOPED_TRACE("esz " + std::to_string(esz) + " n " + std::to_string(n) + " fraction " + std::to_string(fraction));
          EXPECT_EQ(count_differing(now, before, n, esz), c.changed.size());
          std::vector<std::uint16_t> found = {7};  // appended to
          EXPECT_EQ(find_changes(now, before, n, esz, found), c.changed.size());
          found.erase(found.begin());
          EXPECT_EQ(found, c.changed);
        }
}

TEST(MeasureCompare, OneUlpStepsInLongRuns) {
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

// Versions v0, v1, ..., v5 of a few blocks; logs of v1..v5 against their predecessors; reverting
// v5's blocks with the logs, newest first, passes through v4, v3, ... v0 exactly.
TEST(ChangeLog, RevertsToEveryEarlierVersion) {
  std::mt19937_64 rng(13);
  for (const std::size_t esz : {2u, 4u}) {
    const std::vector<std::size_t> block_sizes = {8192, 33, 1, 8192, 100};
    std::size_t total = 0;
    for (const std::size_t m : block_sizes) total += m * esz;
    std::vector<std::vector<std::byte>> versions(1, std::vector<std::byte>(total));
    for (auto& b : versions[0]) b = std::byte(rng());
    // fractions changed per version: sparse, none, half (a whole-block log), all, a few back
    for (const double fraction : {0.01, 0.0, 0.5, 1.0, 0.02}) {
      std::vector<std::byte> next = versions.back();
      std::bernoulli_distribution flip(fraction);
      for (std::size_t i = 0; i < total / esz; ++i)
        if (flip(rng)) next[i * esz + rng() % esz] ^= std::byte(1 + rng() % 255);
      versions.push_back(next);
    }
    std::vector<ChangeLog> logs(versions.size() - 1);
    for (std::size_t v = 1; v < versions.size(); ++v) {
      logs[v - 1].clear(std::int64_t(v - 1));
      std::size_t at = 0;
      for (const std::size_t m : block_sizes) {
        const auto& changed = logs[v - 1].record(versions[v].data() + at, versions[v - 1].data() + at, m, esz);
        EXPECT_EQ(changed.size(), count_differing(versions[v].data() + at, versions[v - 1].data() + at, m, esz));
        at += m * esz;
      }
      EXPECT_EQ(logs[v - 1].base_step(), std::int64_t(v - 1));
    }
    std::size_t at = 0;
    for (std::size_t b = 0; b < block_sizes.size(); ++b) {
      const std::size_t m = block_sizes[b];
      std::vector<std::byte> block(versions.back().begin() + std::ptrdiff_t(at),
                                   versions.back().begin() + std::ptrdiff_t(at + m * esz));
      for (std::size_t v = versions.size() - 1; v-- > 0;) {
        logs[v].revert(b, block.data(), m, esz);
        EXPECT_EQ(0, std::memcmp(block.data(), versions[v].data() + at, m * esz)) << "esz " << esz << " block " << b
                                                                                   << " version " << v;
      }
      at += m * esz;
    }
    // The sparse logs hold far less than a version; none holds more than a version and its positions.
    EXPECT_LT(logs[0].bytes(), total / 4);
    for (const ChangeLog& log : logs) EXPECT_LE(log.bytes(), 2 * total + 1024);
  }
}
