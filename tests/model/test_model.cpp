// The GPT as a whole: presets and tensor table, initialisation, the BF16 compute weights,
// determinism, gradient accumulation, input checks, and that AdamW on it learns a batch.
// Numerical agreement with PyTorch is tests/oracle/test_model_torch.py.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "core/error.hpp"
#include "kernels/adamw.hpp"
#include "kernels/bf16.hpp"
#include "kernels/host_copy.hpp"
#include "model/gpt.hpp"

namespace {

using pulse::GPT;
using pulse::GPTConfig;
using pulse::index_t;

index_t expected_parameters(const GPTConfig& c) {
  const index_t C = c.channels, V = c.vocab_size;
  return V * C * (c.tied_lm_head ? 1 : 2) + index_t(c.max_seq_len) * C + c.num_layers * (12 * C * C + 13 * C) + 2 * C;
}

GPTConfig small_config() {
  GPTConfig c;
  c.vocab_size = 23, c.max_seq_len = 12, c.num_layers = 2, c.num_heads = 2, c.channels = 16;
  return c;
}

Kokkos::View<pulse::bf16_bits*> bf16_weights(const GPTConfig& c, std::uint64_t seed) {
  const auto master = pulse::to_device(pulse::gpt_init(c, seed));
  Kokkos::View<pulse::bf16_bits*> w("w", master.extent(0));
  pulse::cast_to_bf16(pulse::DefaultExec(), master, w);
  return w;
}

Kokkos::View<int*> ids(int n, int vocab, int seed) {
  std::vector<int> h(n);
  for (int i = 0; i < n; ++i) h[i] = (i * 7 + seed * 13 + i * i) % vocab;
  return pulse::to_device(h);
}

}  // namespace

TEST(Model, PresetSizes) {
  const std::pair<const char*, std::pair<double, double>> presets[] = {
      {"tiny", {0.15e6, 0.25e6}}, {"small", {0.8e6, 1.2e6}}, {"base", {4e6, 6e6}}};
  for (const auto& [name, range] : presets) {
    const GPTConfig c = pulse::gpt_preset(name);
    const auto table = pulse::gpt_tensor_table(c);
    EXPECT_EQ(table.num_elements(), expected_parameters(c)) << name;
    EXPECT_GE(table.num_elements(), range.first) << name;
    EXPECT_LE(table.num_elements(), range.second) << name;
  }
  EXPECT_THROW(pulse::gpt_preset("huge"), pulse::Error);
}

TEST(Model, TensorTableNamesShapesAndDecay) {
  GPTConfig c = small_config();
  c.tied_lm_head = false;
  const auto t = pulse::gpt_tensor_table(c);
  EXPECT_EQ(t.num_elements(), expected_parameters(c));
  EXPECT_EQ(t[0].name, "wte.weight");
  EXPECT_EQ(t[t.size() - 1].name, "lm_head.weight");
  const auto& qkv = t[t.index_of("blocks.1.attn.qkv.weight")];
  EXPECT_EQ(qkv.shape, (std::vector<index_t>{48, 16}));  // [out, in] as torch.nn.Linear
  EXPECT_EQ(t[t.index_of("blocks.0.mlp.proj.weight")].shape, (std::vector<index_t>{16, 64}));
  // Weight decay exactly on the matrices and embeddings.
  for (const auto& info : t.tensors()) EXPECT_EQ(info.weight_decay, info.shape.size() == 2) << info.name;
  c.tied_lm_head = true;
  EXPECT_THROW(pulse::gpt_tensor_table(c).index_of("lm_head.weight"), pulse::Error);
  c.num_heads = 3;  // 16 channels do not split into 3 heads
  EXPECT_THROW(pulse::gpt_tensor_table(c), pulse::Error);
}

TEST(Model, InitIsDeterministicAndGpt2Like) {
  const GPTConfig c = pulse::gpt_preset("tiny");
  const auto a = pulse::gpt_init(c, 1), b = pulse::gpt_init(c, 1), other = pulse::gpt_init(c, 2);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, other);
  const auto t = pulse::gpt_tensor_table(c);
  const auto& ln = t[t.index_of("blocks.2.ln2.weight")];
  const auto& bias = t[t.index_of("blocks.2.mlp.fc.bias")];
  const auto& wte = t[t.index_of("wte.weight")];
  for (index_t i = 0; i < ln.numel; ++i) ASSERT_EQ(a[ln.offset + i], 1.0f);
  for (index_t i = 0; i < bias.numel; ++i) ASSERT_EQ(a[bias.offset + i], 0.0f);
  double sum = 0, sq = 0;
  for (index_t i = 0; i < wte.numel; ++i) sum += a[wte.offset + i], sq += double(a[wte.offset + i]) * a[wte.offset + i];
  EXPECT_NEAR(sum / wte.numel, 0.0, 0.001);
  EXPECT_NEAR(std::sqrt(sq / wte.numel), 0.02, 0.001);
}

TEST(Model, ForwardSeesTheBf16WeightsAndStartsNearUniform) {
  const GPTConfig c = small_config();
  GPT model(c, 2, 11);
  const auto w = bf16_weights(c, 3);
  model.set_weights(w);
  const auto got = pulse::to_host(model.weights());
  const auto bits = pulse::to_host(w);
  for (std::size_t i = 0; i < bits.size(); ++i) ASSERT_EQ(got[i], pulse::bf16_to_float(bits[i])) << i;
  const float loss = model.forward(ids(22, c.vocab_size, 1), ids(22, c.vocab_size, 2));
  EXPECT_NEAR(loss, std::log(float(c.vocab_size)), 0.1);  // small init: nearly uniform predictions
  EXPECT_EQ(model.forward(ids(22, c.vocab_size, 1)), -1.0f);
}

TEST(Model, BackwardIsDeterministicAndAccumulates) {
  const GPTConfig c = small_config();
  GPT model(c, 3, 7);
  model.set_weights(bf16_weights(c, 4));
  const auto tokens = ids(21, c.vocab_size, 3), targets = ids(21, c.vocab_size, 4);
  model.forward(tokens, targets);
  model.zero_grad();
  model.backward();
  const auto once = pulse::to_host(model.grads());
  model.forward(tokens, targets);
  model.backward();  // no zero_grad: adds the same gradient again
  const auto twice = pulse::to_host(model.grads());
  // Equal up to rounding only: BLAS may add a GEMM's partial sums into the old gradient in
  // pieces, and 0 + p1 + p2 rounds differently from g + p1 + p2.
  float max_abs = 0;
  for (float g : once) max_abs = std::max(max_abs, std::abs(g));
  index_t nonzero = 0;
  for (std::size_t i = 0; i < once.size(); ++i) {
    ASSERT_NEAR(twice[i], 2.0f * once[i], 1e-6f * max_abs) << i;
    nonzero += once[i] != 0.0f;
  }
  // Rows of wte for unused tokens and wpe beyond seq_len get no gradient; nearly all else does.
  EXPECT_GT(nonzero, index_t(once.size() * 8 / 10));
  model.zero_grad();
  model.forward(tokens, targets);
  model.backward();
  EXPECT_EQ(pulse::to_host(model.grads()), once);  // bit for bit: no atomics anywhere
}

TEST(Model, RejectsBadInputs) {
  const GPTConfig c = small_config();
  EXPECT_THROW(GPT(c, 1, c.max_seq_len + 1), pulse::Error);
  GPT model(c, 1, 4);
  model.set_weights(bf16_weights(c, 5));
  EXPECT_THROW(model.backward(), pulse::Error);  // no forward with targets yet
  EXPECT_THROW(model.forward(ids(5, c.vocab_size, 1)), pulse::Error);  // wrong count
  EXPECT_THROW(model.forward(pulse::to_device(std::vector<int>{0, 1, c.vocab_size, 2})), pulse::Error);
  EXPECT_THROW(model.forward(ids(4, c.vocab_size, 1), pulse::to_device(std::vector<int>{0, -1, 0, 0})), pulse::Error);
  EXPECT_THROW(model.set_weights(Kokkos::View<pulse::bf16_bits*>("short", 3)), pulse::Error);
}

TEST(Model, AdamWLearnsOneBatch) {
  const GPTConfig c = small_config();
  GPT model(c, 2, 12);
  const auto& table = model.table();
  const index_t n = table.num_elements();
  Kokkos::View<float*> master = pulse::to_device(pulse::gpt_init(c, 6)), m("m", n), v("v", n);
  Kokkos::View<pulse::bf16_bits*> w("w", n);
  pulse::cast_to_bf16(pulse::DefaultExec(), master, w);
  const auto segs = pulse::make_segments(table.offsets());
  const auto mask = pulse::to_device(table.weight_decay_mask());
  const auto tokens = ids(24, c.vocab_size, 7), targets = ids(24, c.vocab_size, 8);
  pulse::AdamWHyper hyper;
  hyper.lr = 1e-2;
  float first = 0, last = 0;
  for (int step = 1; step <= 30; ++step) {
    model.set_weights(w);
    last = model.forward(tokens, targets);
    if (step == 1) first = last;
    model.zero_grad();
    model.backward();
    pulse::adamw_mixed(pulse::DefaultExec(), segs, mask, pulse::adamw_scalars(hyper, step, 1.0f, pulse::Precision::mixed),
                       master, model.grads(), m, v, w, false);
  }
  EXPECT_LT(last, 0.3f * first) << "loss " << first << " -> " << last;
}

TEST(Model, TargetLogprobsAreMinusTheCrossEntropyOfTheLogits) {
  const GPTConfig c = small_config();
  GPT model(c, 2, 9);
  model.set_weights(bf16_weights(c, 9));
  const auto targets_h = pulse::to_host(ids(18, c.vocab_size, 6));
  const float loss = model.forward(ids(18, c.vocab_size, 5), pulse::to_device(targets_h));
  const auto logprobs = pulse::to_host(model.target_logprobs());
  const auto logits = pulse::to_host(model.logits());
  ASSERT_EQ(logprobs.size(), 18u);
  double sum = 0;
  for (std::size_t i = 0; i < logprobs.size(); ++i) {
    // log-softmax in double from the logits: an independent reference
    const float* row = logits.data() + i * c.vocab_size;
    double mx = row[0], z = 0;
    for (int v = 1; v < c.vocab_size; ++v) mx = std::max(mx, double(row[v]));
    for (int v = 0; v < c.vocab_size; ++v) z += std::exp(row[v] - mx);
    EXPECT_NEAR(logprobs[i], row[targets_h[i]] - mx - std::log(z), 1e-5) << i;
    sum -= logprobs[i];
  }
  EXPECT_NEAR(sum / logprobs.size(), loss, 1e-6);
}

TEST(Model, WeightedBackwardGeneralisesTheMean) {
  const GPTConfig c = small_config();
  const int B = 3, T = 7, BT = B * T;
  GPT model(c, B, T);
  model.set_weights(bf16_weights(c, 10));
  const auto tokens = ids(BT, c.vocab_size, 11), targets = ids(BT, c.vocab_size, 12);
  model.forward(tokens, targets);
  model.zero_grad();
  model.backward();
  const auto mean = pulse::to_host(model.grads());
  // All weights 1/(B*T) is the mean loss, through the same kernels: bit for bit.
  model.zero_grad();
  model.backward(pulse::to_device(std::vector<float>(BT, 1.0f / BT)));
  EXPECT_EQ(pulse::to_host(model.grads()), mean);
  // Zero weights give zero gradients; the gradient is linear in the weights.
  model.zero_grad();
  model.backward(pulse::to_device(std::vector<float>(BT, 0.0f)));
  for (float g : pulse::to_host(model.grads())) ASSERT_EQ(g, 0.0f);
  std::vector<float> w1(BT), w2(BT), w12(BT);
  for (int i = 0; i < BT; ++i) w1[i] = (i % 3) * 0.1f, w2[i] = i % 2 ? -0.05f : 0.2f, w12[i] = w1[i] + w2[i];
  model.zero_grad();
  model.backward(pulse::to_device(w1));
  model.backward(pulse::to_device(w2));
  const auto sum = pulse::to_host(model.grads());
  model.zero_grad();
  model.backward(pulse::to_device(w12));
  const auto joint = pulse::to_host(model.grads());
  float max_abs = 0;
  for (float g : joint) max_abs = std::max(max_abs, std::abs(g));
  for (std::size_t i = 0; i < joint.size(); ++i) ASSERT_NEAR(sum[i], joint[i], 1e-5f * max_abs) << i;
  EXPECT_THROW(model.backward(pulse::to_device(std::vector<float>(BT - 1, 0.0f))), pulse::Error);
}
