#include "model/gpt.hpp"

#include <cmath>
#include <random>

#include "core/error.hpp"
#include "kernels/attention.hpp"
#include "kernels/bf16.hpp"
#include "kernels/cross_entropy.hpp"
#include "kernels/embedding.hpp"
#include "kernels/gelu.hpp"
#include "kernels/layernorm.hpp"
#include "kernels/matmul.hpp"
#include "kernels/residual.hpp"

namespace pulse {

namespace {

std::string block(int l, const char* what) { return "blocks." + std::to_string(l) + "." + what; }

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

GPTConfig gpt_preset(const std::string& name) {
  GPTConfig c;
  if (name == "tiny") {
    c.max_seq_len = 64, c.num_layers = 4, c.num_heads = 4, c.channels = 64;
  } else if (name == "small") {
    c.max_seq_len = 128, c.num_layers = 5, c.num_heads = 4, c.channels = 128;
  } else if (name == "base") {
    c.max_seq_len = 256, c.num_layers = 6, c.num_heads = 8, c.channels = 256;
  } else {
    throw_error(__FILE__, __LINE__, "unknown model preset '" + name + "' (tiny, small, base)");
  }
  return c;
}

void validate(const GPTConfig& c) {
  PULSE_CHECK(c.vocab_size > 0, "model: vocab_size must be positive, got " + std::to_string(c.vocab_size));
  PULSE_CHECK(c.max_seq_len > 0, "model: max_seq_len must be positive, got " + std::to_string(c.max_seq_len));
  PULSE_CHECK(c.num_layers > 0, "model: num_layers must be positive, got " + std::to_string(c.num_layers));
  PULSE_CHECK(c.num_heads > 0, "model: num_heads must be positive, got " + std::to_string(c.num_heads));
  PULSE_CHECK(c.channels > 0 && c.channels % c.num_heads == 0,
              "model: channels (" + std::to_string(c.channels) + ") must be a positive multiple of num_heads (" +
                  std::to_string(c.num_heads) + ")");
}

TensorTable gpt_tensor_table(const GPTConfig& c) {
  validate(c);
  const index_t V = c.vocab_size, C = c.channels;
  TensorTable t;
  t.add("wte.weight", {V, C});
  t.add("wpe.weight", {index_t(c.max_seq_len), C});
  for (int l = 0; l < c.num_layers; ++l) {
    t.add(block(l, "ln1.weight"), {C}, false);
    t.add(block(l, "ln1.bias"), {C}, false);
    t.add(block(l, "attn.qkv.weight"), {3 * C, C});
    t.add(block(l, "attn.qkv.bias"), {3 * C}, false);
    t.add(block(l, "attn.proj.weight"), {C, C});
    t.add(block(l, "attn.proj.bias"), {C}, false);
    t.add(block(l, "ln2.weight"), {C}, false);
    t.add(block(l, "ln2.bias"), {C}, false);
    t.add(block(l, "mlp.fc.weight"), {4 * C, C});
    t.add(block(l, "mlp.fc.bias"), {4 * C}, false);
    t.add(block(l, "mlp.proj.weight"), {C, 4 * C});
    t.add(block(l, "mlp.proj.bias"), {C}, false);
  }
  t.add("ln_f.weight", {C}, false);
  t.add("ln_f.bias", {C}, false);
  if (!c.tied_lm_head) t.add("lm_head.weight", {V, C});
  return t;
}

std::vector<float> gpt_init(const GPTConfig& c, std::uint64_t seed) {
  const TensorTable table = gpt_tensor_table(c);
  std::vector<float> out(table.num_elements());
  std::mt19937_64 rng(seed);
  // Box-Muller on 53-bit uniforms: the same numbers from every standard library.
  const auto uniform = [&rng] { return (static_cast<double>(rng() >> 11) + 0.5) * 0x1p-53; };
  const auto normal = [&uniform] {
    return std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform());
  };
  const double residual_std = 0.02 / std::sqrt(2.0 * c.num_layers);
  for (const TensorInfo& t : table.tensors()) {
    float* x = out.data() + t.offset;
    if (ends_with(t.name, ".bias")) {
      std::fill(x, x + t.numel, 0.0f);
    } else if (t.name.find("ln") != std::string::npos && t.shape.size() == 1) {
      std::fill(x, x + t.numel, 1.0f);
    } else {
      // The projections that write into the residual stream are scaled so that its variance
      // does not grow with depth (GPT-2).
      const double std = ends_with(t.name, "proj.weight") ? residual_std : 0.02;
      for (index_t i = 0; i < t.numel; ++i) x[i] = static_cast<float>(std * normal());
    }
  }
  return out;
}

GPTParams point_gpt_params(const GPTConfig& config, const TensorTable& table, const Kokkos::View<float*>& flat) {
  auto at = [&](const std::string& name) {
    const TensorInfo& t = table[table.index_of(name)];
    return GPTParams::Span(flat.data() + t.offset, t.numel);
  };
  GPTParams p;
  p.wte = at("wte.weight");
  p.wpe = at("wpe.weight");
  for (int l = 0; l < config.num_layers; ++l) {
    p.blocks.push_back({at(block(l, "ln1.weight")), at(block(l, "ln1.bias")), at(block(l, "attn.qkv.weight")),
                        at(block(l, "attn.qkv.bias")), at(block(l, "attn.proj.weight")),
                        at(block(l, "attn.proj.bias")), at(block(l, "ln2.weight")), at(block(l, "ln2.bias")),
                        at(block(l, "mlp.fc.weight")), at(block(l, "mlp.fc.bias")), at(block(l, "mlp.proj.weight")),
                        at(block(l, "mlp.proj.bias"))});
  }
  p.lnf_w = at("ln_f.weight");
  p.lnf_b = at("ln_f.bias");
  p.lm_head = config.tied_lm_head ? p.wte : at("lm_head.weight");
  return p;
}

GPT::GPT(const GPTConfig& config, int batch, int seq_len, const Exec& space)
    : config_(config), B_(batch), T_(seq_len), space_(space), table_(gpt_tensor_table(config)) {
  PULSE_CHECK(batch > 0, "model: batch must be positive, got " + std::to_string(batch));
  PULSE_CHECK(seq_len > 0 && seq_len <= config.max_seq_len,
              "model: seq_len " + std::to_string(seq_len) + " is outside 1.." + std::to_string(config.max_seq_len));
  const index_t BT = index_t(B_) * T_, C = config.channels, NH = config.num_heads, V = config.vocab_size;
  TensorTable& a = act_table_;
  a.add("encoded", {BT, C});
  for (int l = 0; l < config.num_layers; ++l) {
    a.add(block(l, "ln1"), {BT, C});
    a.add(block(l, "ln1_mean"), {BT});
    a.add(block(l, "ln1_rstd"), {BT});
    a.add(block(l, "qkv"), {BT, 3 * C});
    a.add(block(l, "att"), {index_t(B_), NH, index_t(T_), index_t(T_)});
    a.add(block(l, "atty"), {BT, C});
    a.add(block(l, "attproj"), {BT, C});
    a.add(block(l, "res2"), {BT, C});
    a.add(block(l, "ln2"), {BT, C});
    a.add(block(l, "ln2_mean"), {BT});
    a.add(block(l, "ln2_rstd"), {BT});
    a.add(block(l, "fch"), {BT, 4 * C});
    a.add(block(l, "fch_gelu"), {BT, 4 * C});
    a.add(block(l, "fcproj"), {BT, C});
    a.add(block(l, "res3"), {BT, C});
  }
  a.add("lnf", {BT, C});
  a.add("lnf_mean", {BT});
  a.add("lnf_rstd", {BT});
  a.add("logits", {BT, V});
  a.add("probs", {BT, V});
  a.add("losses", {BT});

  weights_ = Kokkos::View<float*>("pulse::gpt::weights", table_.num_elements());
  grads_ = Kokkos::View<float*>("pulse::gpt::grads", table_.num_elements());
  acts_ = Kokkos::View<float*>("pulse::gpt::acts", act_table_.num_elements());
  grad_acts_ = Kokkos::View<float*>("pulse::gpt::grad_acts", act_table_.num_elements());
  logprobs_ = Kokkos::View<float*>("pulse::gpt::target_logprobs", BT);
  w_ = point_gpt_params(config_, table_, weights_);
  g_ = point_gpt_params(config_, table_, grads_);
  a_ = point_acts(acts_);
  ga_ = point_acts(grad_acts_);
}

GPT::Acts GPT::point_acts(const Kokkos::View<float*>& flat) const {
  auto at = [&](const std::string& name) {
    const TensorInfo& t = act_table_[act_table_.index_of(name)];
    return Span(flat.data() + t.offset, t.numel);
  };
  Acts a;
  a.encoded = at("encoded");
  for (int l = 0; l < config_.num_layers; ++l) {
    a.blocks.push_back({at(block(l, "ln1")), at(block(l, "ln1_mean")), at(block(l, "ln1_rstd")), at(block(l, "qkv")),
                        at(block(l, "att")), at(block(l, "atty")), at(block(l, "attproj")), at(block(l, "res2")),
                        at(block(l, "ln2")), at(block(l, "ln2_mean")), at(block(l, "ln2_rstd")), at(block(l, "fch")),
                        at(block(l, "fch_gelu")), at(block(l, "fcproj")), at(block(l, "res3"))});
  }
  a.lnf = at("lnf");
  a.lnf_mean = at("lnf_mean");
  a.lnf_rstd = at("lnf_rstd");
  a.logits = at("logits");
  a.probs = at("probs");
  a.losses = at("losses");
  return a;
}

void GPT::set_weights(const Kokkos::View<const bf16_bits*>& weights) {
  PULSE_CHECK(weights.extent(0) == std::size_t(table_.num_elements()),
              "model: set_weights got " + std::to_string(weights.extent(0)) + " values for " +
                  std::to_string(table_.num_elements()) + " parameters");
  cast_to_float(space_, weights, weights_);
}

namespace detail {

// A free function, not a private member: CUDA forbids device lambdas in private members.
void check_ids(const DefaultExec& space, const Kokkos::View<const int*>& ids, index_t expected, int vocab,
               const char* what) {
  PULSE_CHECK(ids.extent(0) == std::size_t(expected), std::string("model: ") + what + " holds " +
                                                          std::to_string(ids.extent(0)) +
                                                          " ids, expected batch*seq_len = " + std::to_string(expected));
  index_t bad = 0;
  Kokkos::parallel_reduce(
      "pulse::gpt::check_ids", FlatPolicy<DefaultExec>(space, 0, ids.extent(0)),
      KOKKOS_LAMBDA(const index_t i, index_t& n) { n += (ids(i) < 0 || ids(i) >= vocab) ? 1 : 0; }, bad);
  PULSE_CHECK(bad == 0, std::string("model: ") + std::to_string(bad) + " of the " + what +
                            " are outside the vocabulary 0.." + std::to_string(vocab - 1));
}

}  // namespace detail

float GPT::forward(const Kokkos::View<const int*>& tokens, const Kokkos::View<const int*>& targets) {
  detail::check_ids(space_, tokens, index_t(B_) * T_, config_.vocab_size, "tokens");
  if (targets.extent(0) != 0) detail::check_ids(space_, targets, index_t(B_) * T_, config_.vocab_size, "targets");
  tokens_ = tokens;
  targets_ = targets;
  const int B = B_, T = T_, C = config_.channels, NH = config_.num_heads, V = config_.vocab_size;
  const index_t BT = index_t(B) * T, BTC = BT * C;

  embedding_forward(space_, a_.encoded, tokens, w_.wte, w_.wpe, B, T, C);
  Span x = a_.encoded;  // the residual stream entering the block
  for (int l = 0; l < config_.num_layers; ++l) {
    const BlockParams& p = w_.blocks[l];
    const BlockActs& a = a_.blocks[l];
    layernorm_forward(space_, a.ln1, a.ln1_mean, a.ln1_rstd, x, p.ln1_w, p.ln1_b, BT, C);
    matmul_forward(space_, a.qkv, a.ln1, p.qkv_w, p.qkv_b, BT, C, 3 * C);
    attention_forward(space_, a.atty, a.att, a.qkv, B, T, C, NH);
    matmul_forward(space_, a.attproj, a.atty, p.attn_proj_w, p.attn_proj_b, BT, C, C);
    residual_forward(space_, a.res2, x, a.attproj, BTC);
    layernorm_forward(space_, a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2_w, p.ln2_b, BT, C);
    matmul_forward(space_, a.fch, a.ln2, p.fc_w, p.fc_b, BT, C, 4 * C);
    gelu_forward(space_, a.fch_gelu, a.fch, BT * 4 * C);
    matmul_forward(space_, a.fcproj, a.fch_gelu, p.mlp_proj_w, p.mlp_proj_b, BT, 4 * C, C);
    residual_forward(space_, a.res3, a.res2, a.fcproj, BTC);
    x = a.res3;
  }
  layernorm_forward(space_, a_.lnf, a_.lnf_mean, a_.lnf_rstd, x, w_.lnf_w, w_.lnf_b, BT, C);
  matmul_forward(space_, a_.logits, a_.lnf, w_.lm_head, Span(), BT, C, V);
  if (temperature_ != 1.0f) {
    const Span logits = a_.logits;
    const float t = temperature_;
    Kokkos::parallel_for(
        "pulse::gpt::temperature", FlatPolicy<Exec>(space_, 0, BT * V),
        KOKKOS_LAMBDA(const index_t i) { logits(i) = logits(i) / t; });
  }
  if (targets.extent(0) == 0) return -1.0f;

  cross_entropy_forward(space_, a_.losses, a_.probs, a_.logits, targets, BT, V);
  const Span losses = a_.losses;
  const Kokkos::View<float*> logprobs = logprobs_;
  Kokkos::parallel_for(
      "pulse::gpt::target_logprobs", FlatPolicy<Exec>(space_, 0, BT),
      KOKKOS_LAMBDA(const index_t i) { logprobs(i) = -losses(i); });
  // Summed on the host in position order: a parallel reduction's order (and so its last bits)
  // would follow the thread count. BT floats cross, not the logits.
  const auto host_losses = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), losses);
  accum_t sum = 0;
  for (index_t i = 0; i < BT; ++i) sum += host_losses(i);
  return static_cast<float>(sum / BT);
}

void GPT::set_temperature(float t) {
  PULSE_CHECK(t > 0 && std::isfinite(t), "model: temperature must be finite and > 0, got " + std::to_string(t));
  temperature_ = t;
}

void GPT::zero_grad() { Kokkos::deep_copy(space_, grads_, 0.0f); }

void GPT::backward() {
  PULSE_CHECK(targets_.extent(0) != 0, "model: backward() needs a forward() with targets");
  // The layer backwards accumulate, so activation gradients start from zero every time.
  Kokkos::deep_copy(space_, grad_acts_, 0.0f);
  Kokkos::deep_copy(space_, ga_.losses, 1.0f / static_cast<float>(index_t(B_) * T_));  // d(mean)/d(loss_i)
  backward_from_loss_weights();
}

void GPT::backward(const Kokkos::View<const float*>& position_weights) {
  PULSE_CHECK(targets_.extent(0) != 0, "model: backward(weights) needs a forward() with targets");
  PULSE_CHECK(position_weights.extent(0) == std::size_t(B_) * T_,
              "model: backward got " + std::to_string(position_weights.extent(0)) +
                  " position weights, expected batch*seq_len = " + std::to_string(std::size_t(B_) * T_));
  Kokkos::deep_copy(space_, grad_acts_, 0.0f);
  Kokkos::deep_copy(space_, ga_.losses, position_weights);
  backward_from_loss_weights();
}

void GPT::backward_from_loss_weights() {
  const int B = B_, T = T_, C = config_.channels, NH = config_.num_heads, V = config_.vocab_size;
  const index_t BT = index_t(B) * T, BTC = BT * C;
  cross_entropy_backward(space_, ga_.logits, ga_.losses, a_.probs, targets_, BT, V);
  if (temperature_ != 1.0f) {  // d(l / t)/dl = 1/t
    const Span dlogits = ga_.logits;
    const float t = temperature_;
    Kokkos::parallel_for(
        "pulse::gpt::temperature_backward", FlatPolicy<Exec>(space_, 0, BT * V),
        KOKKOS_LAMBDA(const index_t i) { dlogits(i) = dlogits(i) / t; });
  }
  matmul_backward(space_, ga_.lnf, g_.lm_head, Span(), ga_.logits, a_.lnf, w_.lm_head, BT, C, V);
  const int L = config_.num_layers;
  layernorm_backward(space_, ga_.blocks[L - 1].res3, g_.lnf_w, g_.lnf_b, ga_.lnf, a_.blocks[L - 1].res3, w_.lnf_w,
                     a_.lnf_mean, a_.lnf_rstd, BT, C);
  for (int l = L - 1; l >= 0; --l) {
    const BlockParams& p = w_.blocks[l];
    const BlockParams& gp = g_.blocks[l];
    const BlockActs& a = a_.blocks[l];
    const BlockActs& ga = ga_.blocks[l];
    const Span x = l == 0 ? a_.encoded : a_.blocks[l - 1].res3;
    const Span dx = l == 0 ? ga_.encoded : ga_.blocks[l - 1].res3;
    residual_backward(space_, ga.res2, ga.fcproj, ga.res3, BTC);
    matmul_backward(space_, ga.fch_gelu, gp.mlp_proj_w, gp.mlp_proj_b, ga.fcproj, a.fch_gelu, p.mlp_proj_w, BT, 4 * C, C);
    gelu_backward(space_, ga.fch, a.fch, ga.fch_gelu, BT * 4 * C);
    matmul_backward(space_, ga.ln2, gp.fc_w, gp.fc_b, ga.fch, a.ln2, p.fc_w, BT, C, 4 * C);
    layernorm_backward(space_, ga.res2, gp.ln2_w, gp.ln2_b, ga.ln2, a.res2, p.ln2_w, a.ln2_mean, a.ln2_rstd, BT, C);
    residual_backward(space_, dx, ga.attproj, ga.res2, BTC);
    matmul_backward(space_, ga.atty, gp.attn_proj_w, gp.attn_proj_b, ga.attproj, a.atty, p.attn_proj_w, BT, C, C);
    attention_backward(space_, ga.qkv, ga.att, ga.atty, a.qkv, a.att, B, T, C, NH);
    matmul_backward(space_, ga.ln1, gp.qkv_w, gp.qkv_b, ga.qkv, a.ln1, p.qkv_w, BT, C, 3 * C);
    layernorm_backward(space_, dx, gp.ln1_w, gp.ln1_b, ga.ln1, x, p.ln1_w, a.ln1_mean, a.ln1_rstd, BT, C);
  }
  embedding_backward(space_, g_.wte, g_.wpe, ga_.encoded, tokens_, B, T, C);
}

Kokkos::View<const float*> GPT::logits() const {
  const TensorInfo& t = act_table_[act_table_.index_of("logits")];
  return Kokkos::subview(acts_, std::make_pair(t.offset, t.offset + t.numel));
}

}  // namespace pulse
