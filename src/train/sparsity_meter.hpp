#pragma once
// Per-step sparsity of the BF16 weights: elements (total and per tensor) whose bits changed since
// the previous version, and k-step sparsity against the versions k steps back, kept in a ring of
// BF16 snapshots on the device. Also the gradient and Adam-ratio statistics of a step.
#include <cstdint>
#include <vector>

#include "core/tensor_table.hpp"
#include "kernels/segments.hpp"
#include "kernels/sparsity.hpp"
#include "kernels/types.hpp"
#include "sync/change_set.hpp"
#include "train/changed_list.hpp"
#include "train/transfer_counter.hpp"

namespace pulse {

struct StepSparsity {
  index_t changed = 0;                // vs the previous version
  std::vector<index_t> per_tensor;    // in table order
  std::vector<double> kstep;          // sparsity for each k of kstep_values, NaN while fewer than k versions exist
};

class SparsityMeter {
 public:
  SparsityMeter(const TensorTable& table, const std::vector<int>& ks);

  // Records the starting version (no statistics).
  void start(const Kokkos::View<const bf16_bits*>& weights);
  // Compares weights with the versions before it, then remembers it.
  StepSparsity measure(const Kokkos::View<const bf16_bits*>& weights);
  // The elements of weights that differ from the last version remembered, as a change set
  // (compacted once on the device), which is all that crosses to the host. Remembers nothing:
  // measure(weights, changes) follows, once the set has been used.
  void compact(const Kokkos::View<const bf16_bits*>& weights, sync::ChangeSet& changes, TransferCounter& copies);
  // The same as measure(weights) from a change set (compact's, or AdamW's own listing,
  // kernels/adamw.hpp): changes must be what changed between the last version remembered and
  // weights; per-tensor counts and the k = 1 sparsity come from it.
  StepSparsity measure(const Kokkos::View<const bf16_bits*>& weights, const sync::ChangeSet& changes);

  // The ring for a checkpoint, oldest first, and its restoration.
  std::vector<std::vector<bf16_bits>> snapshots() const;
  void restore(const std::vector<std::vector<bf16_bits>>& oldest_first);

 private:
  // sparsity for each k of ks_ given the count for k = 1, then remembers weights
  std::vector<double> kstep_and_push(const Kokkos::View<const bf16_bits*>& weights, index_t changed);

  std::vector<int> ks_;
  std::vector<index_t> offsets_;
  TensorSegments<DefaultMem> segments_;
  SnapshotRing<DefaultMem> ring_;
  ChangeCompactor compactor_;
};

// Fraction of |g| <= tau for each threshold.
std::vector<double> gradient_sparsity(const Kokkos::View<const float*>& grads, const std::vector<float>& thresholds);

// Quantiles of the Adam ratio |m_hat| / (sqrt(v_hat) + eps) after a step (m, v in FP32; bias
// corrections 1 - beta^step), from an evenly strided sample of at most max_sample elements.
std::vector<double> adam_ratio_quantiles(const Kokkos::View<const float*>& m, const Kokkos::View<const float*>& v,
                                         double beta1, double beta2, double eps, std::int64_t step,
                                         const std::vector<double>& quantiles, index_t max_sample = 1 << 16);

}  // namespace pulse
