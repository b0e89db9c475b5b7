// pulse-measure's k-step counts (src/measure/kstep_history) against brute force: a random series
// of versions whose elements change sparsely, densely (whole-block logs) or change back to
// earlier bits, with steps that skip some numbers, compared block by block as pulse-measure does;
// each count equals a plain loop over the whole version k steps back, for 2- and 4-byte
// elements, every --max-k's list of k, and checkpoints measured one at a time or in batches.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <random>

#include "measure/kstep_history.hpp"

using namespace pulse::measure;

namespace {

using Version = std::vector<std::byte>;

std::int64_t count_differing_plain(const Version& a, const Version& b, std::size_t esz) {
  std::int64_t n = 0;
  for (std::size_t e = 0; e < a.size() / esz; ++e) n += std::memcmp(a.data() + e * esz, b.data() + e * esz, esz) != 0;
  return n;
}

// The next version: a fraction of the elements get new bits, and some take back their bits of
// an earlier version (as weights that step up and down by one ulp do).
Version next_version(std::mt19937_64& rng, const std::vector<Version>& series, std::size_t esz, double fraction) {
  Version v = series.back();
  std::bernoulli_distribution flip(fraction), back(0.3);
  for (std::size_t e = 0; e < v.size() / esz; ++e) {
    if (!flip(rng)) continue;
    if (back(rng) && series.size() > 1) {
      const Version& earlier = series[rng() % (series.size() - 1)];
      std::memcpy(v.data() + e * esz, earlier.data() + e * esz, esz);
    } else {
      v[e * esz + rng() % esz] ^= std::byte(1 + rng() % 255);
    }
  }
  return v;
}

}  // namespace

TEST(MeasureKStep, CountsEqualBruteForceOnARandomSeries) {
  std::mt19937_64 rng(29);
  const std::vector<std::size_t> block_sizes = {8192, 8192, 100, 8192, 1, 4000};  // one share's blocks
  std::size_t numel = 0;
  for (const std::size_t m : block_sizes) numel += m;
  for (const std::size_t esz : {2u, 4u}) {
    std::vector<Version> versions(1, Version(numel * esz));
    for (auto& b : versions[0]) b = std::byte(rng());
    std::vector<std::int64_t> steps = {0};
    for (int i = 1; i < 44; ++i) {
      // mostly sparse; a dense step now and then (whole-block logs), one with no change
      const double fraction = i == 7 ? 0.0 : i % 11 == 5 ? 0.6 : 0.01 + 0.02 * double(i % 3);
      versions.push_back(next_version(rng, versions, esz, fraction));
      steps.push_back(steps.back() + (i % 9 == 4 ? 3 : 1));  // some steps without a checkpoint
    }
    // measured one checkpoint at a time, and in batches of several, block by block
    for (const std::size_t batch : {1u, 3u, 8u})
      for (const std::vector<int>& ks : {std::vector<int>{1}, {1, 2, 4}, {1, 2, 4, 8, 16, 32}}) {
        SCOPED_TRACE("esz " + std::to_string(esz) + " batch " + std::to_string(batch) + " max-k " +
                     std::to_string(ks.back()));
        KStepHistory history(ks);
        history.start({0}, std::nullopt);
        std::vector<int> held(ks.size(), 0);  // checkpoints with one k steps back
        for (std::size_t first = 1; first < versions.size(); first += batch) {
          const std::size_t n = std::min(batch, versions.size() - first);
          history.start(std::vector<std::int64_t>(steps.begin() + std::ptrdiff_t(first), steps.begin() + std::ptrdiff_t(first + n)),
                        steps[first - 1]);
          std::vector<std::vector<std::int64_t>> differing(n, std::vector<std::int64_t>(ks.size(), 0));
          std::vector<std::int64_t> changed(n, 0);
          std::vector<std::int64_t*> counts;
          for (std::vector<std::int64_t>& d : differing) counts.push_back(d.data());
          std::size_t at = 0;
          for (const std::size_t m : block_sizes) {
            std::vector<const std::byte*> blocks;  // the checkpoint before the batch, then the batch's
            for (std::size_t v = first - 1; v < first + n; ++v) blocks.push_back(versions[v].data() + at);
            for (std::size_t j = n; j-- > 0;)  // in any order
              changed[j] += std::int64_t(history.record(j, blocks[j + 1], blocks[j], m, esz, differing[j].data()).size());
            history.count(blocks, m, esz, counts);
            at += m * esz;
          }
          for (std::size_t j = 0; j < n; ++j) {
            const std::size_t i = first + j;
            EXPECT_EQ(changed[j], count_differing_plain(versions[i], versions[i - 1], esz)) << "checkpoint " << i;
            for (std::size_t k = 0; k < ks.size(); ++k) {
              std::optional<std::size_t> back;  // the checkpoint of step steps[i] - k, if any
              for (std::size_t h = 0; h < i; ++h)
                if (steps[h] == steps[i] - ks[k]) back = h;
              const std::int64_t want = back ? count_differing_plain(versions[i], versions[*back], esz) : 0;
              EXPECT_EQ(differing[j][k], want) << "checkpoint " << i << " k " << ks[k];
              held[k] += back.has_value();
            }
          }
        }
        for (const int h : held) EXPECT_GE(h, 5);  // the comparisons above were made, at every k
      }
  }
}

TEST(MeasureKStep, RefusesABlockWithoutAPreviousCheckpoint) {
  KStepHistory history({1, 2});
  history.start({5}, std::nullopt);
  std::vector<std::byte> block(64);
  std::vector<std::int64_t> differing(2);
  EXPECT_THROW(history.record(0, block.data(), block.data(), 32, 2, differing.data()), std::exception);
}

TEST(MeasureKStep, RefusesABlockOutOfTurn) {
  KStepHistory history({1, 2});
  history.start({5}, std::nullopt);
  history.start({6, 7}, 5);
  std::vector<std::byte> block(64);
  std::vector<std::int64_t> differing(2);
  std::vector<std::int64_t*> counts = {differing.data(), differing.data()};
  const std::vector<const std::byte*> blocks(3, block.data());
  EXPECT_THROW(history.record(2, block.data(), block.data(), 32, 2, differing.data()), std::exception);  // no checkpoint 2
  history.record(0, block.data(), block.data(), 32, 2, differing.data());
  EXPECT_THROW(history.record(0, block.data(), block.data(), 32, 2, differing.data()), std::exception);  // twice
  EXPECT_THROW(history.count(blocks, 32, 2, counts), std::exception);  // before checkpoint 1 recorded it
}
