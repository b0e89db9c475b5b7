#pragma once
// Supervised training from scratch on the addition task: the GPT learns to continue "a+b=" with
// "c$" from complete "a+b=c$" rows, with a cross-entropy loss over the answer and its eos only
// (answer_only; the operands are random and the padding trivial, so they would only dilute the
// signal) or over every position. Mixed-precision AdamW (beta2 0.95) on an FP32 master, forward
// and backward on bf16(master), gradients clipped to norm 1, linear warm-up then cosine decay to
// lr/10 at options.steps. pulse-sft runs it to a checkpoint; pulse-train uses it as a warm start.
// Deterministic: the same config and options give bit-identical weights.
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor_table.hpp"
#include "kernels/segments.hpp"
#include "kernels/types.hpp"
#include "model/gpt.hpp"
#include "rl/task.hpp"
#include "rl/tokenizer.hpp"

namespace pulse {

struct SftOptions {
  int digits = 2;      // operands have up to this many digits
  int batch = 32;      // rows per step
  double lr = 1e-3;    // peak learning rate
  int warmup = 100;    // linear warm-up steps; the trainer uses min(warmup, max(1, steps / 10))
  int steps = 3000;    // length of the schedule (step() past it keeps lr/10)
  double weight_decay = 0.1;  // on matrices and embeddings (the tensor table's mask)
  bool answer_only = true;    // loss on the answer and its eos only, else on every position
  std::uint64_t seed = 1;     // of the initial weights and of the training problems
};

// The learning rate of 1-based step under options (warm-up as given, not clamped).
double sft_learning_rate(const SftOptions& options, int step);

// One row of T inputs and T targets: "a+b=c$" shifted by one, padded with eos. in_loss[t] is 1
// where position t enters the loss: with answer_only the targets that are the answer's
// characters or its eos, otherwise every position. Evaluation encodes rows the same way.
void encode_sft_row(const CharTokenizer& tok, const AdditionTask& task, const AdditionProblem& problem,
                    bool answer_only, int T, int* tokens, int* targets, float* in_loss);
// Normalises in_loss into the weights of a mean over the positions in the loss.
std::vector<float> mean_loss_weights(std::vector<float> in_loss);
// sum_i weights_i * CE_i of the model's last forward (with targets).
double weighted_loss(const GPT& model, const std::vector<float>& weights);

class SftTrainer {
 public:
  // Starts from gpt_init(config, seed); config.vocab_size must equal the arithmetic tokenizer's
  // and the longest "a+b=c$" of options.digits must fit in config.max_seq_len. Problems in
  // held_out ((a, b) pairs) are never trained on, provided they cover at most a quarter of the
  // problem space; a larger set would leave too little to train on and is ignored (see
  // excludes_held_out()), as pulse-sft has always done for 1-digit runs. Holds Kokkos views:
  // destroy it before Kokkos::finalize.
  SftTrainer(const GPTConfig& config, const SftOptions& options,
             const std::set<std::pair<std::int64_t, std::int64_t>>& held_out = {});
  SftTrainer(const SftTrainer&) = delete;
  SftTrainer& operator=(const SftTrainer&) = delete;

  // One optimizer step (the 1-based count is steps_done() + 1); returns the training loss of the
  // batch before the update. Throws pulse::Error when the loss or the gradient norm is not
  // finite, before touching the weights.
  double step();
  int steps_done() const { return steps_done_; }

  Kokkos::View<const bf16_bits*> weights() const { return weights_; }  // bf16(master), table order
  Kokkos::View<const float*> master() const { return master_; }        // the FP32 master weights
  const GPT& model() const { return model_; }
  const TensorTable& table() const { return model_.table(); }
  const GPTConfig& config() const { return model_.config(); }
  // The options in effect: warmup clamped to max(1, steps / 10).
  const SftOptions& options() const { return options_; }
  int seq_len() const { return model_.seq_len(); }  // T: the longest "a+b=c$" minus one
  bool excludes_held_out() const { return exclude_; }
  // The problems of the last step's batch, in row order (empty before the first step).
  const std::vector<AdditionProblem>& last_batch() const { return batch_problems_; }

 private:
  SftOptions options_;
  CharTokenizer tok_;
  AdditionTask task_;
  std::set<std::pair<std::int64_t, std::int64_t>> held_out_;
  bool exclude_;
  GPT model_;
  TensorSegments<> segs_;
  Kokkos::View<std::uint8_t*> decay_mask_;
  Kokkos::View<float*> master_, m_, v_;
  Kokkos::View<bf16_bits*> weights_;
  int steps_done_ = 0;
  std::vector<AdditionProblem> batch_problems_;
  std::vector<int> tokens_h_, targets_h_;
  std::vector<float> in_loss_h_;
};

// Writes trainer.weights() in BF16 under the tensor table's names, with pulse-sft's metadata
// (program, version, model_name, the config, the alphabet, digits, steps done), atomically.
void write_sft_checkpoint(const std::string& path, const SftTrainer& trainer, const std::string& model_name);

}  // namespace pulse
