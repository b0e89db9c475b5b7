// GPTDecoder against the full forward pass: feeding a sequence token by token through the KV
// cache gives, at every position, the logits GPT::forward computes for that position, bit for
// bit (the same kernels in the same order, and pulse::gemm's rows do not depend on the batch).
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.hpp"
#include "kernels/bf16.hpp"
#include "kernels/host_copy.hpp"
#include "model/gpt.hpp"
#include "model/gpt_decoder.hpp"

namespace {

using pulse::GPTConfig;

Kokkos::View<pulse::bf16_bits*> bf16_weights(const GPTConfig& c, std::uint64_t seed) {
  std::vector<float> init = pulse::gpt_init(c, seed);
  // Biases 0 and LayerNorm weights 1 would hide layout mistakes in those tensors.
  for (std::size_t i = 0; i < init.size(); ++i) init[i] += 0.05f * std::sin(0.37f * float(i));
  const auto master = pulse::to_device(init);
  Kokkos::View<pulse::bf16_bits*> w("w", master.extent(0));
  pulse::cast_to_bf16(pulse::DefaultExec(), master, w);
  return w;
}

// Max over positions of max |decoder - forward| / max |forward| on that position's logits.
void expect_decoder_matches_forward(const GPTConfig& c, int B, int T, int max_len) {
  const auto w = bf16_weights(c, 21);
  std::vector<int> tokens(std::size_t(B) * T);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = int((i * 31 + i * i * 7 + 3) % c.vocab_size);
  pulse::GPT model(c, B, T);
  model.set_weights(w);
  model.forward(pulse::to_device(tokens));
  const auto full = pulse::to_host(model.logits());

  pulse::GPTDecoder decoder(c, B, max_len);
  decoder.set_weights(w);
  const int V = c.vocab_size;
  double worst = 0;
  for (int pass = 0; pass < 2; ++pass) {  // the second pass checks reset()
    decoder.reset();
    for (int t = 0; t < T; ++t) {
      std::vector<int> column(B);
      for (int b = 0; b < B; ++b) column[b] = tokens[b * T + t];
      const auto logits = pulse::to_host(decoder.step(pulse::to_device(column), t));
      ASSERT_EQ(logits.size(), std::size_t(B) * V);
      for (int b = 0; b < B; ++b) {
        const float* ref = full.data() + (std::size_t(b) * T + t) * V;
        double scale = 0, err = 0;
        for (int v = 0; v < V; ++v) {
          scale = std::max(scale, double(std::abs(ref[v])));
          err = std::max(err, double(std::abs(logits[b * V + v] - ref[v])));
        }
        worst = std::max(worst, err / scale);
      }
    }
  }
  std::printf("decoder vs forward (B %d, T %d, C %d): worst relative logits error %.2e\n", B, T, c.channels, worst);
  EXPECT_EQ(worst, 0.0);
}

}  // namespace

TEST(GPTDecoder, StepLogitsEqualFullForwardTied) {
  GPTConfig c;
  c.vocab_size = 37, c.max_seq_len = 20, c.num_layers = 3, c.num_heads = 3, c.channels = 24;
  expect_decoder_matches_forward(c, 3, 17, 20);
}

TEST(GPTDecoder, StepLogitsEqualFullForwardUntiedTinyPreset) {
  GPTConfig c = pulse::gpt_preset("tiny");
  c.vocab_size = 13;
  c.tied_lm_head = false;
  expect_decoder_matches_forward(c, 5, c.max_seq_len, c.max_seq_len);
}

TEST(GPTDecoder, RejectsOutOfOrderStepsFullCacheAndBadInput) {
  GPTConfig c;
  c.vocab_size = 11, c.max_seq_len = 8, c.num_layers = 1, c.num_heads = 2, c.channels = 8;
  EXPECT_THROW(pulse::GPTDecoder(c, 2, 9), pulse::Error);
  pulse::GPTDecoder decoder(c, 2, 2);
  decoder.set_weights(bf16_weights(c, 1));
  const auto ok = pulse::to_device(std::vector<int>{1, 2});
  EXPECT_THROW(decoder.step(ok, 1), pulse::Error);  // position 0 comes first
  decoder.step(ok, 0);
  EXPECT_THROW(decoder.step(pulse::to_device(std::vector<int>{1, 11}), 1), pulse::Error);
  EXPECT_THROW(decoder.step(pulse::to_device(std::vector<int>{1}), 1), pulse::Error);
  decoder.step(ok, 1);
  EXPECT_THROW(decoder.step(ok, 2), pulse::Error);  // max_len 2
  EXPECT_THROW(decoder.set_weights(Kokkos::View<pulse::bf16_bits*>("short", 3)), pulse::Error);
  decoder.reset();
  EXPECT_EQ(decoder.position(), 0);
  decoder.step(ok, 0);
}
