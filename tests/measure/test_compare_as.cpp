// pulse-measure's casts of FP32 tensors against independent references: F16 against the
// compiler's IEEE conversion (_Float16, round to nearest even) over every exponent and sign with
// the low bits at and around each rounding boundary, plus random bits, and hand-derived cases
// (ties to even, the largest finite value, overflow, subnormals, NaN); cast_block against the
// element-wise casts, BF16 through kernels/bf16.hpp (test_bf16 holds that against PyTorch's rule).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.hpp"
#include "kernels/bf16.hpp"
#include "measure/compare_as.hpp"

using namespace pulse::measure;

namespace {

std::uint16_t reference_f16(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  const _Float16 h = static_cast<_Float16>(x);
  std::uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}

float from_bits(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

void expect_like_reference(std::uint32_t u) {
  const std::uint16_t got = float_to_f16(from_bits(u)), want = reference_f16(u);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u)
    ASSERT_EQ(got, std::uint16_t(((u >> 16) & 0x8000u) | 0x7E00u)) << std::hex << u;  // NaN: quiet, sign kept
  else
    ASSERT_EQ(got, want) << std::hex << "bits 0x" << u;
}

}  // namespace

TEST(CompareAs, F16MatchesTheCompilersConversion) {
  // Normal halves round at bit 13, subnormal ones higher up: every high half-word, with the low
  // bits below, at and above a bit-13 tie, and at the ends.
  const std::uint32_t lows[] = {0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x2000, 0x2001,
                                0x2FFF, 0x3000, 0x3001, 0x7FFF, 0x8000, 0x8001, 0xEFFF, 0xF000, 0xF001, 0xFFFF};
  for (std::uint32_t high = 0; high < 0x10000; ++high)
    for (const std::uint32_t low : lows) expect_like_reference(high << 16 | low);
  std::mt19937 rng(11);
  for (int i = 0; i < 2000000; ++i) expect_like_reference(rng());
}

TEST(CompareAs, F16HandDerivedCases) {
  EXPECT_EQ(float_to_f16(1.0f), 0x3C00);
  EXPECT_EQ(float_to_f16(-2.0f), 0xC000);
  EXPECT_EQ(float_to_f16(-0.0f), 0x8000);
  // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: to even (1); 1 + 3 * 2^-11: to 1 + 2^-9.
  EXPECT_EQ(float_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  EXPECT_EQ(float_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  EXPECT_EQ(float_to_f16(65504.0f), 0x7BFF);   // the largest finite half
  EXPECT_EQ(float_to_f16(65519.0f), 0x7BFF);
  EXPECT_EQ(float_to_f16(65520.0f), 0x7C00);   // the tie above it goes to infinity
  EXPECT_EQ(float_to_f16(-INFINITY), 0xFC00);
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -24)), 0x0001);  // the smallest subnormal
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // half of it: the tie goes to even, zero
  EXPECT_EQ(float_to_f16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(float_to_f16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 units: tie to even, 2
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -14)), 0x0400);  // the smallest normal
  EXPECT_EQ(float_to_f16(std::ldexp(1023.5f, -24)), 0x0400);  // a subnormal rounding up into the normals
  EXPECT_EQ(float_to_f16(std::nanf("")), 0x7E00);
}

TEST(CompareAs, CastBlockIsTheElementwiseCast) {
  std::mt19937 rng(3);
  std::vector<std::byte> in(4 * 1001 + 1), out(2 * 1001);
  for (auto& b : in) b = std::byte(rng());
  const std::byte* f32 = in.data() + 1;  // unaligned, as a mapped tensor may be
  for (const CompareAs as : {CompareAs::bf16, CompareAs::f16}) {
    cast_block(as, f32, 1001, out.data());
    for (std::size_t i = 0; i < 1001; ++i) {
      float x;
      std::memcpy(&x, f32 + 4 * i, 4);
      std::uint16_t got;
      std::memcpy(&got, out.data() + 2 * i, 2);
      ASSERT_EQ(got, as == CompareAs::bf16 ? pulse::float_to_bf16(x) : float_to_f16(x)) << i;
    }
  }
  EXPECT_THROW(cast_block(CompareAs::raw, f32, 1, out.data()), pulse::Error);
}

TEST(CompareAs, Names) {
  for (const CompareAs as : {CompareAs::raw, CompareAs::bf16, CompareAs::f16})
    EXPECT_EQ(parse_compare_as(compare_as_name(as)), as);
  EXPECT_THROW(parse_compare_as("fp32"), pulse::Error);
}
