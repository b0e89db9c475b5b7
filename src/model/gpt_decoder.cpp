#include "model/gpt_decoder.hpp"

#include <string>

#include "core/error.hpp"
#include "kernels/attention_decode.hpp"
#include "kernels/bf16.hpp"
#include "kernels/embedding.hpp"
#include "kernels/gelu.hpp"
#include "kernels/layernorm.hpp"
#include "kernels/matmul.hpp"
#include "kernels/residual.hpp"

namespace pulse {

GPTDecoder::GPTDecoder(const GPTConfig& config, int batch, int max_len, const Exec& space)
    : config_(config), B_(batch), max_len_(max_len), space_(space), table_(gpt_tensor_table(config)) {
  PULSE_CHECK(batch > 0, "decoder: batch must be positive, got " + std::to_string(batch));
  PULSE_CHECK(max_len > 0 && max_len <= config.max_seq_len,
              "decoder: max_len " + std::to_string(max_len) + " is outside 1.." + std::to_string(config.max_seq_len));
  const index_t B = B_, C = config.channels, NH = config.num_heads, V = config.vocab_size;
  weights_ = Kokkos::View<float*>("pulse::decoder::weights", table_.num_elements());
  w_ = point_gpt_params(config_, table_, weights_);
  kv_cache_ = Kokkos::View<float*>("pulse::decoder::kv_cache", index_t(config.num_layers) * 2 * B * max_len * C);
  auto act = [](const char* name, index_t n) { return Kokkos::View<float*>(std::string(name), n); };
  x_ = act("pulse::decoder::x", B * C);
  ln_ = act("pulse::decoder::ln", B * C);
  mean_ = act("pulse::decoder::mean", B);
  rstd_ = act("pulse::decoder::rstd", B);
  qkv_ = act("pulse::decoder::qkv", B * 3 * C);
  att_ = act("pulse::decoder::att", B * NH * max_len);
  atty_ = act("pulse::decoder::atty", B * C);
  proj_ = act("pulse::decoder::proj", B * C);
  fch_ = act("pulse::decoder::fch", B * 4 * C);
  fch_gelu_ = act("pulse::decoder::fch_gelu", B * 4 * C);
  logits_ = act("pulse::decoder::logits", B * V);
}

void GPTDecoder::set_weights(const Kokkos::View<const bf16_bits*>& weights) {
  PULSE_CHECK(weights.extent(0) == std::size_t(table_.num_elements()),
              "decoder: set_weights got " + std::to_string(weights.extent(0)) + " values for " +
                  std::to_string(table_.num_elements()) + " parameters");
  cast_to_float(space_, weights, weights_);
}

// Positions past fed_ are never read, so the cache needs no clearing.
void GPTDecoder::reset() { fed_ = 0; }

Kokkos::View<const float*> GPTDecoder::step(const Kokkos::View<const int*>& tokens, int pos) {
  PULSE_CHECK(pos == fed_, "decoder: step at position " + std::to_string(pos) + ", but " + std::to_string(fed_) +
                               " tokens were fed since reset()");
  PULSE_CHECK(pos < max_len_, "decoder: the cache is full (max_len " + std::to_string(max_len_) + ")");
  detail::check_ids(space_, tokens, B_, config_.vocab_size, "tokens");
  const int B = B_, C = config_.channels, NH = config_.num_heads, V = config_.vocab_size, L = config_.num_layers;
  const index_t BC = index_t(B) * C, cache = BC * max_len_;

  embedding_forward_at(space_, Span(x_), tokens, w_.wte, w_.wpe, pos, B, C);
  for (int l = 0; l < L; ++l) {
    const GPTBlockParams& p = w_.blocks[l];
    const Span kcache(kv_cache_.data() + 2 * l * cache, cache), vcache(kv_cache_.data() + (2 * l + 1) * cache, cache);
    layernorm_forward(space_, Span(ln_), Span(mean_), Span(rstd_), Span(x_), p.ln1_w, p.ln1_b, B, C);
    matmul_forward(space_, Span(qkv_), Span(ln_), p.qkv_w, p.qkv_b, B, C, 3 * C);
    kv_cache_append(space_, kcache, vcache, Span(qkv_), B, pos, max_len_, C);
    attention_decode(space_, Span(atty_), Span(att_), Span(qkv_), kcache, vcache, B, pos, max_len_, C, NH);
    matmul_forward(space_, Span(proj_), Span(atty_), p.attn_proj_w, p.attn_proj_b, B, C, C);
    residual_forward(space_, Span(x_), Span(x_), Span(proj_), BC);
    layernorm_forward(space_, Span(ln_), Span(mean_), Span(rstd_), Span(x_), p.ln2_w, p.ln2_b, B, C);
    matmul_forward(space_, Span(fch_), Span(ln_), p.fc_w, p.fc_b, B, C, 4 * C);
    gelu_forward(space_, Span(fch_gelu_), Span(fch_), index_t(B) * 4 * C);
    matmul_forward(space_, Span(proj_), Span(fch_gelu_), p.mlp_proj_w, p.mlp_proj_b, B, 4 * C, C);
    residual_forward(space_, Span(x_), Span(x_), Span(proj_), BC);
  }
  layernorm_forward(space_, Span(ln_), Span(mean_), Span(rstd_), Span(x_), w_.lnf_w, w_.lnf_b, B, C);
  matmul_forward(space_, Span(logits_), Span(ln_), w_.lm_head, Span(), B, C, V);
  ++fed_;
  return logits_;
}

}  // namespace pulse
