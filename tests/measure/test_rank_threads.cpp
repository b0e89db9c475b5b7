// pulse-measure's default threads per rank (src/measure/rank_threads): each core of a rank's mask
// counts 1 / (ranks of the node whose masks hold it), rounded down, at least one thread; masks
// written by hand: bound ranks, unbound ranks sharing the node, masks that overlap in part.
#include <gtest/gtest.h>

#include <initializer_list>

#include "measure/rank_threads.hpp"

using namespace pulse::measure;

namespace {

cpu_set_t mask(std::initializer_list<int> cores) {
  cpu_set_t m;
  CPU_ZERO(&m);
  for (const int c : cores) CPU_SET(c, &m);
  return m;
}

}  // namespace

TEST(RankThreads, BoundRanksTakeTheirCores) {
  const std::vector<cpu_set_t> node = {mask({0, 1, 2, 3}), mask({4, 5, 6, 7}), mask({8}), mask({100, 101})};
  EXPECT_EQ(threads_of_mask(node, 0), 4u);
  EXPECT_EQ(threads_of_mask(node, 1), 4u);
  EXPECT_EQ(threads_of_mask(node, 2), 1u);
  EXPECT_EQ(threads_of_mask(node, 3), 2u);
}

TEST(RankThreads, UnboundRanksShareTheNode) {
  const cpu_set_t all = mask({0, 1, 2, 3, 4, 5, 6, 7});
  EXPECT_EQ(threads_of_mask({all}, 0), 8u);
  EXPECT_EQ(threads_of_mask({all, all}, 1), 4u);
  EXPECT_EQ(threads_of_mask({all, all, all}, 2), 2u);  // 8/3 rounded down
  EXPECT_EQ(threads_of_mask(std::vector<cpu_set_t>(16, all), 5), 1u);  // half a core: still one thread
  const cpu_set_t six = mask({0, 1, 2, 3, 4, 5});
  EXPECT_EQ(threads_of_mask({six, six, six}, 0), 2u);  // 6 x 1/3, exactly 2
}

TEST(RankThreads, OverlappingMasksShareTheCommonCores) {
  // rank 0 alone on cores 0 and 1, with ranks 1 and 2 on cores 2 and 3
  const std::vector<cpu_set_t> node = {mask({0, 1, 2, 3}), mask({2, 3}), mask({2, 3})};
  EXPECT_EQ(threads_of_mask(node, 0), 2u);  // 1 + 1 + 1/3 + 1/3
  EXPECT_EQ(threads_of_mask(node, 1), 1u);  // 2/3, at least one
}

TEST(RankThreads, RefusesARankWithoutAMask) {
  EXPECT_THROW(threads_of_mask({mask({0})}, 1), std::exception);
}
