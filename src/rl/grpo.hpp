#pragma once
// The GRPO objective in the paper's setup: group-normalised advantages, the token-level DAPO
// loss (every completion token of the batch weighs the same), asymmetric clipping
// ("clip-higher", 0.2 / 0.28), no KL penalty.
#include <cstdint>
#include <vector>

#include "model/gpt.hpp"
#include "rl/rollout.hpp"

namespace pulse {

struct GrpoHyper {
  double clip_low = 0.2, clip_high = 0.28, advantage_eps = 1e-6;
};

// (r - mean_group) / (std_group + eps) per row, population std over each group of group_size
// consecutive rows; a group whose rewards are all equal gets advantage 0.
std::vector<float> group_advantages(const std::vector<float>& rewards, int group_size, double eps);

struct GrpoLossStats {
  double loss = 0;
  double clip_fraction = 0;  // of the masked tokens, those whose gradient the clip removes
  double mean_ratio = 0;     // mean of exp(logp - old_logp) over the masked tokens
  std::int64_t tokens = 0;   // masked tokens in this batch
};

// loss = -(1/N) sum_{mask} min(ratio*A, clip(ratio, 1-clip_low, 1+clip_high)*A),
// ratio = exp(logp - old_logp), A the row's advantage, N = token_normaliser > 0 ? token_normaliser
// : this batch's masked tokens (pass the global count when ranks split a batch).
// Writes position_weights[i] = dloss/dCE_i (CE_i = -logp_i): ratio*A/N where the unclipped term
// is the minimum, 0 where the clip is active or outside the mask; ready for GPT::backward(weights).
GrpoLossStats grpo_loss(const std::vector<float>& logprobs, const RolloutBatch& batch,
                        const std::vector<float>& advantages, const GrpoHyper& hyper, double token_normaliser,
                        std::vector<float>& position_weights);

// Forward of the batch on model (constructed with batch.rows x batch.seq_len), grpo_loss,
// backward: accumulates into model.grads() (the caller zeroes them).
GrpoLossStats grpo_backward(GPT& model, const RolloutBatch& batch, const std::vector<float>& advantages,
                            const GrpoHyper& hyper, double token_normaliser = 0);

}  // namespace pulse
