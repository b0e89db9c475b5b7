// GRPO by hand: group advantages and the clipped token-level loss on cases small enough to work
// out on paper, plus a finite-difference check of the position weights. Gradients through the
// model against PyTorch autograd are in tests/oracle/test_model_torch.py.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.hpp"
#include "rl/grpo.hpp"

namespace {

pulse::RolloutBatch two_rows() {
  pulse::RolloutBatch b;
  b.rows = 2, b.seq_len = 3, b.group_size = 2;
  b.tokens.assign(6, 0);
  b.targets.assign(6, 0);
  b.completion_mask = {1, 1, 1, 0, 1, 1};
  b.old_logprobs = {-1.0f, -2.0f, -0.5f, 0.0f, -3.0f, -0.25f};
  b.rewards = {1, 0};
  return b;
}

}  // namespace

TEST(Grpo, GroupAdvantagesByHand) {
  const std::vector<float> r = {1, 0, 0, 1, 0.5f, 0.5f, 0.5f, 0.5f, 1, 0, 0, 0};
  const auto a = pulse::group_advantages(r, 4, 0.0);
  // mean 1/2, population std 1/2
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(a[i], r[i] == 1 ? 1.0f : -1.0f);
  for (int i = 4; i < 8; ++i) EXPECT_EQ(a[i], 0.0f);  // all equal: no signal
  // mean 1/4, variance (9/16 + 3/16)/4 = 3/16, std sqrt(3)/4: 3/sqrt(3) = sqrt(3), -1/sqrt(3)
  EXPECT_FLOAT_EQ(a[8], std::sqrt(3.0f));
  for (int i = 9; i < 12; ++i) EXPECT_FLOAT_EQ(a[i], -1.0f / std::sqrt(3.0f));
  // eps enters the denominator
  EXPECT_FLOAT_EQ(pulse::group_advantages({1, 0}, 2, 0.5)[0], 0.5f);  // 0.5 / (0.5 + 0.5)
  EXPECT_EQ(pulse::group_advantages({2, 2}, 2, 0.0), (std::vector<float>{0, 0}));
  EXPECT_THROW(pulse::group_advantages(r, 5, 1e-6), pulse::Error);
}

TEST(Grpo, ClippedLossByHand) {
  pulse::RolloutBatch b = two_rows();
  const std::vector<float> adv = {2.0f, -1.0f};
  // Row 0 (A = 2): ratio 1.5 is clipped to 1.28 (min picks 2.56), ratio 0.5 is not (min picks
  // 1.0 < 1.6), ratio 1.1 is inside. Row 1 (A = -1): position 0 is outside the mask; ratio 0.5
  // is clipped to 0.8 (min picks -0.8), ratio 1.5 is not (min picks -1.5 < -1.28).
  const double ratios[6] = {1.5, 0.5, 1.1, 123.0, 0.5, 1.5};
  std::vector<float> logprobs(6);
  for (int i = 0; i < 6; ++i) logprobs[i] = static_cast<float>(b.old_logprobs[i] + std::log(ratios[i]));
  std::vector<float> w;
  pulse::GrpoHyper h;
  const auto s = pulse::grpo_loss(logprobs, b, adv, h, 0, w);
  // objective 2.56 + 1.0 + 2.2 - 0.8 - 1.5 = 3.46 over N = 5 tokens
  EXPECT_EQ(s.tokens, 5);
  EXPECT_NEAR(s.loss, -3.46 / 5, 1e-6);
  EXPECT_NEAR(s.clip_fraction, 2.0 / 5, 1e-12);
  EXPECT_NEAR(s.mean_ratio, (1.5 + 0.5 + 1.1 + 0.5 + 1.5) / 5, 1e-6);
  const double expected[6] = {0, 2 * 0.5 / 5, 2 * 1.1 / 5, 0, 0, -1.5 / 5};
  ASSERT_EQ(w.size(), 6u);
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(w[i], expected[i], 1e-6) << i;
  // A global token count (ranks splitting a batch) rescales loss and weights.
  const auto s10 = pulse::grpo_loss(logprobs, b, adv, h, 10, w);
  EXPECT_NEAR(s10.loss, -3.46 / 10, 1e-6);
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(w[i], expected[i] / 2, 1e-6) << i;
  // Symmetric clipping 0.2/0.2 clips ratio 1.1 with a wider range neither way, but 1.25 now is.
  h.clip_high = 0.2;
  logprobs[2] = static_cast<float>(b.old_logprobs[2] + std::log(1.25));
  const auto s_sym = pulse::grpo_loss(logprobs, b, adv, h, 0, w);
  EXPECT_NEAR(s_sym.clip_fraction, 3.0 / 5, 1e-12);
  EXPECT_EQ(w[2], 0.0f);
  EXPECT_NEAR(s_sym.loss, -(2.4 + 1.0 + 2.4 - 0.8 - 1.5) / 5, 1e-6);
}

TEST(Grpo, PositionWeightsAreMinusTheLossDerivativeInLogprob) {
  // dloss/dCE = -dloss/dlogp: central differences on random ratios away from the clip edges.
  pulse::RolloutBatch b;
  b.rows = 4, b.seq_len = 6, b.group_size = 2;
  const std::size_t n = 24;
  b.completion_mask.assign(n, 1);
  b.completion_mask[0] = b.completion_mask[7] = 0;
  b.old_logprobs.resize(n);
  std::vector<double> lp(n);
  for (std::size_t i = 0; i < n; ++i) {
    b.old_logprobs[i] = -0.1f - 0.3f * float(i % 5);
    double ratio = 0.6 + 0.05 * double((i * 7) % 17);  // 0.6 .. 1.4
    if (std::abs(ratio - 0.8) < 0.02 || std::abs(ratio - 1.28) < 0.02) ratio += 0.03;
    lp[i] = b.old_logprobs[i] + std::log(ratio);
  }
  const std::vector<float> adv = {1.3f, -0.7f, 0.0f, -2.0f};
  auto loss_at = [&](const std::vector<double>& x) {
    std::vector<float> xf(x.begin(), x.end()), w;
    return pulse::grpo_loss(xf, b, adv, pulse::GrpoHyper(), 0, w).loss;
  };
  std::vector<float> w;
  pulse::grpo_loss(std::vector<float>(lp.begin(), lp.end()), b, adv, pulse::GrpoHyper(), 0, w);
  const double step = 1e-3;
  int nonzero = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<double> up = lp, down = lp;
    up[i] += step, down[i] -= step;
    const double dloss_dlogp = (loss_at(up) - loss_at(down)) / (2 * step);
    EXPECT_NEAR(w[i], -dloss_dlogp, 2e-4) << i;
    nonzero += w[i] != 0;
  }
  EXPECT_GT(nonzero, 6);
}

TEST(Grpo, RejectsMismatchedInputs) {
  pulse::RolloutBatch b = two_rows();
  std::vector<float> w;
  EXPECT_THROW(pulse::grpo_loss(std::vector<float>(5), b, {1, 1}, {}, 0, w), pulse::Error);
  EXPECT_THROW(pulse::grpo_loss(std::vector<float>(6), b, {1}, {}, 0, w), pulse::Error);
  EXPECT_THROW(pulse::grpo_loss(std::vector<float>(6), b, {1, 1}, {}, -1, w), pulse::Error);
  // An empty mask is a zero loss and zero weights, not a division by zero.
  b.completion_mask.assign(6, 0);
  const auto s = pulse::grpo_loss(std::vector<float>(6), b, {1, 1}, {}, 0, w);
  EXPECT_EQ(s.loss, 0.0);
  EXPECT_EQ(w, std::vector<float>(6, 0.0f));
}
