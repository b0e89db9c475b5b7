// The change recency state (versions since each element last changed) and the entropy of a change
// given element contexts such as its recency bucket (src/sync/change_recency.hpp,
// change_entropy.hpp), against hand-derived values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.hpp"
#include "kernels/types.hpp"
#include "sync/change_entropy.hpp"
#include "sync/change_recency.hpp"

using namespace pulse;
using namespace pulse::sync;

namespace {

std::vector<TensorRef> one_tensor(const std::vector<bf16_bits>& bits, const char* name = "w") {
  return {{name, "BF16", {std::int64_t(bits.size())}, reinterpret_cast<const std::byte*>(bits.data()), 2 * bits.size()}};
}

}  // namespace

TEST(ChangeRecency, AgesSaturatesAndMarksOnlySparseTensors) {
  const std::vector<bf16_bits> a(4, 0x3F80);
  const float b[2] = {1.0f, 2.0f};
  const std::int64_t c = 3;
  ChangeRecency r({{"a", "BF16", {4}, reinterpret_cast<const std::byte*>(a.data()), 8},
                   {"b", "F32", {2}, reinterpret_cast<const std::byte*>(b), 8},
                   {"c", "I64", {}, reinterpret_cast<const std::byte*>(&c), 8}});
  ASSERT_NE(r.of("a"), nullptr);
  ASSERT_NE(r.of("b"), nullptr);
  EXPECT_EQ(r.of("c"), nullptr);
  EXPECT_EQ(*r.of("a"), std::vector<std::uint8_t>(4, 255));  // never changed
  EXPECT_EQ(r.of("b")->size(), 2u);
  r.age();
  const std::vector<std::uint64_t> first{1, 3};
  r.mark_changed("a", first.data(), first.size());
  EXPECT_EQ(*r.of("a"), (std::vector<std::uint8_t>{255, 1, 255, 1}));
  r.age();
  const std::vector<int> second{1};
  r.mark_changed("a", second.data(), second.size());
  EXPECT_EQ(*r.of("a"), (std::vector<std::uint8_t>{255, 1, 255, 2}));
  for (int i = 0; i < 253; ++i) r.age();
  EXPECT_EQ(*r.of("a"), (std::vector<std::uint8_t>{255, 254, 255, 255}));
  r.age();
  EXPECT_EQ(*r.of("a"), std::vector<std::uint8_t>(4, 255));
  const std::vector<int> beyond{4};
  EXPECT_THROW(r.mark_changed("a", beyond.data(), beyond.size()), std::out_of_range);
  EXPECT_THROW(r.mark_changed("c", second.data(), second.size()), Error);
}

TEST(ChangeRecency, BucketsAreOneTwoThreeToFourFiveToEightNineToSixteenAndOlder) {
  const unsigned expected[] = {0, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4, 5};
  for (unsigned r = 1; r <= 17; ++r) EXPECT_EQ(ChangeRecency::bucket(std::uint8_t(r)), expected[r - 1]) << r;
  EXPECT_EQ(ChangeRecency::bucket(254), 5u);
  EXPECT_EQ(ChangeRecency::bucket(ChangeRecency::kNever), 5u);
  EXPECT_EQ(ChangeRecency::kBuckets, 6u);
}

TEST(ChangeEntropy, ContextsThatSeparateChangesRemoveTheirPositionAndValueBits) {
  // One exponent class (0x3F80..0x3F87), four of eight elements change: positions 8 H(1/2) = 8
  // bits; two by +1 and two by -1 key steps: values 4 H(1/2) = 4 bits. A context that is 1 exactly
  // where +1 changes happen and 2 where -1 ones do leaves three pure contexts: 0 bits.
  const std::vector<bf16_bits> base{0x3F80, 0x3F81, 0x3F82, 0x3F83, 0x3F84, 0x3F85, 0x3F86, 0x3F87};
  std::vector<bf16_bits> target = base;
  target[1] = 0x3F82, target[2] = 0x3F83;  // +1
  target[5] = 0x3F84, target[6] = 0x3F85;  // -1
  const ChangeEntropy plain = change_entropy(one_tensor(base), one_tensor(target));
  EXPECT_EQ(plain.changes, 4u);
  EXPECT_NEAR(plain.position_bits, 8.0, 1e-9);
  EXPECT_NEAR(plain.value_bits, 4.0, 1e-9);
  ElementContexts separating{{"w", {0, 1, 1, 0, 0, 2, 2, 0}}};
  const ChangeEntropy given = change_entropy(one_tensor(base), one_tensor(target), &separating);
  EXPECT_EQ(given.changes, 4u);
  EXPECT_NEAR(given.position_bits, 0.0, 1e-12);
  EXPECT_NEAR(given.value_bits, 0.0, 1e-12);
  EXPECT_NEAR(given.position_bits_no_context, plain.position_bits_no_context, 1e-12);
  // Context 1 holds elements 0-3 with changes 1, 2 (+1 each); context 2 elements 4-7 with 5, 6
  // (-1 each): positions 2 x 4 H(1/2) = 8 bits, values 0.
  ElementContexts halves{{"w", {1, 1, 1, 1, 2, 2, 2, 2}}};
  const ChangeEntropy by_half = change_entropy(one_tensor(base), one_tensor(target), &halves);
  EXPECT_NEAR(by_half.position_bits, 8.0, 1e-9);
  EXPECT_NEAR(by_half.value_bits, 0.0, 1e-12);
  // Contexts of another tensor, or of the wrong size, are no context.
  for (const ElementContexts& none : {ElementContexts{{"v", {1, 1, 1, 1, 2, 2, 2, 2}}}, ElementContexts{{"w", {1, 2}}}}) {
    const ChangeEntropy e = change_entropy(one_tensor(base), one_tensor(target), &none);
    EXPECT_NEAR(e.position_bits, plain.position_bits, 1e-12);
    EXPECT_NEAR(e.value_bits, plain.value_bits, 1e-12);
  }
}
