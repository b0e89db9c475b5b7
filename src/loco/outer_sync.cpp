#include "loco/outer_sync.hpp"

#include <algorithm>
#include <vector>

#include "comm/collectives.hpp"
#include "core/error.hpp"
#include "kernels/bf16.hpp"
#include "kernels/gate.hpp"
#include "kernels/outer_sgd.hpp"
#include "kernels/pseudo_gradient.hpp"
#include "loco/exchange.hpp"

namespace pulse::loco {

namespace {

constexpr Channel kChannel = Channel::pseudo_gradients;

// FNV-1a over the FP32 bit patterns: trainers that start from different weights would never
// agree again, so the constructor refuses them.
std::uint64_t fingerprint(Kokkos::View<const float*> theta) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), theta);
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < host.extent(0); ++i) {
    h ^= float_to_bits(host(i));
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

OuterSync::OuterSync(TrainerSync mode, const Communicator& trainers, Kokkos::View<const float*> initial_theta,
                     const OuterHyper& hyper, SparseExchange exchange, double dense_threshold)
    : mode_(mode), comm_(trainers), hyper_(hyper), exchange_(exchange), dense_threshold_(dense_threshold) {
  PULSE_CHECK(mode != TrainerSync::ddp, "OuterSync: ddp has no outer step (it allreduces gradients every step)");
  PULSE_CHECK(hyper.lr > 0 && hyper.momentum >= 0 && hyper.momentum < 1,
              "OuterSync: outer lr " + std::to_string(hyper.lr) + " and momentum " + std::to_string(hyper.momentum) +
                  " must satisfy lr > 0 and 0 <= momentum < 1");
  PULSE_CHECK(dense_threshold >= 0 && dense_threshold <= 1,
              "OuterSync: dense threshold " + std::to_string(dense_threshold) + " is not a density in [0, 1]");
  const index_t n = static_cast<index_t>(initial_theta.extent(0));
  const std::uint64_t print = fingerprint(initial_theta);
  const bool same_size = allreduce_value(comm_, n, ReduceOp::min) == allreduce_value(comm_, n, ReduceOp::max);
  const bool same_bits =
      allreduce_value(comm_, print, ReduceOp::min) == allreduce_value(comm_, print, ReduceOp::max);
  PULSE_CHECK(same_size && same_bits, "OuterSync: the trainers start from different weights (" +
                                          std::string(same_size ? "same size, different bits" : "different sizes") +
                                          ")");

  theta_global_ = Kokkos::View<float*>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "pulse::loco::theta_global"), n);
  Kokkos::deep_copy(theta_global_, initial_theta);
  momentum_ = Kokkos::View<float*>("pulse::loco::momentum", n);
  sum_ = Kokkos::View<float*>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "pulse::loco::sum"), n);
  sum_host_ = Kokkos::create_mirror_view(sum_);
  if (mode == TrainerSync::pulseloco) {
    error_ = Kokkos::View<float*>("pulse::loco::error", n);
    // Grown on demand: at the densities PULSELoCo expects a small buffer suffices.
    const index_t capacity = std::max<index_t>(1024, n / 16);
    fired_indices_ = Kokkos::View<index_t*>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "pulse::loco::fired_indices"), capacity);
    fired_values_ = Kokkos::View<float*>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "pulse::loco::fired_values"), capacity);
  } else {
    delta_ = Kokkos::View<float*>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "pulse::loco::delta"), n);
    delta_host_ = Kokkos::create_mirror_view(delta_);
  }
}

void OuterSync::set_outer_steps(std::int64_t steps) {
  PULSE_CHECK(steps >= 0, "OuterSync: negative outer step count " + std::to_string(steps));
  outer_steps_ = steps;
}

std::uint64_t OuterSync::exchange_sparse(index_t fired, bool& went_dense) {
  const index_t n = size();
  fired_indices_host_ = Kokkos::create_mirror_view(fired_indices_);
  fired_values_host_ = Kokkos::create_mirror_view(fired_values_);
  const auto first = std::make_pair(index_t(0), fired);
  Kokkos::deep_copy(Kokkos::subview(fired_indices_host_, first), Kokkos::subview(fired_indices_, first));
  Kokkos::deep_copy(Kokkos::subview(fired_values_host_, first), Kokkos::subview(fired_values_, first));
  const index_t* indices = fired_indices_host_.data();
  const float* values = fired_values_host_.data();

  if (exchange_ == SparseExchange::allgather)
    return sparse_allgather_sum(comm_, indices, values, fired, n, sum_host_.data(), kChannel);

  const index_t total = allreduce_value(comm_, fired, ReduceOp::sum, kChannel);
  const double mean_density = n == 0 ? 0.0 : double(total) / (double(n) * comm_.size());
  went_dense = mean_density > dense_threshold_;
  if (!went_dense)
    return sparse_reduce_scatter_sum(comm_, indices, values, fired, n, sum_host_.data(), kChannel);
  std::vector<float> dense(static_cast<std::size_t>(n), 0.0f);
  for (index_t k = 0; k < fired; ++k) dense[indices[k]] = values[k];
  dense_sum(comm_, dense.data(), n, sum_host_.data(), kChannel);
  return 0;
}

OuterStats OuterSync::outer_step(Kokkos::View<float*> theta_local) {
  const index_t n = size();
  PULSE_CHECK(static_cast<index_t>(theta_local.extent(0)) == n,
              "outer step: local weights have " + std::to_string(theta_local.extent(0)) + " elements, global " +
                  std::to_string(n));
  const DefaultExec space;
  OuterStats stats;
  const std::uint64_t sent_before = comm_.bytes_sent(kChannel), received_before = comm_.bytes_received(kChannel);
  Kokkos::Timer timer;

  // 1. The pseudo-gradient (and for PULSELoCo the gate and error feedback).
  if (mode_ == TrainerSync::pulseloco) {
    add_pseudo_gradient(space, theta_global_, theta_local, error_);
    stats.fired = compact_fired(space, theta_global_, error_, fired_indices_, fired_values_);
    if (stats.fired > static_cast<index_t>(fired_indices_.extent(0))) {
      Kokkos::realloc(fired_indices_, static_cast<std::size_t>(stats.fired));
      Kokkos::realloc(fired_values_, static_cast<std::size_t>(stats.fired));
      compact_fired(space, theta_global_, error_, fired_indices_, fired_values_);
    }
    clear_sent(space, fired_indices_, stats.fired, error_);
  } else {
    pseudo_gradient(space, theta_global_, theta_local, delta_);
    Kokkos::deep_copy(delta_host_, delta_);
    stats.fired = n;
  }
  space.fence();
  stats.compute_seconds += timer.seconds();

  // 2. The exchange: every trainer ends with the same rank-order sum.
  timer.reset();
  if (mode_ == TrainerSync::pulseloco) {
    stats.payload_bytes = exchange_sparse(stats.fired, stats.went_dense);
  } else {
    dense_sum(comm_, delta_host_.data(), n, sum_host_.data(), kChannel);
    stats.went_dense = true;
  }
  stats.comm_seconds = timer.seconds();

  // 3. The outer step, then restart the trainer from the new global weights.
  timer.reset();
  Kokkos::deep_copy(sum_, sum_host_);
  const OuterSgdScalars scalars{static_cast<float>(hyper_.lr), static_cast<float>(hyper_.momentum),
                                static_cast<float>(comm_.size()), hyper_.nesterov, outer_steps_ == 0};
  outer_sgd(space, scalars, theta_global_, momentum_, sum_);
  Kokkos::deep_copy(space, theta_local, theta_global_);
  space.fence();
  stats.compute_seconds += timer.seconds();
  ++outer_steps_;

  stats.density = n == 0 ? 0.0 : double(stats.fired) / double(n);
  stats.bytes_sent = comm_.bytes_sent(kChannel) - sent_before;
  stats.bytes_received = comm_.bytes_received(kChannel) - received_before;
  return stats;
}

}  // namespace pulse::loco
