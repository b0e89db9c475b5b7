// UnitPatchSize::add_block, the patch size coded a block of changes at a time, against
// add_change element by element (test_patch_size holds that equal to encode_patch): the same
// size for 2- and 4-byte elements, sparse and dense blocks, gaps and values that need several
// varint bytes, and blocks that straddle the patch's segments.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "measure/patch_size.hpp"
#include "sync/patch.hpp"

using namespace pulse;

namespace {

template <class Word>
void check(std::mt19937_64& rng, const std::string& dtype, std::size_t numel, std::size_t block, double fraction) {
  std::vector<Word> before(numel), now(numel);
  for (auto& v : before) v = Word(rng());
  now = before;
  std::bernoulli_distribution flip(fraction);
  for (std::size_t e = 0; e < numel; ++e)
    if (flip(rng)) now[e] = rng() % 2 ? Word(now[e] + 1) : Word(rng());  // one ulp, or anything
  measure::UnitPatchSize by_element, by_block;
  by_element.clear(), by_block.clear();
  by_element.add_tensor("t", dtype, numel);
  by_block.add_tensor("t", dtype, numel);
  for (std::size_t b = 0; b < numel; b += block) {
    std::vector<std::uint16_t> positions;
    for (std::size_t e = b; e < std::min(numel, b + block); ++e)
      if (now[e] != before[e]) {
        by_element.add_change(e, now[e], before[e]);
        positions.push_back(std::uint16_t(e - b));
      }
    by_block.add_block<Word>(b, positions, reinterpret_cast<const std::byte*>(now.data() + b),
                             reinterpret_cast<const std::byte*>(before.data() + b));
  }
  for (const int level : {1, 3})
    EXPECT_EQ(by_block.bytes(level), by_element.bytes(level))
        << dtype << ", " << numel << " elements, blocks of " << block << ", fraction " << fraction;
}

}  // namespace

TEST(PatchSizeBlocks, EqualsElementByElement) {
  std::mt19937_64 rng(3);
  const std::uint64_t segment2 = sync::patch_segment_elements(sync::EncodeOptions{}, 2);
  const std::uint64_t segment4 = sync::patch_segment_elements(sync::EncodeOptions{}, 4);
  for (const double fraction : {0.0, 0.001, 0.01, 0.3, 1.0}) {
    check<std::uint16_t>(rng, "BF16", 100000, 8192, fraction);
    check<std::uint16_t>(rng, "F16", 200000, 65536, fraction);
    check<std::uint32_t>(rng, "F32", 50000, 5000, fraction);
  }
  // a second segment, and blocks of 5000 elements that straddle its begin
  check<std::uint16_t>(rng, "BF16", segment2 + 12345, 5000, 0.001);
  check<std::uint32_t>(rng, "F32", segment4 + 777, 5000, 0.001);
}
