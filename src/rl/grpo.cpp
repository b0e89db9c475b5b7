#include "rl/grpo.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.hpp"
#include "kernels/host_copy.hpp"

namespace pulse {

std::vector<float> group_advantages(const std::vector<float>& rewards, int group_size, double eps) {
  PULSE_CHECK(group_size > 0 && rewards.size() % group_size == 0,
              "grpo: " + std::to_string(rewards.size()) + " rewards do not split into groups of " +
                  std::to_string(group_size));
  PULSE_CHECK(eps >= 0, "grpo: advantage_eps must be >= 0");
  std::vector<float> adv(rewards.size());
  for (std::size_t g = 0; g < rewards.size(); g += group_size) {
    double mean = 0, var = 0;
    for (int i = 0; i < group_size; ++i) mean += rewards[g + i];
    mean /= group_size;
    bool all_equal = true;
    for (int i = 0; i < group_size; ++i) {
      var += (rewards[g + i] - mean) * (rewards[g + i] - mean);
      all_equal &= rewards[g + i] == rewards[g];
    }
    // Exactly 0 for equal rewards even with eps = 0 (0/0 otherwise): such groups carry no signal.
    const double std = std::sqrt(var / group_size);
    for (int i = 0; i < group_size; ++i)
      adv[g + i] = all_equal ? 0.0f : static_cast<float>((rewards[g + i] - mean) / (std + eps));
  }
  return adv;
}

GrpoLossStats grpo_loss(const std::vector<float>& logprobs, const RolloutBatch& batch,
                        const std::vector<float>& advantages, const GrpoHyper& hyper, double token_normaliser,
                        std::vector<float>& position_weights) {
  const std::size_t n = std::size_t(batch.rows) * batch.seq_len;
  PULSE_CHECK(logprobs.size() == n && batch.old_logprobs.size() == n && batch.completion_mask.size() == n,
              "grpo: logprobs, old_logprobs and completion_mask must hold rows x seq_len = " + std::to_string(n) +
                  " values");
  PULSE_CHECK(advantages.size() == std::size_t(batch.rows),
              "grpo: " + std::to_string(advantages.size()) + " advantages for " + std::to_string(batch.rows) + " rows");
  PULSE_CHECK(hyper.clip_low >= 0 && hyper.clip_low < 1 && hyper.clip_high >= 0,
              "grpo: clip range needs 0 <= clip_low < 1 and clip_high >= 0");
  PULSE_CHECK(token_normaliser >= 0, "grpo: token_normaliser must be >= 0");
  GrpoLossStats s;
  for (std::uint8_t m : batch.completion_mask) s.tokens += m;
  const double N = token_normaliser > 0 ? token_normaliser : double(s.tokens);
  position_weights.assign(n, 0.0f);
  if (s.tokens == 0) return s;
  const double lo = 1 - hyper.clip_low, hi = 1 + hyper.clip_high;
  double objective = 0, ratio_sum = 0;
  std::int64_t clipped = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (!batch.completion_mask[i]) continue;
    const double A = advantages[i / batch.seq_len];
    const double ratio = std::exp(double(logprobs[i]) - double(batch.old_logprobs[i]));
    const double unclipped = ratio * A, clipped_term = std::clamp(ratio, lo, hi) * A;
    ratio_sum += ratio;
    if (unclipped <= clipped_term) {
      // d(ratio*A)/dlogp = ratio*A, and dloss/dCE = -dloss/dlogp = +ratio*A/N.
      objective += unclipped;
      position_weights[i] = static_cast<float>(unclipped / N);
    } else {
      objective += clipped_term;  // a constant in logp: no gradient
      ++clipped;
    }
  }
  s.loss = -objective / N;
  s.clip_fraction = double(clipped) / s.tokens;
  s.mean_ratio = ratio_sum / s.tokens;
  return s;
}

GrpoLossStats grpo_backward(GPT& model, const RolloutBatch& batch, const std::vector<float>& advantages,
                            const GrpoHyper& hyper, double token_normaliser) {
  PULSE_CHECK(model.batch() == batch.rows && model.seq_len() == batch.seq_len,
              "grpo: the model is built for " + std::to_string(model.batch()) + " x " + std::to_string(model.seq_len()) +
                  " tokens, the batch holds " + std::to_string(batch.rows) + " x " + std::to_string(batch.seq_len));
  model.forward(to_device(batch.tokens, "pulse::grpo::tokens"), to_device(batch.targets, "pulse::grpo::targets"));
  std::vector<float> weights;
  const GrpoLossStats s =
      grpo_loss(to_host(model.target_logprobs()), batch, advantages, hyper, token_normaliser, weights);
  model.backward(to_device(weights, "pulse::grpo::position_weights"));
  return s;
}

}  // namespace pulse
