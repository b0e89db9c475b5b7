#pragma once
// The trainer role of pulse-train: the GPT model, the weights and optimizer state (a
// ParameterStore), the outer loop of DiLoCo/PULSELoCo and the rollout batch. One step is GRPO
// gradients on bf16(theta), their allreduce (DDP), gradient clipping and AdamW, and on outer
// steps the outer update. Collective over the trainers' communicator.
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.hpp"
#include "core/tensor_table.hpp"
#include "loco/outer_sync.hpp"
#include "model/gpt.hpp"
#include "rl/grpo.hpp"
#include "rl/rollout.hpp"
#include "train/parameter_store.hpp"
#include "train/rank_checkpoint.hpp"
#include "train/train_config.hpp"
#include "train/transfer_counter.hpp"

namespace pulse {

// What a trainer's step produced (trainer 0's values go into the statistics row).
struct TrainStepResult {
  double lr = 0, loss = 0, reward = 0;
  std::int64_t tokens = 0;
  GrpoLossStats grpo{};
  float grad_norm = 0;
  bool listed = false;                // AdamW staged the changed list (trainer 0, no outer step after it)
  bool outer_step = false;            // DiLoCo/PULSELoCo: the trainers agreed on new global weights
  loco::OuterStats outer{};           // of that outer step
  Kokkos::View<float*> master_before; // the master weights before the step, when asked for
  double comm_s = 0;
};

class Trainer {
 public:
  // trainers: the trainer ranks; trainer 0 has AdamW list what it changed. Starts from `initial`
  // (FP32, table order), or from `resumed`, this rank's checkpoint.
  Trainer(const TrainConfig& c, const Communicator& trainers, const GPTConfig& config, const TensorTable& table,
          int rows, int seq_len, const std::vector<float>& initial, const RankCheckpoint* resumed);

  // The batch the next steps train on (a new one every num_iterations steps).
  void set_batch(RolloutBatch batch) { batch_ = std::move(batch); }
  const RolloutBatch& batch() const { return batch_; }

  // Optimizer step t (1-based). keep_master_before: return the master weights before it.
  TrainStepResult step(std::int64_t t, bool keep_master_before, TransferCounter& copies);

  const ParameterStore& params() const { return *params_; }
  ParameterStore& params() { return *params_; }
  Kokkos::View<const bf16_bits*> weights() const { return params_->weights(); }
  // The last step's gradient, summed over the trainers and unclipped (AdamW clips by a factor):
  // kept until the next step, so trainer 0 can measure it after the step's patch is out.
  Kokkos::View<const float*> grads() const { return model_->grads(); }

  // Adds every checkpointed buffer (the store's, the outer loop's, the batch) to state.
  void save(RankCheckpoint& state);

 private:
  // Every device buffer of the checkpointed state, in checkpoint order: visit(name, view) with an
  // FP32 or BF16 view, const where loading restores it otherwise (the outer global weights, which
  // the OuterSync constructor takes). One list for save and load.
  template <class Visit>
  void for_each_state_buffer(const Visit& visit) {
    params_->for_each_state_buffer(visit);
    if (!outer_) return;
    visit("outer.theta_global", outer_->theta_global());
    visit("outer.momentum", outer_->momentum_buffer());
    if (outer_->error_buffer().extent(0)) visit("outer.error", outer_->error_buffer());
  }
  void load(const RankCheckpoint& state);

  TrainConfig c_;
  Communicator trainers_;
  int rows_;  // rollout rows of this trainer's batch
  std::unique_ptr<GPT> model_;
  std::unique_ptr<ParameterStore> params_;  // weights and optimizer state
  std::unique_ptr<loco::OuterSync> outer_;  // diloco, pulseloco
  RolloutBatch batch_;                      // reused for num_iterations steps
};

}  // namespace pulse
