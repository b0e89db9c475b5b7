#pragma once
// Incremental inference for the GPT: the rollout engine of GRPO. Each step() feeds one token per
// sequence and returns the next-token logits, keeping every layer's keys and values in a cache
// so a step costs O(pos) instead of a full forward pass. It computes with FP32 values of BF16
// weights, as GPT does, with the same kernels and the same arithmetic order in attention, and
// every product through pulse::gemm, whose rows do not depend on how many rows share a call: so
// its logits are GPT::forward's on the same sequences bit for bit, at any batch size, on any CPU
// and backend (test_gpt_decoder, test_rollout and test_train_roles assert it).
#include <cstdint>

#include "core/tensor_table.hpp"
#include "kernels/types.hpp"
#include "model/gpt.hpp"
#include "model/gpt_params.hpp"

namespace pulse {

class GPTDecoder {
 public:
  using Exec = DefaultExec;
  using Span = FloatSpan<Exec>;

  // batch sequences of up to max_len tokens (max_len <= config.max_seq_len).
  GPTDecoder(const GPTConfig& config, int batch, int max_len, const Exec& space = Exec());
  GPTDecoder(const GPTDecoder&) = delete;
  GPTDecoder& operator=(const GPTDecoder&) = delete;

  const GPTConfig& config() const { return config_; }
  const TensorTable& table() const { return table_; }
  int batch() const { return B_; }
  int max_len() const { return max_len_; }
  // Number of tokens fed since the last reset().
  int position() const { return fed_; }

  // Loads the compute weights from BF16 bit patterns (table order, as GPT::set_weights).
  void set_weights(const Kokkos::View<const bf16_bits*>& weights);
  // Empties the cache: the next step() is position 0.
  void reset();
  // Feeds one token per row at position pos (== the number of tokens fed since reset, checked)
  // and returns the logits of the next token, [batch, vocab], valid until the next step().
  Kokkos::View<const float*> step(const Kokkos::View<const int*>& tokens, int pos);

 private:
  GPTConfig config_;
  int B_, max_len_, fed_ = 0;
  Exec space_;
  TensorTable table_;
  Kokkos::View<float*> weights_;
  GPTParams w_;
  // Per layer: key and value cache [B,max_len,C] each.
  Kokkos::View<float*> kv_cache_;
  // One step's activations, [B, ...].
  Kokkos::View<float*> x_, ln_, mean_, rstd_, qkv_, att_, atty_, proj_, fch_, fch_gelu_, logits_;
};

}  // namespace pulse
