// The edit distance behind "did you mean": hand-derived distances and the choice of candidate.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "cli/closest_name.hpp"

using pulse::cli::closest_name;
using pulse::cli::edit_distance;

TEST(EditDistance, HandDerivedCases) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("base", "base"), 0u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("encod", "encode"), 1u);    // one insertion
  EXPECT_EQ(edit_distance("--bsae", "--base"), 1u);   // one swap of neighbours, not two substitutions
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);  // the textbook case
  EXPECT_EQ(edit_distance("ca", "abc"), 3u);          // optimal string alignment: no edit of a swapped pair
  EXPECT_EQ(edit_distance("verfiy", "verify"), 1u);
}

TEST(EditDistance, IsSymmetric) {
  for (const auto& [a, b] : std::vector<std::pair<std::string, std::string>>{{"pull", "publish"}, {"--lr", "--level"}, {"ab", "ba"}})
    EXPECT_EQ(edit_distance(a, b), edit_distance(b, a)) << a << " " << b;
}

TEST(ClosestName, PicksTheNearestAndRefusesFarOnes) {
  const std::vector<std::string> subcommands = {"diff", "encode", "apply", "verify", "inspect", "keygen", "publish", "pull"};
  EXPECT_EQ(closest_name("encod", subcommands), "encode");
  EXPECT_EQ(closest_name("inspcet", subcommands), "inspect");
  EXPECT_EQ(closest_name("pul", subcommands), "pull");
  EXPECT_EQ(closest_name("zzzzzz", subcommands), "");
  EXPECT_EQ(closest_name("x", subcommands), "");  // a one-letter word is not a typo of anything
  EXPECT_EQ(closest_name("--max-kk", {"--max-k", "--level", "--help"}), "--max-k");
  EXPECT_EQ(closest_name("anything", {}), "");
}
