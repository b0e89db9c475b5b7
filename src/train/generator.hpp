#pragma once
// The generator role of pulse-train: the rollouts of a step. The generating ranks (the inference
// ranks, or the trainers when there are none) split the step's prompts evenly and sample their
// share from BF16 weights of version t-1-async_lag; each inference rank sends its share to the
// trainers over its own route, and each trainer takes its rows of the concatenation.
// The inference ranks sample ahead, as soon as the next batch's version is theirs: with an async
// lag while the trainers train on this batch, so sampling and training overlap, one on each core;
// without one once this step's patch is in, while trainer 0 evaluates. The batch is the
// one sampled later would be (its draws depend on the generation and the version only);
// PULSE_GENERATE_AHEAD=0 in an inference rank's environment turns this off.
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.hpp"
#include "model/gpt.hpp"
#include "model/gpt_decoder.hpp"
#include "rl/rollout.hpp"
#include "rl/tokenizer.hpp"
#include "train/publisher.hpp"
#include "train/train_config.hpp"
#include "train/transfer_counter.hpp"

namespace pulse {

class Generator {
 public:
  // Ranks 0..num_trainers-1 train, the others are inference ranks. routes: one per inference
  // rank, the trainers and that inference rank (last); a rank outside one holds an unused
  // communicator there.
  Generator(const TrainConfig& c, const GPTConfig& config, int seq_len, int rank, int num_trainers,
            std::vector<Communicator> routes);

  // New rollouts every num_iterations steps, reused (with importance ratios) in between.
  bool new_rollouts_due(std::int64_t t) const { return (t - 1) % c_.num_iterations == 0; }

  // Collective over the routes: the batch this rank trains on at step t (empty on inference
  // ranks). versions: the BF16 versions this rank keeps; trainer_weights: a trainer's weights of
  // the newest version on the device, which it samples from without a copy.
  RolloutBatch rollouts_for_step(std::int64_t t, const Publisher& versions,
                                 const Kokkos::View<const bf16_bits*>& trainer_weights, TransferCounter& copies,
                                 double& comm_seconds);

  // Inference ranks, after the rollouts of step t are sent and again after its version is
  // published: samples the share of the next step that takes new rollouts (up to the last step)
  // when the version it needs is here already, for rollouts_for_step to send then. A no-op
  // elsewhere, when that share is sampled already, or turned off.
  void sample_ahead(std::int64_t t, std::int64_t last_step, const Publisher& versions, TransferCounter& copies);

  // The rollouts of `generation` for prompts [first_prompt, first_prompt + num_prompts) of its
  // problem set, sampled from `weights`: the same rows however the prompts are split.
  RolloutBatch generate(std::uint64_t generation, int first_prompt, int num_prompts,
                        const Kokkos::View<const bf16_bits*>& weights);

 private:
  // Weights version the rollouts of step t come from.
  std::uint64_t rollout_version(std::int64_t t) const;
  // Share `part` of `parts` of step t's rollouts, sampled from the version it needs: a trainer's
  // own weights when it holds that version, else a kept version uploaded.
  RolloutBatch sample_share(std::int64_t t, int part, int parts, const Publisher& versions,
                            const Kokkos::View<const bf16_bits*>& trainer_weights, TransferCounter& copies);
  // This trainer's rows of the inference ranks' shares, in order.
  RolloutBatch trainer_rows(const std::vector<RolloutBatch>& parts) const;

  TrainConfig c_;
  int seq_len_, rank_, num_trainers_, rows_per_trainer_;
  bool trainer_, samples_;
  std::vector<Communicator> routes_;
  CharTokenizer tok_ = arithmetic_tokenizer();
  std::unique_ptr<GPTDecoder> decoder_;  // sampling ranks
  bool ahead_enabled_;                   // PULSE_GENERATE_AHEAD is not 0
  std::int64_t ahead_step_ = 0;          // the step whose share ahead_ holds (0: none)
  RolloutBatch ahead_;
};

}  // namespace pulse
