#pragma once
// A small GPT-2-style decoder, llm.c's train_gpt2 in Kokkos: token + position embeddings,
// pre-norm blocks (LayerNorm, causal multi-head attention, LayerNorm, GELU MLP of width 4C, each
// added to the residual stream), a final LayerNorm and an LM head, mean cross-entropy loss.
//
// Parameters live in one flat FP32 buffer laid out by the tensor table (names as Hugging Face
// would spell them: "wte.weight", "blocks.0.attn.qkv.weight", "ln_f.bias", ...). Linear weights
// are [out, in] as in torch.nn.Linear. The forward pass computes with bf16(theta): set_weights()
// takes the BF16 bit patterns and widens them to FP32 compute weights, so what the model sees is
// exactly what an inference engine holding the BF16 weights sees. Gradients are FP32 in a second
// flat buffer with the same table; activations and their gradients are flat buffers too.
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor_table.hpp"
#include "kernels/types.hpp"
#include "model/gpt_params.hpp"

namespace pulse {

struct GPTConfig {
  int vocab_size = 256;
  int max_seq_len = 64;  // rows of wpe: the longest sequence the model accepts
  int num_layers = 4;
  int num_heads = 4;
  int channels = 64;  // must be a multiple of num_heads
  // true: logits = ln_f(x) @ wte^T, the embedding doubles as the LM head (GPT-2, Qwen2.5-0.5B);
  // false: a separate "lm_head.weight" [vocab, channels] (larger Qwen2.5 models).
  bool tied_lm_head = true;
};

// "tiny" (0.22M parameters), "small" (1.04M), "base" (4.87M); vocabulary 256.
GPTConfig gpt_preset(const std::string& name);
// Throws pulse::Error naming the first bad field.
void validate(const GPTConfig& config);
// Every parameter tensor in forward order; weight decay on for matrices and embeddings, off for
// LayerNorm parameters and biases.
TensorTable gpt_tensor_table(const GPTConfig& config);
// GPT-2 initialisation as a flat FP32 host buffer in table order: matrices and embeddings
// N(0, 0.02), the two projections into the residual stream N(0, 0.02/sqrt(2 layers)), biases 0,
// LayerNorm weights 1. Deterministic in the seed (mt19937_64 + Box-Muller, no std:: distributions).
std::vector<float> gpt_init(const GPTConfig& config, std::uint64_t seed);

class GPT {
 public:
  using Exec = DefaultExec;
  using Span = FloatSpan<Exec>;

  // Activations are sized for exactly batch sequences of seq_len tokens (seq_len <= max_seq_len).
  GPT(const GPTConfig& config, int batch, int seq_len, const Exec& space = Exec());
  GPT(const GPT&) = delete;
  GPT& operator=(const GPT&) = delete;

  const GPTConfig& config() const { return config_; }
  const TensorTable& table() const { return table_; }
  int batch() const { return B_; }
  int seq_len() const { return T_; }
  index_t num_parameters() const { return table_.num_elements(); }

  // Loads the compute weights from BF16 bit patterns (table order).
  void set_weights(const Kokkos::View<const bf16_bits*>& weights);
  // The policy's sampling temperature: forward() scores softmax(logits / t), as the sampler
  // draws (the sampler divides the same float logits by the same t), and backward() follows.
  // 1 (the default) leaves the logits untouched; must be > 0.
  void set_temperature(float t);
  // tokens and targets hold batch * seq_len ids, row-major [B, T]; ids outside the vocabulary
  // throw pulse::Error before any kernel runs. Returns the mean cross entropy over all
  // positions, or -1 when targets is empty (logits only; backward() then throws).
  float forward(const Kokkos::View<const int*>& tokens, const Kokkos::View<const int*>& targets = {});
  void zero_grad();
  // Adds the gradient of the last forward's mean loss to grads().
  void backward();
  // Adds to grads() the gradient of sum_i position_weights(i) * CE_i, CE_i = -log p(target_i),
  // for [B*T] weights (a loss mask, or GRPO's per-token dloss/dCE). backward() is the case
  // where every weight is 1/(B*T).
  void backward(const Kokkos::View<const float*>& position_weights);
  // After forward(tokens, targets): log p(target) at every position, [B*T] (minus the
  // per-position cross entropy).
  Kokkos::View<const float*> target_logprobs() const { return logprobs_; }

  Kokkos::View<const float*> weights() const { return weights_; }  // FP32 values of bf16(theta)
  Kokkos::View<float*> grads() const { return grads_; }
  Kokkos::View<const float*> logits() const;  // [B, T, V] of the last forward (over the temperature)

 private:
  using BlockParams = GPTBlockParams;
  using Params = GPTParams;
  struct BlockActs {
    Span ln1, ln1_mean, ln1_rstd;  // [B,T,C], [B,T], [B,T]
    Span qkv;                      // [B,T,3C]
    Span att;                      // [B,NH,T,T] softmax (in the gradients: scratch for the scores)
    Span atty, attproj, res2;      // [B,T,C]
    Span ln2, ln2_mean, ln2_rstd;  // [B,T,C], [B,T], [B,T]
    Span fch, fch_gelu;            // [B,T,4C]
    Span fcproj, res3;             // [B,T,C]
  };
  struct Acts {  // named views into a flat buffer laid out by act_table_
    Span encoded;  // [B,T,C]
    std::vector<BlockActs> blocks;
    Span lnf, lnf_mean, lnf_rstd;  // [B,T,C], [B,T], [B,T]
    Span logits, probs;            // [B,T,V]
    Span losses;                   // [B,T] (in the gradients: the weight of each loss)
  };
  Acts point_acts(const Kokkos::View<float*>& flat) const;
  // The backward pass from ga_.losses (the weight of each position's loss) down.
  void backward_from_loss_weights();

  GPTConfig config_;
  int B_, T_;
  float temperature_ = 1.0f;
  Exec space_;
  TensorTable table_, act_table_;
  Kokkos::View<float*> weights_, grads_, acts_, grad_acts_;
  Kokkos::View<float*> logprobs_;  // [B*T] -losses of the last forward with targets
  Params w_, g_;
  Acts a_, ga_;
  Kokkos::View<const int*> tokens_, targets_;  // of the last forward, for backward
};

namespace detail {
// Throws pulse::Error unless ids holds expected ids, all in 0..vocab-1 (what names them).
void check_ids(const DefaultExec& space, const Kokkos::View<const int*>& ids, index_t expected, int vocab,
               const char* what);
}  // namespace detail

}  // namespace pulse
