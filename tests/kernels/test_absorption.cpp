// Absorption histograms against a naive host loop that bins by frexp() of the ratio computed in
// double (exact here: a float divided by a power of two), not by exponent bits as the kernel does.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/absorption.hpp"
#include "kernels/host_copy.hpp"
#include "support/backends.hpp"

namespace {

using pulse::index_t;
using pulse::Log2Histogram;
using pulse::Log2Range;

const float nan_f = std::numeric_limits<float>::quiet_NaN();
const float inf_f = std::numeric_limits<float>::infinity();

float from_bits(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

Log2Histogram empty_histogram(Log2Range r) {
  Log2Histogram h;
  h.range = r;
  h.bins.assign(r.k_max - r.k_min, 0);
  return h;
}

// Adds a value known by its magnitude in double (NaN/Inf for non-finite).
void add(Log2Histogram& h, double magnitude) {
  if (!std::isfinite(magnitude)) return void(++h.non_finite);
  if (magnitude == 0) return void(++h.zero);
  int e;
  std::frexp(magnitude, &e);  // magnitude = m * 2^e, m in [0.5, 1): floor(log2) = e - 1
  const int k = e - 1;
  if (k < h.range.k_min) return void(++h.below);
  if (k >= h.range.k_max) return void(++h.above);
  ++h.bins[k - h.range.k_min];
}

pulse::AbsorptionStats naive(const std::vector<float>& w, const std::vector<float>& u, Log2Range ratio_range,
                             Log2Range weight_range) {
  pulse::AbsorptionStats s;
  s.ratio = empty_histogram(ratio_range);
  s.weight = empty_histogram(weight_range);
  for (std::size_t i = 0; i < w.size(); ++i) {
    add(s.weight, std::fabs(double(w[i])));
    const double half_ulp = pulse::bf16_half_ulp(pulse::float_to_bf16(w[i]));
    const bool finite = std::isfinite(w[i]) && std::isfinite(u[i]) && std::isfinite(half_ulp);
    const double ratio = finite ? std::fabs(double(u[i])) / half_ulp : nan_f;
    add(s.ratio, ratio);
    s.absorbed += finite && ratio < 1;
  }
  return s;
}

void expect_equal(const Log2Histogram& got, const Log2Histogram& want, const std::string& what) {
  EXPECT_EQ(got.range.k_min, want.range.k_min) << what;
  EXPECT_EQ(got.range.k_max, want.range.k_max) << what;
  EXPECT_EQ(got.bins, want.bins) << what;
  EXPECT_EQ(got.zero, want.zero) << what;
  EXPECT_EQ(got.below, want.below) << what;
  EXPECT_EQ(got.above, want.above) << what;
  EXPECT_EQ(got.non_finite, want.non_finite) << what;
}

TEST(FloorLog2Abs, NormalsAndSubnormals) {
  EXPECT_EQ(pulse::floor_log2_abs(1.0f), 0);
  EXPECT_EQ(pulse::floor_log2_abs(-1.9999999f), 0);
  EXPECT_EQ(pulse::floor_log2_abs(0.75f), -1);
  EXPECT_EQ(pulse::floor_log2_abs(from_bits(0x7F7FFFFF)), 127);
  EXPECT_EQ(pulse::floor_log2_abs(from_bits(0x00800000)), -126);
  EXPECT_EQ(pulse::floor_log2_abs(from_bits(0x007FFFFF)), -127);
  EXPECT_EQ(pulse::floor_log2_abs(from_bits(0x80000001)), -149);
  EXPECT_EQ(pulse::floor_log2_abs(from_bits(0x00000003)), -148);
}

template <class B>
using Absorption = pulse::test::OnBackend<B>;
TYPED_TEST_SUITE(Absorption, pulse::test::BackendTypes, pulse::test::BackendNames);

TYPED_TEST(Absorption, HandDerived) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  // w = 1: bf16 1.0, half ulp 2^-8. w = 0: half ulp 2^-134. FLT_MAX rounds to bf16 infinity.
  const std::vector<float> w = {1, 1, 1, -1, 1, 0, 0, nan_f, from_bits(0x7F7FFFFF), 1, -inf_f, 1};
  const std::vector<float> u = {0x1p-9f, 0x1p-8f,    3 * 0x1p-8f, -0.0f, nan_f, 0x1p-140f,
                                from_bits(1), 1, 1, -inf_f, 0, 0x1p-30f};
  const auto s = pulse::absorption_stats(space, pulse::to_device<Mem>(w), pulse::to_device<Mem>(u), {-16, 16});
  const auto& r = s.ratio;
  EXPECT_EQ(r.bins[-1 + 16], 1);  // 2^-9 / 2^-8 = 1/2
  EXPECT_EQ(r.bins[0 + 16], 1);   // exactly one half ulp: ratio 1, not absorbed
  EXPECT_EQ(r.bins[1 + 16], 1);   // ratio 3
  EXPECT_EQ(r.bins[-6 + 16], 1);   // 2^-140 / 2^-134
  EXPECT_EQ(r.bins[-15 + 16], 1);  // subnormal 2^-149 / 2^-134
  EXPECT_EQ(r.zero, 1);
  EXPECT_EQ(r.below, 1);  // 2^-30 / 2^-8 = 2^-22
  EXPECT_EQ(r.above, 0);
  EXPECT_EQ(r.non_finite, 5);  // NaN update, NaN weight, bf16(FLT_MAX) = inf, inf update, inf weight
  EXPECT_EQ(r.total(), 12);
  EXPECT_EQ(s.absorbed, 5);  // ratios 1/2, 2^-6, 2^-15, 2^-22 and the -0 update
  const auto& h = s.weight;
  EXPECT_EQ(h.range.k_min, -149);
  EXPECT_EQ(h.bins[0 + 149], 7);  // |w| = 1
  EXPECT_EQ(h.bins[127 + 149], 1);
  EXPECT_EQ(h.zero, 2);
  EXPECT_EQ(h.non_finite, 2);
  EXPECT_EQ(h.total(), 12);
}

// Weights over many binades (subnormal to huge, zeros, non-finite) and updates scaled to land
// around the half-ulp threshold, exactly on it, and far off it.
std::pair<std::vector<float>, std::vector<float>> random_inputs(index_t n, std::mt19937_64& rng) {
  std::vector<float> w(n), u(n);
  std::uniform_real_distribution<double> log2_mag(-30, 6), log2_ratio(-30, 10);
  for (index_t i = 0; i < n; ++i) {
    const float sign = (rng() % 2) ? 1.0f : -1.0f;
    switch (rng() % 16) {
      case 0: w[i] = sign * 0.0f; break;
      case 1: w[i] = from_bits(static_cast<std::uint32_t>(rng() & 0x807FFFFFu)); break;  // subnormal
      case 2: w[i] = (rng() % 3) ? sign * inf_f : nan_f; break;
      case 3: w[i] = sign * from_bits(0x7F7F0000u + static_cast<std::uint32_t>(rng() % 0x10000u)); break;
      default: w[i] = sign * static_cast<float>(std::exp2(log2_mag(rng)));
    }
    const double half_ulp = pulse::bf16_half_ulp(pulse::float_to_bf16(w[i]));
    const float usign = (rng() % 2) ? 1.0f : -1.0f;
    switch (rng() % 12) {
      case 0: u[i] = usign * 0.0f; break;
      case 1: u[i] = (rng() % 2) ? usign * inf_f : nan_f; break;
      case 2: u[i] = usign * static_cast<float>(half_ulp); break;                      // ratio exactly 1
      case 3: u[i] = usign * std::nextafter(static_cast<float>(half_ulp), 0.0f); break;  // just below
      case 4: u[i] = from_bits(static_cast<std::uint32_t>(rng() & 0x807FFFFFu)); break;
      default: u[i] = usign * static_cast<float>(half_ulp * std::exp2(log2_ratio(rng)));
    }
  }
  return {w, u};
}

TYPED_TEST(Absorption, MatchesNaiveLoop) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  std::mt19937_64 rng(7);
  const std::vector<std::pair<Log2Range, Log2Range>> ranges = {
      {{-16, 16}, pulse::all_float_binades}, {{-4, 2}, {-10, 0}}, {{0, 1}, {-200, 200}}};
  for (const index_t n : {0, 1, 7, 33, 1000003}) {
    const auto [w, u] = random_inputs(n, rng);
    const auto wv = pulse::to_device<Mem>(w), uv = pulse::to_device<Mem>(u);
    for (const auto& [ratio_range, weight_range] : ranges) {
      const auto got = pulse::absorption_stats(space, wv, uv, ratio_range, weight_range);
      const auto want = naive(w, u, ratio_range, weight_range);
      const std::string what = "n " + std::to_string(n) + " ratio range [" + std::to_string(ratio_range.k_min) +
                               ", " + std::to_string(ratio_range.k_max) + ")";
      expect_equal(got.ratio, want.ratio, what + " ratio");
      expect_equal(got.weight, want.weight, what + " weight");
      EXPECT_EQ(got.absorbed, want.absorbed) << what;
      EXPECT_EQ(got.ratio.total(), n);
      EXPECT_EQ(got.weight.total(), n);
    }
  }
}

TYPED_TEST(Absorption, RejectsBadArguments) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  const Kokkos::View<float*, Mem> a("a", 3), b("b", 4);
  EXPECT_THROW(pulse::absorption_stats(space, a, b), pulse::Error);
  EXPECT_THROW(pulse::absorption_stats(space, a, a, {2, 2}), pulse::Error);
  EXPECT_THROW(pulse::absorption_stats(space, a, a, {-16, 16}, {5, -5}), pulse::Error);
}

}  // namespace
