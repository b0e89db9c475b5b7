// pulse-train's statistics (src/train/sparsity_meter): per-step and k-step sparsity of the BF16
// weights, the ring's checkpoint round trip, gradient sparsity and the Adam-ratio quantiles, each
// against a case small enough to count by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/host_copy.hpp"
#include "train/sparsity_meter.hpp"

using namespace pulse;

namespace {

// "big" spans three segments (2^15 elements each), so its count sums several team results.
TensorTable meter_table() {
  TensorTable t;
  t.add("a", {2, 3});
  t.add("empty", {0});
  t.add("big", {70000});
  t.add("c", {5});
  return t;
}

constexpr index_t a = 0, big = 6, c = 70006, n = 70011;

// v0 is all 1.0 except a signed zero and a NaN in c; each later version edits the one before.
std::vector<std::vector<bf16_bits>> meter_versions() {
  std::vector<bf16_bits> v(n, 0x3f80);
  v[c + 0] = 0x0000;  // +0
  v[c + 1] = 0x7fc1;  // a NaN that never changes: equal bits, no change
  std::vector<std::vector<bf16_bits>> versions{v};
  // v1: 8 changes (a: 2, big: 4 at segment edges, c: 2, one of them +0 -> -0)
  v[a + 0] = 0x3f81, v[a + 5] = 0xbf80;
  v[big + 0] = v[big + 32767] = v[big + 32768] = v[big + 69999] = 0x3f81;
  v[c + 0] = 0x8000, v[c + 4] = 0x4000;
  versions.push_back(v);
  // v2: a[0] back to v0's bits, c[2] changes: 2 changes from v1, 8 from v0
  v[a + 0] = 0x3f80, v[c + 2] = 0x3f00;
  versions.push_back(v);
  versions.push_back(v);  // v3 = v2
  versions.push_back(v);  // v4 = v3
  return versions;
}

double sparsity(index_t changed) { return 1.0 - double(changed) / double(n); }

void expect_step(const StepSparsity& got, index_t changed, const std::vector<index_t>& per_tensor,
                 const std::vector<double>& kstep, const char* what) {
  EXPECT_EQ(got.changed, changed) << what;
  EXPECT_EQ(got.per_tensor, per_tensor) << what;
  ASSERT_EQ(got.kstep.size(), kstep.size()) << what;
  for (std::size_t j = 0; j < kstep.size(); ++j) {
    if (std::isnan(kstep[j]))
      EXPECT_TRUE(std::isnan(got.kstep[j])) << what << ", k index " << j << ": " << got.kstep[j];
    else
      EXPECT_DOUBLE_EQ(got.kstep[j], kstep[j]) << what << ", k index " << j;
  }
}

}  // namespace

TEST(SparsityMeter, CountsPerStepPerTensorAndKSteps) {
  const TensorTable table = meter_table();
  ASSERT_EQ(table.num_elements(), n);
  const auto v = meter_versions();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  SparsityMeter meter(table, {1, 2, 4});
  meter.start(to_device(v[0]));
  expect_step(meter.measure(to_device(v[1])), 8, {2, 0, 4, 2}, {sparsity(8), nan, nan}, "v1");
  expect_step(meter.measure(to_device(v[2])), 2, {1, 0, 0, 1}, {sparsity(2), sparsity(8), nan}, "v2");
  expect_step(meter.measure(to_device(v[3])), 0, {0, 0, 0, 0}, {1.0, sparsity(2), nan}, "v3");
  // Four versions back from v4 is v0.
  expect_step(meter.measure(to_device(v[4])), 0, {0, 0, 0, 0}, {1.0, 1.0, sparsity(8)}, "v4");
}

TEST(SparsityMeter, SnapshotsRestoreTheRing) {
  const TensorTable table = meter_table();
  const auto v = meter_versions();
  SparsityMeter meter(table, {1, 2, 4});
  meter.start(to_device(v[0]));
  for (int t = 1; t <= 4; ++t) meter.measure(to_device(v[t]));
  // The ring is 4 deep (the largest k): v1..v4 remain, oldest first.
  const auto saved = meter.snapshots();
  ASSERT_EQ(saved.size(), 4u);
  for (int t = 0; t < 4; ++t) EXPECT_EQ(saved[t], v[t + 1]) << "snapshot " << t;

  SparsityMeter resumed(table, {1, 2, 4});
  resumed.restore(saved);
  EXPECT_EQ(resumed.snapshots(), saved);
  // v0 again: 8 changes against v4 (k = 1), v3 (k = 2) and v1 (k = 4), in both meters.
  const std::vector<double> all_eight = {sparsity(8), sparsity(8), sparsity(8)};
  expect_step(meter.measure(to_device(v[0])), 8, {1, 0, 4, 3}, all_eight, "continued");
  expect_step(resumed.measure(to_device(v[0])), 8, {1, 0, 4, 3}, all_eight, "resumed");
}

TEST(SparsityMeter, RestoringFewerVersionsThanKLeavesKUnknown) {
  const TensorTable table = meter_table();
  const auto v = meter_versions();
  SparsityMeter meter(table, {1, 4});
  meter.restore({v[0], v[1]});
  const StepSparsity s = meter.measure(to_device(v[2]));
  EXPECT_EQ(s.changed, 2);
  ASSERT_EQ(s.kstep.size(), 2u);
  EXPECT_DOUBLE_EQ(s.kstep[0], sparsity(2));
  EXPECT_TRUE(std::isnan(s.kstep[1]));
}

TEST(GradientSparsity, FractionAtOrBelowEachThreshold) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> g = {0.0f, -0.0f, 5e-11f, -5e-9f, 5e-7f, -1e-6f, 2e-6f,
                                std::numeric_limits<float>::quiet_NaN(), inf, -inf};
  // |g| <= 0: the two zeros; <= 1e-10: + 5e-11; <= 1e-8: + 5e-9; <= 1e-6: + 5e-7 and 1e-6
  // itself (the same float). NaN and the infinities never count.
  const auto fractions = gradient_sparsity(to_device(g), {0.0f, 1e-10f, 1e-8f, 1e-6f});
  ASSERT_EQ(fractions.size(), 4u);
  EXPECT_DOUBLE_EQ(fractions[0], 0.2);
  EXPECT_DOUBLE_EQ(fractions[1], 0.3);
  EXPECT_DOUBLE_EQ(fractions[2], 0.4);
  EXPECT_DOUBLE_EQ(fractions[3], 0.6);
  EXPECT_EQ(gradient_sparsity(to_device(std::vector<float>{}), {0.0f, 1.0f}), (std::vector<double>{0.0, 0.0}));
}

TEST(AdamRatioQuantiles, HandDerivedRatiosFromAStridedSample) {
  // step 1 with beta1 = 0.5, beta2 = 0.75: m_hat = m / 0.5, v_hat = v / 0.25 (exact in binary).
  // The even elements give m_hat = 1, -1, 6, 8 and v_hat = 1, 4, 4, 16: ratios 1, 0.5, 3, 2.
  // max_sample 4 of 8 elements takes every second one; the odd ones (ratio 2000) are skipped.
  const std::vector<float> m = {0.5f, 1000.0f, -0.5f, 1000.0f, 3.0f, 1000.0f, 4.0f, 1000.0f};
  const std::vector<float> v = {0.25f, 0.25f, 1.0f, 0.25f, 1.0f, 0.25f, 4.0f, 0.25f};
  const auto q = adam_ratio_quantiles(to_device(m), to_device(v), 0.5, 0.75, 0.0, 1, {0.0, 0.5, 1.0}, 4);
  // Sorted 0.5, 1, 2, 3; quantile q takes the element at round(q * 3).
  EXPECT_EQ(q, (std::vector<double>{0.5, 2.0, 3.0}));
  const auto all = adam_ratio_quantiles(to_device(m), to_device(v), 0.5, 0.75, 0.0, 1, {1.0}, 8);
  EXPECT_EQ(all, (std::vector<double>{2000.0}));
  const auto none = adam_ratio_quantiles(to_device(std::vector<float>{}), to_device(std::vector<float>{}), 0.9,
                                         0.999, 1e-8, 1, {0.5});
  ASSERT_EQ(none.size(), 1u);
  EXPECT_TRUE(std::isnan(none[0]));
}

namespace {

// The sample adam_ratio_quantiles draws, computed here on the host in the same double operations,
// and its order statistics by a full sort.
std::vector<double> sorted_reference_quantiles(const std::vector<float>& m, const std::vector<float>& v, double beta1,
                                               double beta2, double eps, std::int64_t step,
                                               const std::vector<double>& quantiles, index_t max_sample) {
  const index_t n = index_t(m.size());
  const index_t stride = std::max<index_t>(1, n / max_sample);
  const double c1 = 1.0 - std::pow(beta1, double(step)), c2 = 1.0 - std::pow(beta2, double(step));
  std::vector<double> sample;
  for (index_t i = 0; i < n; i += stride) {
    const double m_hat = double(m[i]) / c1, v_hat = double(v[i]) / c2;
    sample.push_back(std::fabs(m_hat) / (std::sqrt(v_hat) + eps));
  }
  std::sort(sample.begin(), sample.end());
  std::vector<double> out;
  for (const double q : quantiles) {
    const index_t k = std::min<index_t>(index_t(sample.size()) - 1, index_t(q * double(sample.size() - 1) + 0.5));
    out.push_back(sample[k]);
  }
  return out;
}

std::uint64_t bits_of(double x) {
  std::uint64_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

}  // namespace

// Random moments, with ties (repeated values), zeros, several quantiles in one bin of the radix
// selection, ratios spanning many binades and ratios within 1% of each other (one bin of the first
// pass, narrowed by the later ones): every quantile equals the sorted sample's, bit for bit.
TEST(AdamRatioQuantiles, MatchFullSortOnRandomMoments) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<double> log_scale(-12, 2);
  const std::vector<double> quantiles = {0.5, 0.9, 0.99, 0.999, 0.0, 1.0, 0.5, 0.501, 0.25};
  for (const index_t n : {index_t(1), index_t(2), index_t(1000), index_t(70001), index_t(204992)}) {
    for (const int kind : {0, 1, 2, 3}) {
      std::vector<float> m(n), v(n);
      for (index_t i = 0; i < n; ++i) {
        // kind 0: one scale; 1: ratios over 14 decades; 2: a few distinct values, many zeros;
        // 3: clustered, |m| within 1% of 1e-5 and one v
        const double scale = kind == 1 ? std::pow(10.0, log_scale(rng)) : 1e-5;
        m[i] = kind == 2 ? float(1e-5 * double(rng() % 4))
               : kind == 3 ? float(1e-5 * (1.0 + 0.01 * std::fabs(normal(rng))))
                           : float(scale * normal(rng));
        v[i] = kind >= 2 ? 1e-10f : float(scale * scale * (std::fabs(normal(rng)) + 0.01f));
      }
      for (const std::int64_t step : {std::int64_t(1), std::int64_t(37)}) {
        if (kind == 1 && step == 37) {  // 401 quantiles: more than the 255 bins the selection copies out
          std::vector<double> many;
          for (int j = 0; j <= 400; ++j) many.push_back(j / 400.0);
          EXPECT_EQ(adam_ratio_quantiles(to_device(m), to_device(v), 0.9, 0.999, 1e-8, step, many, 1 << 16),
                    sorted_reference_quantiles(m, v, 0.9, 0.999, 1e-8, step, many, 1 << 16))
              << "n " << n;
        }
        const auto got = adam_ratio_quantiles(to_device(m), to_device(v), 0.9, 0.999, 1e-8, step, quantiles, 1 << 16);
        const auto want = sorted_reference_quantiles(m, v, 0.9, 0.999, 1e-8, step, quantiles, 1 << 16);
        ASSERT_EQ(got.size(), want.size());
        for (std::size_t j = 0; j < want.size(); ++j)
          EXPECT_EQ(bits_of(got[j]), bits_of(want[j]))
              << "n " << n << " kind " << kind << " step " << step << " q " << quantiles[j] << ": " << got[j]
              << " vs " << want[j];
      }
    }
  }
}

// Every ratio the same (all 0, as while the gradients are 0; or one positive value): each
// quantile is that value, as a sort gives it.
TEST(AdamRatioQuantiles, OneValueEverywhereIsEveryQuantile) {
  const std::vector<double> quantiles = {0.0, 0.5, 0.9, 0.999, 1.0};
  for (const float moment : {0.0f, 1e-5f})
    for (const index_t n : {index_t(1), index_t(204992)}) {
      const std::vector<float> m(n, moment), v(n, moment * moment);
      const auto got = adam_ratio_quantiles(to_device(m), to_device(v), 0.9, 0.999, 1e-8, 3, quantiles);
      const auto want = sorted_reference_quantiles(m, v, 0.9, 0.999, 1e-8, 3, quantiles, 1 << 16);
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t j = 0; j < want.size(); ++j) EXPECT_EQ(bits_of(got[j]), bits_of(want[j])) << "n " << n;
      EXPECT_EQ(got[0], moment == 0 ? 0.0 : want[4]);
    }
  // One value but the last sampled one: the full selection, as a sort.
  std::vector<float> m(204992, 1e-5f), v(204992, 1e-10f);
  m[204990] = 2e-5f;  // sampled: the stride is 3
  EXPECT_EQ(adam_ratio_quantiles(to_device(m), to_device(v), 0.9, 0.999, 1e-8, 3, quantiles),
            sorted_reference_quantiles(m, v, 0.9, 0.999, 1e-8, 3, quantiles, 1 << 16));
}

// A NaN, an infinity or a -0 ratio in the sample: the same order statistics as a sort (by value:
// which of +0 and -0 comes out is the selection's choice).
TEST(AdamRatioQuantiles, MatchFullSortWithNegativeZeroAndInfinity) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> m = {-0.0f, 0.0f, 1.0f, 2.0f, -3.0f, 0.0f, inf, 4.0f, -0.0f};
  std::vector<float> v(m.size(), 0.5f);  // v_hat = 1 at step 1 with beta2 = 0.5: the ratio is 2 |m|
  const std::vector<double> quantiles = {0.0, 0.25, 0.5, 0.75, 1.0};
  const auto got = adam_ratio_quantiles(to_device(m), to_device(v), 0.5, 0.5, 0.0, 1, quantiles);
  const auto want = sorted_reference_quantiles(m, v, 0.5, 0.5, 0.0, 1, quantiles, 1 << 16);
  EXPECT_EQ(got, want);
  // The same without the -0: all bits decided by value.
  m[0] = m[8] = 0.0f;
  const auto got_positive = adam_ratio_quantiles(to_device(m), to_device(v), 0.5, 0.5, 0.0, 1, quantiles);
  const auto want_positive = sorted_reference_quantiles(m, v, 0.5, 0.5, 0.0, 1, quantiles, 1 << 16);
  for (std::size_t j = 0; j < quantiles.size(); ++j) EXPECT_EQ(bits_of(got_positive[j]), bits_of(want_positive[j]));
  EXPECT_EQ(got_positive, (std::vector<double>{0.0, 0.0, 2.0, 6.0, inf}));  // of 0 0 0 0 2 4 6 8 inf
}
