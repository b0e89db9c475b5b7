// Rollouts: layout invariants, determinism and independence of batching, greedy decoding
// against a reference built on GPT::forward, old log-probabilities against GPT's, the sampler's
// distribution against softmax, and RolloutBatch's byte format (round trip, bad input rejected).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "core/error.hpp"
#include "kernels/bf16.hpp"
#include "kernels/host_copy.hpp"
#include "model/gpt.hpp"
#include "model/gpt_decoder.hpp"
#include "rl/grpo.hpp"
#include "rl/rollout.hpp"

namespace {

using pulse::RolloutBatch;

struct Fixture {
  pulse::CharTokenizer tok = pulse::arithmetic_tokenizer();
  pulse::AdditionTask task{2, 5};
  pulse::GPTConfig config;
  Kokkos::View<pulse::bf16_bits*> weights;
  int seq_len;

  // weight_scale > 1 sharpens the random model's predictions, so sampling is not near uniform.
  explicit Fixture(float weight_scale = 1.0f) {
    config.vocab_size = tok.vocab_size(), config.max_seq_len = 16, config.num_layers = 2, config.num_heads = 2;
    config.channels = 16;
    seq_len = task.max_text_length() - 1;
    std::vector<float> init = pulse::gpt_init(config, 17);
    for (float& x : init) x *= weight_scale;
    const auto master = pulse::to_device(init);
    weights = Kokkos::View<pulse::bf16_bits*>("w", master.extent(0));
    pulse::cast_to_bf16(pulse::DefaultExec(), master, weights);
  }
  std::vector<pulse::AdditionProblem> problems(int n) {
    std::vector<pulse::AdditionProblem> p;
    for (int i = 0; i < n; ++i) p.push_back(task.sample());
    return p;
  }
  RolloutBatch sample(int decoder_batch, const std::vector<pulse::AdditionProblem>& prompts, int group,
                      const pulse::SamplingOptions& opt) {
    pulse::GPTDecoder decoder(config, decoder_batch, seq_len);
    decoder.set_weights(weights);
    return pulse::sample_rollouts(decoder, tok, task, prompts, group, seq_len, opt);
  }
};

void expect_same_rollouts(const RolloutBatch& a, const RolloutBatch& b) {
  ASSERT_EQ(a.rows, b.rows);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.targets, b.targets);
  EXPECT_EQ(a.completion_mask, b.completion_mask);
  EXPECT_EQ(a.rewards, b.rewards);
  // Bit for bit: pulse::gemm makes a row's logits independent of the rows beside it.
  ASSERT_EQ(a.old_logprobs.size(), b.old_logprobs.size());
  EXPECT_EQ(std::memcmp(a.old_logprobs.data(), b.old_logprobs.data(), a.old_logprobs.size() * sizeof(float)), 0);
}

RolloutBatch concat(const RolloutBatch& a, const RolloutBatch& b) {
  RolloutBatch c = a;
  c.rows += b.rows;
  c.tokens.insert(c.tokens.end(), b.tokens.begin(), b.tokens.end());
  c.targets.insert(c.targets.end(), b.targets.begin(), b.targets.end());
  c.completion_mask.insert(c.completion_mask.end(), b.completion_mask.begin(), b.completion_mask.end());
  c.old_logprobs.insert(c.old_logprobs.end(), b.old_logprobs.begin(), b.old_logprobs.end());
  c.rewards.insert(c.rewards.end(), b.rewards.begin(), b.rewards.end());
  return c;
}

}  // namespace

TEST(Rollouts, LayoutInvariants) {
  Fixture f(4.0f);
  const auto prompts = f.problems(4);
  pulse::SamplingOptions opt;
  opt.seed = 3;
  const RolloutBatch b = f.sample(5, prompts, 3, opt);
  ASSERT_EQ(b.rows, 12);
  ASSERT_EQ(b.group_size, 3);
  const int T = f.seq_len;
  int finished_by_eos = 0;
  for (int r = 0; r < b.rows; ++r) {
    const std::vector<int> prompt = f.tok.encode(prompts[r / 3].prompt);
    const int P = static_cast<int>(prompt.size());
    for (int t = 0; t < T; ++t) {
      const std::size_t i = std::size_t(r) * T + t;
      if (t + 1 < T) ASSERT_EQ(b.targets[i], b.tokens[i + 1]);  // shifted by one
      if (t < P) ASSERT_EQ(b.tokens[i], prompt[t]);
      // The mask covers targets P-1 .. through the first eos (or the end), nothing else.
      const bool after_prompt = t + 1 >= P;
      bool eos_before = false;
      for (int s = P - 1; s < t; ++s) eos_before |= b.targets[std::size_t(r) * T + s] == f.tok.eos();
      ASSERT_EQ(b.completion_mask[i], after_prompt && !eos_before ? 1 : 0) << "row " << r << " t " << t;
      if (b.completion_mask[i]) {
        ASSERT_LE(b.old_logprobs[i], 0.0f);
        finished_by_eos += b.targets[i] == f.tok.eos();
      } else {
        ASSERT_EQ(b.old_logprobs[i], 0.0f);
        if (eos_before) ASSERT_EQ(b.targets[i], f.tok.eos());  // eos padding
      }
    }
    EXPECT_EQ(b.rewards[r], f.task.reward(prompts[r / 3], pulse::completion_text(b, f.tok, r)));
  }
  EXPECT_GT(finished_by_eos, 0);  // with this seed some rows end early, so padding is tested too
}

TEST(Rollouts, DeterministicAndIndependentOfBatching) {
  Fixture f(4.0f);
  const auto prompts = f.problems(5);
  pulse::SamplingOptions opt;
  opt.seed = 11;
  const RolloutBatch whole = f.sample(15, prompts, 3, opt);
  expect_same_rollouts(whole, f.sample(15, prompts, 3, opt));
  expect_same_rollouts(whole, f.sample(4, prompts, 3, opt));  // chunks of 4, last one partial
  expect_same_rollouts(whole, f.sample(1, prompts, 3, opt));
  // Two calls on slices of the prompts, the second told its first global row.
  const std::vector<pulse::AdditionProblem> head(prompts.begin(), prompts.begin() + 2), tail(prompts.begin() + 2, prompts.end());
  const RolloutBatch a = f.sample(7, head, 3, opt);
  opt.first_row = 6;
  expect_same_rollouts(whole, concat(a, f.sample(7, tail, 3, opt)));
  // Another seed gives other completions; rows of a group differ from each other.
  opt.first_row = 0;
  opt.seed = 12;
  EXPECT_NE(whole.tokens, f.sample(15, prompts, 3, opt).tokens);
  bool group_differs = false;
  for (int t = 0; t < f.seq_len; ++t) group_differs |= whole.tokens[t] != whole.tokens[f.seq_len + t];
  EXPECT_TRUE(group_differs);
}

// The trainer scores the rollouts with the full forward pass at the sampling temperature: its
// logprobs are the sampler's bit for bit, so GRPO's importance ratio at the first iteration is
// exactly 1 (and nothing is clipped).
void expect_trainer_scores_as_sampled(Fixture& f, const RolloutBatch& b, float temperature) {
  pulse::GPT model(f.config, b.rows, b.seq_len);
  model.set_weights(f.weights);
  if (temperature > 0) model.set_temperature(temperature);
  model.forward(pulse::to_device(b.tokens), pulse::to_device(b.targets));
  const auto trainer = pulse::to_host(model.target_logprobs());
  int scored = 0;
  for (std::size_t i = 0; i < trainer.size(); ++i)
    if (b.completion_mask[i]) {
      ASSERT_EQ(std::memcmp(&b.old_logprobs[i], &trainer[i], sizeof(float)), 0)
          << "temperature " << temperature << " position " << i << ": sampler " << b.old_logprobs[i] << ", trainer "
          << trainer[i];
      ++scored;
    }
  EXPECT_GT(scored, 0);
  std::vector<float> advantages(b.rows);
  for (int r = 0; r < b.rows; ++r) advantages[r] = r % 2 ? 1.0f : -1.0f;
  std::vector<float> weights;
  const pulse::GrpoLossStats s = pulse::grpo_loss(trainer, b, advantages, pulse::GrpoHyper{}, 0, weights);
  EXPECT_EQ(s.mean_ratio, 1.0) << "temperature " << temperature;
  EXPECT_EQ(s.clip_fraction, 0.0);
}

TEST(Rollouts, OldLogprobsAreTheTrainersLogprobsBitForBit) {
  Fixture f(4.0f);
  const auto prompts = f.problems(3);
  pulse::SamplingOptions opt;
  opt.seed = 5;
  for (float t : {1.0f, 0.5f, 0.7f, 0.0f}) {
    opt.temperature = t;
    expect_trainer_scores_as_sampled(f, f.sample(4, prompts, 2, opt), t);
  }
}

TEST(Rollouts, OldLogprobsAreLogSoftmaxAtTheTemperature) {
  Fixture f(4.0f);
  const auto prompts = f.problems(3);
  pulse::SamplingOptions opt;
  opt.seed = 5;
  // At temperature 1/2 they are log-softmax(2 * logits) of the model's logits (double reference).
  opt.temperature = 0.5f;
  const RolloutBatch cold = f.sample(4, prompts, 2, opt);
  pulse::GPT model(f.config, cold.rows, cold.seq_len);
  model.set_weights(f.weights);
  model.forward(pulse::to_device(cold.tokens), pulse::to_device(cold.targets));
  const auto logits = pulse::to_host(model.logits());
  const int V = f.config.vocab_size;
  for (std::size_t i = 0; i < cold.old_logprobs.size(); ++i) {
    if (!cold.completion_mask[i]) continue;
    double mx = -1e30, z = 0;
    for (int v = 0; v < V; ++v) mx = std::max(mx, 2.0 * logits[i * V + v]);
    for (int v = 0; v < V; ++v) z += std::exp(2.0 * logits[i * V + v] - mx);
    ASSERT_NEAR(cold.old_logprobs[i], 2.0 * logits[i * V + cold.targets[i]] - mx - std::log(z), 4e-5) << i;
  }
}

TEST(Rollouts, TemperatureZeroIsGreedyArgmaxOfTheFullForward) {
  Fixture f(4.0f);
  const auto prompts = f.problems(6);
  pulse::SamplingOptions opt;
  opt.temperature = 0;
  opt.seed = 99;  // irrelevant when greedy
  const RolloutBatch b = f.sample(4, prompts, 2, opt);
  // Reference: re-run the whole sequence through GPT::forward for every new token, argmax.
  pulse::GPT model(f.config, 1, f.seq_len);
  model.set_weights(f.weights);
  const int V = f.config.vocab_size, T = f.seq_len;
  double solved = 0;
  for (std::size_t p = 0; p < prompts.size(); ++p) {
    std::vector<int> text = f.tok.encode(prompts[p].prompt);
    std::string completion;
    while (int(text.size()) <= T) {
      std::vector<int> row(text);
      row.resize(T, f.tok.eos());
      row.resize(T);
      model.forward(pulse::to_device(row));
      const auto logits = pulse::to_host(model.logits());
      const float* z = logits.data() + (text.size() - 1) * V;
      const int next = static_cast<int>(std::max_element(z, z + V) - z);
      text.push_back(next);
      completion += f.tok.decode({next});
      if (next == f.tok.eos()) break;
    }
    for (int g = 0; g < 2; ++g) {
      const int r = int(p) * 2 + g;
      EXPECT_EQ(pulse::completion_text(b, f.tok, r), completion) << prompts[p].prompt;
      EXPECT_EQ(b.rewards[r], f.task.reward(prompts[p], completion));
    }
    solved += f.task.reward(prompts[p], completion);
  }
  pulse::GPTDecoder decoder(f.config, 4, f.seq_len);
  decoder.set_weights(f.weights);
  EXPECT_DOUBLE_EQ(pulse::greedy_pass_at_1(decoder, f.tok, f.task, prompts, f.seq_len), solved / prompts.size());
}

TEST(Rollouts, FirstTokenFrequenciesFollowTheSoftmax) {
  Fixture f(6.0f);
  const auto prompts = f.problems(1);
  const int N = 4000;
  pulse::SamplingOptions opt;
  opt.seed = 7;
  opt.max_new_tokens = 1;
  const RolloutBatch b = f.sample(500, prompts, N, opt);
  const int P = static_cast<int>(prompts[0].prompt.size()), T = f.seq_len, V = f.config.vocab_size;
  pulse::GPT model(f.config, 1, T);
  model.set_weights(f.weights);
  model.forward(pulse::to_device(std::vector<int>(b.tokens.begin(), b.tokens.begin() + T)));
  const auto logits = pulse::to_host(model.logits());
  const float* z = logits.data() + std::size_t(P - 1) * V;
  double mx = *std::max_element(z, z + V), sum = 0;
  for (int v = 0; v < V; ++v) sum += std::exp(z[v] - mx);
  std::map<int, int> counts;
  for (int r = 0; r < N; ++r) {
    ASSERT_EQ(pulse::completion_text(b, f.tok, r).size(), 1u);  // max_new_tokens 1
    ++counts[b.targets[std::size_t(r) * T + P - 1]];
  }
  double max_p = 0;
  for (int v = 0; v < V; ++v) {
    const double p = std::exp(z[v] - mx) / sum;
    max_p = std::max(max_p, p);
    // 5 binomial standard deviations
    EXPECT_NEAR(counts[v] / double(N), p, 5 * std::sqrt(p * (1 - p) / N) + 1e-9) << "token " << v;
  }
  EXPECT_LT(max_p, 0.95);  // the test needs a distribution worth sampling
}

TEST(Rollouts, RejectsBadArguments) {
  Fixture f;
  const auto prompts = f.problems(2);
  pulse::GPTDecoder decoder(f.config, 4, f.seq_len - 1);
  decoder.set_weights(f.weights);
  pulse::SamplingOptions opt;
  EXPECT_THROW(pulse::sample_rollouts(decoder, f.tok, f.task, prompts, 2, f.seq_len, opt), pulse::Error);
  EXPECT_THROW(pulse::sample_rollouts(decoder, f.tok, f.task, prompts, 0, f.seq_len - 1, opt), pulse::Error);
  opt.temperature = -1;
  EXPECT_THROW(pulse::sample_rollouts(decoder, f.tok, f.task, prompts, 2, f.seq_len - 1, opt), pulse::Error);
  EXPECT_THROW(pulse::greedy_pass_at_1(decoder, f.tok, f.task, {}, f.seq_len - 1), pulse::Error);
}

TEST(RolloutBatch, SerializeRoundTripAndRejectsCorruptInput) {
  Fixture f(4.0f);
  pulse::SamplingOptions opt;
  opt.seed = 1;
  RolloutBatch b = f.sample(8, f.problems(3), 2, opt);
  b.policy_version = 0x0123456789ABCDEFull;
  const std::vector<std::uint8_t> bytes = b.serialize();
  const RolloutBatch c = RolloutBatch::deserialize(bytes.data(), bytes.size());
  EXPECT_EQ(c.rows, b.rows);
  EXPECT_EQ(c.seq_len, b.seq_len);
  EXPECT_EQ(c.group_size, b.group_size);
  EXPECT_EQ(c.policy_version, b.policy_version);
  EXPECT_EQ(c.tokens, b.tokens);
  EXPECT_EQ(c.targets, b.targets);
  EXPECT_EQ(c.completion_mask, b.completion_mask);
  EXPECT_EQ(c.old_logprobs, b.old_logprobs);  // bit for bit
  EXPECT_EQ(c.rewards, b.rewards);
  EXPECT_EQ(c.serialize(), bytes);

  for (std::size_t n = 0; n < bytes.size(); ++n)  // every truncation
    ASSERT_THROW(RolloutBatch::deserialize(bytes.data(), n), pulse::Error) << n;
  std::vector<std::uint8_t> longer = bytes;
  longer.push_back(0);
  EXPECT_THROW(RolloutBatch::deserialize(longer.data(), longer.size()), pulse::Error);
  auto corrupt = [&](std::size_t at, std::uint8_t value) {
    std::vector<std::uint8_t> x = bytes;
    x[at] = value;
    return x;
  };
  const std::size_t header = 8 + 12 + 8, n = std::size_t(b.rows) * b.seq_len;
  for (const auto& x : {corrupt(0, 'X'),                      // magic
                        corrupt(8, 0xFF),                     // rows 2^31-ish (and not a multiple)
                        corrupt(11, 0x80),                    // rows negative
                        corrupt(16, 0),                       // group_size 0 -> also rows % group
                        corrupt(header + 3, 0x80),            // a negative token id
                        corrupt(header + 8 * n + 1, 2)})      // mask value 2
    EXPECT_THROW(RolloutBatch::deserialize(x.data(), x.size()), pulse::Error);
  EXPECT_THROW(RolloutBatch::deserialize(nullptr, 10), pulse::Error);
  b.rewards.pop_back();
  EXPECT_THROW(b.serialize(), pulse::Error);
}
