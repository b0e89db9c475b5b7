// The change history a receiver keeps (src/sync/change_history.hpp: age and direction of each
// element's last change, and a digest of the versions it followed) against hand-derived values,
// and the entropy of a change given element contexts such as its age bucket
// (change_entropy.hpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.hpp"
#include "kernels/types.hpp"
#include "sync/change_entropy.hpp"
#include "sync/change_history.hpp"
#include "sync/patch.hpp"

using namespace pulse;
using namespace pulse::sync;

namespace {

std::vector<TensorRef> one_tensor(const std::vector<bf16_bits>& bits, const char* name = "w") {
  return {{name, "BF16", {std::int64_t(bits.size())}, reinterpret_cast<const std::byte*>(bits.data()), 2 * bits.size()}};
}

std::vector<std::uint8_t> bytes_of(const ChangeHistory& h, const char* name, std::size_t n) {
  return std::vector<std::uint8_t>(h.of(name), h.of(name) + n);
}

}  // namespace

TEST(ChangeHistory, AgesSaturatesKeepsDirectionsAndTracksOnlySparseTensors) {
  // BF16 keys: 0x3F80 (1.0) < 0x3F81; for negative values 0xBF80 (-1.0) > 0xBF81.
  const std::vector<bf16_bits> a0{0x3F80, 0x3F80, 0xBF80, 0xBF80};
  const float b[2] = {1.0f, 2.0f};
  const std::int64_t c = 3;
  const std::vector<TensorRef> origin{{"a", "BF16", {4}, reinterpret_cast<const std::byte*>(a0.data()), 8},
                                      {"b", "F32", {2}, reinterpret_cast<const std::byte*>(b), 8},
                                      {"c", "I64", {}, reinterpret_cast<const std::byte*>(&c), 8}};
  ChangeHistory h(origin, Digest{});
  ASSERT_NE(h.of("a"), nullptr);
  ASSERT_NE(h.of("b"), nullptr);
  EXPECT_EQ(h.of("c"), nullptr);
  EXPECT_EQ(bytes_of(h, "a", 4), std::vector<std::uint8_t>(4, 0));  // never changed
  EXPECT_EQ(h.bytes().size(), 6u);                                  // a then b, by name
  // Version 1: element 1 goes up (1.0 -> next), element 2 goes up too (-1.0 -> -next is lower).
  std::vector<bf16_bits> a1 = a0;
  a1[1] = 0x3F81;
  a1[2] = 0xBF81;
  std::vector<TensorRef> v0 = origin, v1 = origin;
  v1[0].data = reinterpret_cast<const std::byte*>(a1.data());
  const Digest d0 = h.digest();
  h.advance(v0, v1, Digest{1});
  EXPECT_EQ(bytes_of(h, "a", 4), (std::vector<std::uint8_t>{0, 0x01, 0x81, 0}));  // age 1; 0x80: lowered
  EXPECT_NE(h.digest(), d0);
  // Version 2 from a change list: element 3 lowered; the others age.
  const std::vector<TensorChanges> changes{{"a", {3}, {0xBF82}}};
  h.advance(v1, changes, Digest{2});
  EXPECT_EQ(bytes_of(h, "a", 4), (std::vector<std::uint8_t>{0, 0x02, 0x82, 0x81}));
  for (int i = 0; i < 200; ++i) h.age();
  EXPECT_EQ(bytes_of(h, "a", 4), (std::vector<std::uint8_t>{0, 127, 0x80 | 127, 0x80 | 127}));  // saturated
  EXPECT_EQ(ChangeHistory::sign_context(0), 0u);
  EXPECT_EQ(ChangeHistory::sign_context(0x01), 1u);
  EXPECT_EQ(ChangeHistory::sign_context(0x81), 1u + ChangeHistory::kBuckets);
  EXPECT_EQ(ChangeHistory::sign_context(0x80 | 127), ChangeHistory::kSignContexts - 1);
  EXPECT_THROW(h.marks("c"), Error);
}

TEST(ChangeHistory, DigestNamesTheVersionsFollowedAndSavedHistoriesComeBack) {
  const std::vector<bf16_bits> w{0x3F80, 0x3F81, 0x3F82};
  std::vector<bf16_bits> w1 = w;
  w1[0] = 0x3F7F;
  ChangeHistory a(one_tensor(w), Digest{7}), b(one_tensor(w), Digest{7}), other(one_tensor(w), Digest{8});
  EXPECT_EQ(a.digest(), b.digest());
  EXPECT_NE(a.digest(), other.digest());
  a.advance(one_tensor(w), one_tensor(w1), Digest{9});
  b.advance(one_tensor(w), one_tensor(w1), Digest{10});  // another version 1
  EXPECT_EQ(a.bytes(), b.bytes());
  EXPECT_NE(a.digest(), b.digest());
  const ChangeHistory back(one_tensor(w), a.bytes(), a.digest());
  EXPECT_EQ(back.bytes(), a.bytes());
  EXPECT_EQ(back.digest(), a.digest());
  EXPECT_THROW(ChangeHistory(one_tensor(w), std::vector<std::uint8_t>(2, 0), a.digest()), Error);
  EXPECT_THROW(ChangeHistory(one_tensor(w), std::vector<std::uint8_t>(4, 0), a.digest()), Error);
}

TEST(ChangeHistory, BucketsAreOneTwoThreeToFourFiveToEightNineToSixteenAndOlder) {
  const unsigned expected[] = {0, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4, 5};
  for (unsigned r = 1; r <= 17; ++r) EXPECT_EQ(ChangeHistory::bucket(r), expected[r - 1]) << r;
  EXPECT_EQ(ChangeHistory::bucket(127), 5u);
  EXPECT_EQ(ChangeHistory::kBuckets, 6u);
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
