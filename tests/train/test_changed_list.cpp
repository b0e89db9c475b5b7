// The change set that leaves the device once per step (src/train/changed_list): the meter's
// set-based measurement against its full-scan measurement and against naive host loops, over
// several steps (k-step included), with the compaction buffers growing; the set gathered from
// AdamW's staging, split by tensor from its per-segment counts; the bytes they count; Adam-ratio
// quantiles against a full host sort.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/tensor_table.hpp"
#include "kernels/host_copy.hpp"
#include "train/changed_list.hpp"
#include "train/parameter_store.hpp"
#include "train/sparsity_meter.hpp"

using namespace pulse;

namespace {

TensorTable table_of(const std::vector<index_t>& sizes) {
  TensorTable table;
  for (std::size_t t = 0; t < sizes.size(); ++t) table.add("t" + std::to_string(t), {sizes[t]});
  return table;
}

}  // namespace

TEST(ChangedList, MeterFromListEqualsFullScanAndHostLoops) {
  // an empty tensor, one longer than a segment (2^15), odd sizes
  const TensorTable table = table_of({5, 0, 40000, 1, 333});
  const index_t n = table.num_elements();
  const std::vector<int> ks = {1, 2, 4};
  SparsityMeter by_list(table, ks), by_scan(table, ks);
  std::mt19937_64 rng(7);
  std::vector<bf16_bits> weights(n);
  for (auto& w : weights) w = bf16_bits(rng());
  std::vector<std::vector<bf16_bits>> versions = {weights};
  by_list.start(to_device(weights));
  by_scan.start(to_device(weights));
  // change fractions: none, sparse, then dense (the buffers must grow past their first size)
  for (const double fraction : {0.0, 0.001, 0.01, 0.5, 0.02, 1.0}) {
    std::vector<bf16_bits> before = weights;
    std::bernoulli_distribution flip(fraction);
    for (auto& w : weights)
      if (flip(rng)) w = bf16_bits(w ^ (1u + (rng() & 0x7FFF)));  // always differs
    versions.push_back(weights);
    const auto device = to_device(weights);
    sync::ChangeSet list;
    TransferCounter copies;
    by_list.compact(device, list, copies);
    const StepSparsity a = by_list.measure(device, list);
    const StepSparsity b = by_scan.measure(device);
    // naive host reference
    std::vector<index_t> indices, per_tensor(table.size(), 0);
    const auto offsets = table.offsets();
    for (index_t i = 0; i < n; ++i)
      if (before[i] != weights[i]) {
        indices.push_back(i);
        per_tensor[std::upper_bound(offsets.begin(), offsets.end(), i) - offsets.begin() - 1]++;
      }
    EXPECT_EQ(list.indices, indices) << fraction;
    ASSERT_EQ(list.new_bits.size(), indices.size());
    for (std::size_t j = 0; j < indices.size(); ++j) EXPECT_EQ(list.new_bits[j], weights[indices[j]]);
    ASSERT_EQ(list.num_tensors(), table.size());
    for (std::size_t t = 0; t < table.size(); ++t) EXPECT_EQ(list.count(t), per_tensor[t]) << "tensor " << t;
    EXPECT_EQ(a.changed, index_t(indices.size()));
    EXPECT_EQ(a.per_tensor, per_tensor);
    EXPECT_EQ(a.per_tensor, b.per_tensor);
    EXPECT_EQ(a.changed, b.changed);
    ASSERT_EQ(a.kstep.size(), b.kstep.size());
    for (std::size_t k = 0; k < ks.size(); ++k) {
      const std::size_t steps = versions.size() - 1;
      if (std::size_t(ks[k]) > steps) {
        EXPECT_TRUE(std::isnan(a.kstep[k]) && std::isnan(b.kstep[k]));
        continue;
      }
      const auto& back = versions[versions.size() - 1 - ks[k]];
      index_t changed = 0;
      for (index_t i = 0; i < n; ++i) changed += back[i] != weights[i];
      EXPECT_EQ(a.kstep[k], 1.0 - changed / double(n)) << "k " << ks[k];
      EXPECT_EQ(a.kstep[k], b.kstep[k]);
    }
    // 32-bit indices and 16-bit values are all that crossed; nothing went up
    EXPECT_EQ(copies.d2h_bytes, indices.size() * 6);
    EXPECT_EQ(copies.h2d_bytes, 0u);
    // the host copy of the previous version becomes the new one, and back
    const std::vector<bf16_bits> previous = before;
    sync::apply_change_set(list, before.data(), before.size());
    EXPECT_EQ(before, weights);
    sync::revert_change_set(list, before.data(), before.size());
    EXPECT_EQ(before, previous);
  }
}

// AdamW stages its changes per segment; the parameter store gathers them into a change set whose
// tensor begins come from where each tensor's first segment starts: empty tensors (first, inner
// and last) begin where the next one does, a tensor longer than a segment counts all of its
// segments. Only the set and one begin per tensor cross to the host.
TEST(ChangedList, GatheredSetIsSplitByTensorFromTheStaging) {
  const TensorTable table = table_of({0, 5, 0, 70000, 1, 333, 0});
  const index_t n = table.num_elements();
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal;
  std::vector<float> initial(n);
  for (auto& x : initial) x = 0.02f * normal(rng);
  ParameterStore store(table, Precision::mixed, initial, true);
  AdamWHyper hyper;
  hyper.lr = 1e-3;
  for (int t = 1; t <= 3; ++t) {
    const std::vector<bf16_bits> before = to_host(store.weights());
    std::vector<float> grad(n);
    for (index_t i = 0; i < n; ++i) grad[i] = i % (t + 2) == 0 ? 0.0f : 0.01f * normal(rng);
    store.step(t, to_device(grad), hyper, 0.0, true);
    TransferCounter copies;
    const sync::ChangeSet& set = store.gather_changes(copies);
    const std::vector<bf16_bits> after = to_host(store.weights());
    std::vector<index_t> indices;
    std::vector<index_t> begins{0};
    const auto offsets = table.offsets();
    for (std::size_t k = 0; k < table.size(); ++k) {
      for (index_t i = offsets[k]; i < offsets[k + 1]; ++i)
        if (before[i] != after[i]) indices.push_back(i);
      begins.push_back(index_t(indices.size()));
    }
    ASSERT_GT(indices.size(), 1000u) << "the step should change many weights";
    EXPECT_EQ(set.indices, indices) << "step " << t;
    EXPECT_EQ(set.tensor_begin, begins) << "step " << t;
    ASSERT_EQ(set.new_bits.size(), indices.size());
    for (std::size_t j = 0; j < indices.size(); ++j) EXPECT_EQ(set.new_bits[j], after[indices[j]]);
    EXPECT_TRUE(set.old_bits.empty());
    EXPECT_NO_THROW(sync::check_change_set(set, offsets));
    EXPECT_EQ(copies.d2h_bytes, indices.size() * 6 + table.size() * sizeof(index_t));
    EXPECT_EQ(copies.h2d_bytes, 0u);
  }
}

TEST(ChangedList, AdamQuantilesEqualAFullHostSort) {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal;
  for (const index_t n : {index_t(1), index_t(1000), index_t(200003)}) {
    std::vector<float> m(n), v(n);
    for (index_t i = 0; i < n; ++i) m[i] = 1e-3f * normal(rng), v[i] = 1e-6f * std::fabs(normal(rng));
    for (const std::vector<double>& qs : {std::vector<double>{0.0, 0.5, 0.9, 0.99, 0.999, 1.0},
                                          std::vector<double>{0.9, 0.5, 1.0, 0.0, 0.99}}) {
      const int step = 5;
      const index_t max_sample = 1 << 16;
      const auto got = adam_ratio_quantiles(to_device(m), to_device(v), 0.9, 0.999, 1e-8, step, qs, max_sample);
      // reference: the same strided sample, fully sorted on the host
      const index_t stride = std::max<index_t>(1, n / max_sample);
      const double c1 = 1.0 - std::pow(0.9, step), c2 = 1.0 - std::pow(0.999, step);
      std::vector<double> sample;
      for (index_t i = 0; i < n; i += stride)
        sample.push_back(std::fabs(double(m[i]) / c1) / (std::sqrt(double(v[i]) / c2) + 1e-8));
      std::sort(sample.begin(), sample.end());
      ASSERT_EQ(got.size(), qs.size());
      for (std::size_t j = 0; j < qs.size(); ++j) {
        const std::size_t k = std::min(sample.size() - 1, std::size_t(qs[j] * double(sample.size() - 1) + 0.5));
        EXPECT_EQ(got[j], sample[k]) << "n " << n << " q " << qs[j];
      }
    }
  }
}
