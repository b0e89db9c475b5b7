// pulse-train's statistics (src/train/sparsity_meter): per-step and k-step sparsity of the BF16
// weights, the ring's checkpoint round trip, gradient sparsity and the Adam-ratio quantiles, each
// against a case small enough to count by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
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
