#include "train/sparsity_meter.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/host_copy.hpp"

namespace pulse {

SparsityMeter::SparsityMeter(const TensorTable& table, const std::vector<int>& ks)
    : ks_(ks),
      segments_(make_segments(table.offsets())),
      ring_(*std::max_element(ks.begin(), ks.end()), table.num_elements()) {}

void SparsityMeter::start(const Kokkos::View<const bf16_bits*>& weights) { ring_.push(DefaultExec(), weights); }

StepSparsity SparsityMeter::measure(const Kokkos::View<const bf16_bits*>& weights) {
  StepSparsity s;
  const DefaultExec space;
  const ChangeCounts counts = count_changed(space, segments_, ring_.snapshot(1), weights);
  s.changed = counts.total;
  s.per_tensor = counts.per_tensor;
  const std::vector<index_t> changed_k = ring_.count_changed_k(space, weights, ks_);
  const double n = double(ring_.num_elements());
  for (const index_t c : changed_k) s.kstep.push_back(c < 0 ? std::numeric_limits<double>::quiet_NaN() : 1.0 - c / n);
  ring_.push(space, weights);
  return s;
}

std::vector<std::vector<bf16_bits>> SparsityMeter::snapshots() const {
  std::vector<std::vector<bf16_bits>> out;
  for (int k = ring_.size(); k >= 1; --k) out.push_back(to_host(ring_.snapshot(k)));
  return out;
}

void SparsityMeter::restore(const std::vector<std::vector<bf16_bits>>& oldest_first) {
  ring_ = SnapshotRing<DefaultMem>(ring_.depth(), ring_.num_elements());
  for (const auto& snapshot : oldest_first) ring_.push(DefaultExec(), to_device(snapshot));
}

std::vector<double> gradient_sparsity(const Kokkos::View<const float*>& grads, const std::vector<float>& thresholds) {
  const std::vector<index_t> small = count_small(DefaultExec(), grads, thresholds);
  std::vector<double> out;
  for (const index_t c : small) out.push_back(grads.extent(0) ? double(c) / grads.extent(0) : 0.0);
  return out;
}

std::vector<double> adam_ratio_quantiles(const Kokkos::View<const float*>& m, const Kokkos::View<const float*>& v,
                                         double beta1, double beta2, double eps, std::int64_t step,
                                         const std::vector<double>& quantiles, index_t max_sample) {
  const index_t n = static_cast<index_t>(m.extent(0));
  if (n == 0) return std::vector<double>(quantiles.size(), std::numeric_limits<double>::quiet_NaN());
  const index_t stride = std::max<index_t>(1, n / max_sample);
  const index_t count = (n + stride - 1) / stride;
  const double c1 = 1.0 - std::pow(beta1, double(step)), c2 = 1.0 - std::pow(beta2, double(step));
  Kokkos::View<double*> sample("pulse::adam_ratio_sample", count);
  Kokkos::parallel_for(
      "pulse::adam_ratio", FlatPolicy<DefaultExec>(DefaultExec(), 0, count), KOKKOS_LAMBDA(const index_t j) {
        const index_t i = j * stride;
        const double m_hat = double(m(i)) / c1, v_hat = double(v(i)) / c2;
        sample(j) = (m_hat < 0 ? -m_hat : m_hat) / (::sqrt(v_hat) + eps);  // ::sqrt: host and device
      });
  std::vector<double> host = to_host(sample);
  std::vector<double> out;
  for (const double q : quantiles) {
    const std::size_t k = std::min<std::size_t>(host.size() - 1, std::size_t(q * (host.size() - 1) + 0.5));
    std::nth_element(host.begin(), host.begin() + k, host.end());
    out.push_back(host[k]);
  }
  return out;
}

}  // namespace pulse
