// The PULSELoCo gate against a naive host loop and hand-derived cases around BF16 ties,
// signed zeros and NaNs; compact_fired's capacity contract.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/gate.hpp"
#include "kernels/host_copy.hpp"
#include "support/backends.hpp"

namespace {

using pulse::index_t;

const float nan_f = std::numeric_limits<float>::quiet_NaN();
const float inf_f = std::numeric_limits<float>::infinity();

std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

std::vector<std::uint8_t> naive_mask(const std::vector<float>& theta, const std::vector<float>& s) {
  std::vector<std::uint8_t> mask(theta.size());
  for (std::size_t i = 0; i < theta.size(); ++i) {
    const volatile float stepped = theta[i] - s[i];  // one rounded subtraction, nothing fused
    mask[i] = pulse::float_to_bf16(theta[i]) != pulse::float_to_bf16(stepped);
  }
  return mask;
}

template <class B>
using Gate = pulse::test::OnBackend<B>;
TYPED_TEST_SUITE(Gate, pulse::test::BackendTypes, pulse::test::BackendNames);

TYPED_TEST(Gate, HandDerived) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  // theta = 1: BF16 neighbours 1 - 2^-8 below, 1 + 2^-7 above.
  const std::vector<float> theta = {1, 1, 1, 1, 1, 1, 1, -0.0f, 0.0f, nan_f, 1, 1};
  const std::vector<float> s = {-0x1p-9f,      // 1 + 2^-9 rounds back to 1
                                -0x1p-8f,      // 1 + 2^-8: tie, even is 1
                                -3 * 0x1p-9f,  // 1 + 1.5 * 2^-8 rounds up to 1 + 2^-7
                                0x1p-9f,       // 1 - 2^-9: tie below, even is 1
                                0x1p-8f,       // 1 - 2^-8 is a BF16 value
                                0,  nan_f,     // no step; NaN step fires (0x7FC0 != 0x3F80)
                                -0.0f,         // -0 - -0 = +0: bits flip
                                0.0f,          // +0 - +0 = +0
                                1,             // NaN weight never fires
                                -inf_f, 1e-30f};
  const std::vector<std::uint8_t> expected = {0, 0, 1, 0, 1, 0, 1, 1, 0, 0, 1, 0};
  ASSERT_EQ(naive_mask(theta, s), expected);
  Kokkos::View<std::uint8_t*, Mem> mask("mask", theta.size());
  EXPECT_EQ(pulse::gate_mask(space, pulse::to_device<Mem>(theta), pulse::to_device<Mem>(s), mask), 5);
  EXPECT_EQ(pulse::to_host(mask), expected);
}

std::pair<std::vector<float>, std::vector<float>> random_inputs(index_t n, std::mt19937_64& rng) {
  std::vector<float> theta(n), s(n);
  std::normal_distribution<float> normal(0, 0.05f);
  std::uniform_real_distribution<double> log2_scale(-12, 2);
  for (index_t i = 0; i < n; ++i) {
    theta[i] = normal(rng);
    const float half_ulp = pulse::bf16_half_ulp(pulse::float_to_bf16(theta[i]));
    switch (rng() % 8) {
      case 0: s[i] = (rng() % 2) ? half_ulp : -half_ulp; break;  // exact ties
      case 1: s[i] = (rng() % 2) ? 0.0f : -0.0f; theta[i] = (rng() % 2) ? 0.0f : -0.0f; break;
      case 2: s[i] = theta[i] - pulse::round_to_bf16(theta[i]); break;  // lands on the BF16 value
      default: s[i] = half_ulp * static_cast<float>(std::exp2(log2_scale(rng))) * ((rng() % 2) ? 1 : -1);
    }
  }
  return {theta, s};
}

// On every backend: the host code path (flag words) and the device one (an element-wise scan).
TYPED_TEST(Gate, MaskAndCompactionMatchNaiveLoop) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  std::mt19937_64 rng(8);
  for (const index_t n : {0, 1, 7, 33, 1000003}) {
    const auto [theta, s] = random_inputs(n, rng);
    const auto expected = naive_mask(theta, s);
    std::vector<index_t> fired;
    for (index_t i = 0; i < n; ++i)
      if (expected[i]) fired.push_back(i);
    const auto theta_v = pulse::to_device<Mem>(theta), s_v = pulse::to_device<Mem>(s);

    Kokkos::View<std::uint8_t*, Mem> mask("mask", n);
    EXPECT_EQ(pulse::gate_mask(space, theta_v, s_v, mask), static_cast<index_t>(fired.size()));
    EXPECT_EQ(pulse::to_host(mask), expected) << "n " << n;
    if (n > 1000) {  // the random mix must exercise both outcomes
      EXPECT_GT(fired.size(), std::size_t(n / 10));
      EXPECT_LT(fired.size(), std::size_t(n - n / 10));
    }

    const index_t count = static_cast<index_t>(fired.size());
    for (const index_t capacity : {index_t(0), count / 2, count, count + 3}) {
      const float sentinel = -12345.0f;
      const auto indices = pulse::to_device<Mem>(std::vector<index_t>(capacity, -1));
      const auto values = pulse::to_device<Mem>(std::vector<float>(capacity, sentinel));
      ASSERT_EQ(pulse::compact_fired(space, theta_v, s_v, indices, values), count);
      const auto got_i = pulse::to_host(indices);
      const auto got_v = pulse::to_host(values);
      for (index_t j = 0; j < capacity; ++j) {
        if (j < count) {
          ASSERT_EQ(got_i[j], fired[j]) << "n " << n << " capacity " << capacity << " entry " << j;
          ASSERT_EQ(bits_of(got_v[j]), bits_of(s[fired[j]])) << "entry " << j;
        } else {
          ASSERT_EQ(got_i[j], -1) << "entry " << j << " written beyond the count";
          ASSERT_EQ(bits_of(got_v[j]), bits_of(sentinel)) << "entry " << j << " written beyond the count";
        }
      }
    }
  }
}

TYPED_TEST(Gate, RejectsMismatchedSizes) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  const Kokkos::View<float*, Mem> a("a", 3), b("b", 4);
  Kokkos::View<std::uint8_t*, Mem> mask3("mask", 3), mask4("mask", 4);
  EXPECT_THROW(pulse::gate_mask(space, a, b, mask3), pulse::Error);
  EXPECT_THROW(pulse::gate_mask(space, a, a, mask4), pulse::Error);
  EXPECT_THROW(pulse::compact_fired(space, a, a, Kokkos::View<index_t*, Mem>("i", 2), Kokkos::View<float*, Mem>("v", 1)),
               pulse::Error);
}

}  // namespace
