// Block change logs against the versions they log, kept as copies: a series of random versions
// (a few changes, most changed, none, back to an earlier one) logged block by block, then every
// block of the newest version reverted with the logs, newest first, equals each earlier version
// exactly; sparse and whole blocks; 1-, 2-, 4- and 8-byte elements; blocks of unequal lengths;
// logs written block after block (record) and laid out, then filled in shuffled order from two
// threads from the changed positions (lay_out, fill), which hold the same bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>

#include "core/block_change_log.hpp"
#include "core/error.hpp"

using namespace pulse;

namespace {

using Version = std::vector<std::byte>;

// Elements of esz at element i of a and b differ (a plain loop).
bool differs(const Version& a, const Version& b, std::size_t i, std::size_t esz) {
  return std::memcmp(a.data() + i * esz, b.data() + i * esz, esz) != 0;
}

// The next version: step 0 a few changes, 1 most changed, 2 none, 3 back to two versions before.
Version next_version(std::mt19937_64& rng, const std::vector<Version>& history, std::size_t step, std::size_t esz) {
  if (step % 4 == 3) return history[history.size() >= 3 ? history.size() - 3 : 0];
  Version next = history.back();
  const double fraction = step % 4 == 0 ? 0.02 : step % 4 == 1 ? 0.7 : 0.0;
  std::bernoulli_distribution flip(fraction);
  for (std::size_t i = 0; i < next.size() / esz; ++i)
    if (flip(rng)) next[i * esz + rng() % esz] ^= std::byte(1 + rng() % 255);
  return next;
}

// The bytes a log of the change from before to now holds, from its definition: per block, 2 + esz
// bytes per changed element, or the old block where that is no more.
std::size_t expected_bytes(const Version& now, const Version& before, const std::vector<std::size_t>& blocks,
                           std::size_t esz) {
  std::size_t sum = 0, at = 0;
  for (const std::size_t m : blocks) {
    std::size_t changed = 0;
    for (std::size_t i = at; i < at + m; ++i) changed += differs(now, before, i, esz);
    sum += std::min(changed * (2 + esz), m * esz);
    at += m;
  }
  return sum;
}

}  // namespace

TEST(BlockChangeLog, RevertsEveryBlockToEveryEarlierVersion) {
  std::mt19937_64 rng(13);
  for (const std::size_t esz : {1u, 2u, 4u, 8u})
    for (const bool laid_out : {false, true}) {
      SCOPED_TRACE("esz " + std::to_string(esz) + (laid_out ? " lay_out and fill" : " record"));
      // lay_out takes blocks of one length but the last; record any lengths
      const std::vector<std::size_t> blocks = laid_out ? std::vector<std::size_t>{4096, 4096, 4096, 1000}
                                                       : std::vector<std::size_t>{8192, 33, 1, 65536, 100};
      std::size_t n = 0;
      for (const std::size_t m : blocks) n += m;
      std::vector<Version> versions(1, Version(n * esz));
      for (auto& b : versions[0]) b = std::byte(rng());
      const std::size_t count = 12;
      std::vector<BlockChangeLog> logs(count);  // logs[v]: from version v to v + 1
      for (std::size_t v = 0; v < count; ++v) {
        versions.push_back(next_version(rng, versions, v, esz));
        const Version& now = versions[v + 1];
        const Version& before = versions[v];
        if (!laid_out) {
          std::size_t at = 0;
          for (const std::size_t m : blocks) {
            const std::vector<std::uint16_t>& changed =
                logs[v].record(now.data() + at * esz, before.data() + at * esz, m, esz);
            std::vector<std::uint16_t> want;
            for (std::size_t i = 0; i < m; ++i)
              if (differs(now, before, at + i, esz)) want.push_back(std::uint16_t(i));
            ASSERT_EQ(changed, want);
            at += m;
          }
        } else {
          std::vector<std::uint32_t> changed(blocks.size(), 0);
          std::vector<std::vector<std::uint16_t>> positions(blocks.size());  // within each block
          for (std::size_t i = 0; i < n; ++i)
            if (differs(now, before, i, esz)) {
              ++changed[i / blocks[0]];
              positions[i / blocks[0]].push_back(std::uint16_t(i % blocks[0]));
            }
          logs[v].lay_out(changed, n, blocks[0], esz);
          std::vector<std::size_t> order(blocks.size());
          for (std::size_t b = 0; b < order.size(); ++b) order[b] = b;
          std::shuffle(order.begin(), order.end(), rng);
          auto fill = [&](std::size_t from) {
            for (std::size_t o = from; o < order.size(); o += 2) {
              const std::size_t b = order[o], at = b * blocks[0];
              logs[v].fill(b, positions[b], before.data() + at * esz, blocks[b], esz);
            }
          };
          std::thread other(fill, 1);
          fill(0);
          other.join();
        }
        EXPECT_EQ(logs[v].bytes(), expected_bytes(now, before, blocks, esz)) << "version " << v;
      }
      // k steps back from the newest, block by block, for every k
      std::size_t at = 0;
      for (std::size_t b = 0; b < blocks.size(); ++b) {
        const std::size_t m = blocks[b];
        Version block(versions.back().begin() + std::ptrdiff_t(at * esz),
                      versions.back().begin() + std::ptrdiff_t((at + m) * esz));
        for (std::size_t v = count; v-- > 0;) {
          logs[v].revert(b, block.data(), m, esz);
          ASSERT_EQ(0, std::memcmp(block.data(), versions[v].data() + at * esz, m * esz))
              << "block " << b << ", " << count - v << " steps back";
        }
        at += m;
      }
    }
}

TEST(BlockChangeLog, SparseLogsHoldTheChangesWholeOnesTheOldBlock) {
  std::mt19937_64 rng(3);
  const std::size_t m = 8192, esz = 2;
  Version before(m * esz), now;
  for (auto& b : before) b = std::byte(rng());
  now = before;
  for (std::size_t i = 0; i < m; i += 100) now[i * esz] ^= std::byte(1);  // 82 changed
  BlockChangeLog log;
  log.record(now.data(), before.data(), m, esz);
  EXPECT_EQ(log.bytes(), 82u * (2 + esz));
  for (std::size_t i = 0; i < m; ++i) now[i * esz + 1] ^= std::byte(1);  // all changed: the old block
  log.record(now.data(), before.data(), m, esz);
  EXPECT_EQ(log.bytes(), 82u * (2 + esz) + m * esz);
  log.clear();
  EXPECT_EQ(log.bytes(), 0u);
}

TEST(BlockChangeLog, RefusesWhatDoesNotFit) {
  const Version a(64), b(64, std::byte(1));
  BlockChangeLog log;
  EXPECT_THROW(log.lay_out({0, 0}, 100, 10, 2), pulse::Error);  // ten blocks, two counts
  log.lay_out({3, 0}, 20, 10, 2);
  EXPECT_THROW(log.fill(0, {1, 5}, a.data(), 10, 2), pulse::Error);  // two positions, not 3
  EXPECT_THROW(log.record(a.data(), b.data(), 4, 3), pulse::Error);
}
