#pragma once
// The outer loop of DiLoCo and PULSELoCo: every H inner steps each trainer turns how far it
// moved into a pseudo-gradient, the trainers sum them (dense FP32 for DiLoCo; for PULSELoCo
// only entries that pass the BF16 gate, the rest kept as error feedback), and every trainer
// applies the same outer Nesterov SGD step to the FP32 global weights and restarts from them.
// Sums are taken in rank order, so all trainers hold bit-identical global weights, and with a
// gate that fires everywhere PULSELoCo computes exactly what DiLoCo does.
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>

#include "comm/communicator.hpp"
#include "kernels/types.hpp"
#include "loco/trainer_sync.hpp"

namespace pulse::loco {

struct OuterHyper {
  double lr = 0.7, momentum = 0.9;
  bool nesterov = true;
};

struct OuterStats {
  index_t fired = 0;   // entries this trainer sent (all of them for DiLoCo)
  double density = 0;  // fired / elements
  std::uint64_t bytes_sent = 0, bytes_received = 0;  // on Channel::pseudo_gradients, this step
  std::uint64_t payload_bytes = 0;                   // this trainer's coded payloads (PULSELoCo)
  double comm_seconds = 0, compute_seconds = 0;
  bool went_dense = false;
};

class OuterSync {
 public:
  // initial_theta must be the same on every trainer (checked). Collective over `trainers`.
  OuterSync(TrainerSync mode, const Communicator& trainers, Kokkos::View<const float*> initial_theta,
            const OuterHyper& hyper, SparseExchange exchange = SparseExchange::allgather,
            double dense_threshold = 0.25);

  // After H inner steps: exchange the pseudo-gradients, step theta_g, and set theta_local =
  // theta_g. Collective over the trainers.
  OuterStats outer_step(Kokkos::View<float*> theta_local);

  Kokkos::View<const float*> theta_global() const { return theta_global_; }
  Kokkos::View<float*> error_buffer() { return error_; }  // empty for DiLoCo
  Kokkos::View<float*> momentum_buffer() { return momentum_; }
  // Outer steps taken; PyTorch's first step sets the momentum to the gradient, so a checkpoint
  // restores this together with the buffers.
  std::int64_t outer_steps() const { return outer_steps_; }
  void set_outer_steps(std::int64_t steps);

  TrainerSync mode() const { return mode_; }
  index_t size() const { return static_cast<index_t>(theta_global_.extent(0)); }

 private:
  // Fills sum_host_ and returns this rank's coded payload bytes.
  std::uint64_t exchange_sparse(index_t fired, bool& went_dense);

  TrainerSync mode_;
  Communicator comm_;
  OuterHyper hyper_;
  SparseExchange exchange_;
  double dense_threshold_;
  std::int64_t outer_steps_ = 0;
  Kokkos::View<float*> theta_global_, momentum_, error_;
  Kokkos::View<float*> delta_, sum_;  // DiLoCo's pseudo-gradient; the summed pseudo-gradient
  Kokkos::View<index_t*> fired_indices_;
  Kokkos::View<float*> fired_values_;
  Kokkos::View<float*>::HostMirror delta_host_, sum_host_;
  Kokkos::View<index_t*>::HostMirror fired_indices_host_;
  Kokkos::View<float*>::HostMirror fired_values_host_;
};

}  // namespace pulse::loco
