#pragma once
// GRPO rollouts on the addition task: group_size sampled completions per prompt from the
// decoder's (BF16) weights, their rewards, and the generating policy's log-probabilities, in
// the fixed-length layout the trainer's GPT consumes ([rows, seq_len] tokens and targets).
#include <cstdint>
#include <string>
#include <vector>

#include "model/gpt_decoder.hpp"
#include "rl/task.hpp"
#include "rl/tokenizer.hpp"

namespace pulse {

struct RolloutBatch {
  int rows = 0, seq_len = 0, group_size = 0;  // rows = prompts * group_size; row r is in group r / group_size
  std::uint64_t policy_version = 0;           // version of the weights that generated it (set by caller)
  std::vector<int> tokens, targets;           // [rows * seq_len]: prompt + completion, eos padded; targets = tokens shifted by one
  std::vector<std::uint8_t> completion_mask;  // [rows * seq_len]: 1 where targets[i] is a sampled token (incl. the sampled eos)
  std::vector<float> old_logprobs;            // [rows * seq_len]: generating policy's log p(targets[i]) where mask is 1, else 0
  std::vector<float> rewards;                 // [rows]

  // Little-endian bytes: magic "PULSERB1", rows, seq_len, group_size (int32), policy_version
  // (uint64), then tokens, targets (int32), completion_mask (uint8), old_logprobs, rewards (float32).
  std::vector<std::uint8_t> serialize() const;
  // Checks the header, every size against the byte count before allocating, and the values
  // (ids >= 0, mask 0/1, rows a multiple of group_size); throws pulse::Error naming the problem.
  static RolloutBatch deserialize(const std::uint8_t* data, std::size_t size);
};

struct SamplingOptions {
  float temperature = 1.0f;  // 0: greedy (argmax, first of ties)
  int max_new_tokens = 0;    // 0: until eos or seq_len
  std::uint64_t seed = 0;
  // Global index of this call's first row: a rank sampling a slice of the prompts passes the
  // slice's first row and draws exactly what one rank sampling everything would.
  std::uint64_t first_row = 0;
};

// Samples group_size completions per prompt with the decoder's weights, decoder.batch() rows at
// a time (decoder.max_len() >= seq_len). Rows advance in lock step, each from the end of its own
// prompt, and stop at eos or when the text fills seq_len + 1 characters (seq_len inputs plus the
// last target). The draw for the token at text position p of global row r is
// counter_uniform(seed, r, p), so results do not depend on batching.
// old_logprobs hold log-softmax(logits / temperature) of the sampled token: the probability of
// the distribution the token was actually drawn from, which the importance ratio of GRPO needs
// (at temperature 1, the paper's setting, it is exactly the trainer's log p on the same weights).
// At temperature 0 the draw is deterministic, and log-softmax(logits) (temperature 1) is stored.
RolloutBatch sample_rollouts(GPTDecoder& decoder, const CharTokenizer& tok, const AdditionTask& task,
                             const std::vector<AdditionProblem>& prompts, int group_size, int seq_len,
                             const SamplingOptions& options);

// Greedy pass@1 on problems with the decoder (chunks of decoder.batch()): the fraction of
// problems whose greedy completion earns reward 1.
double greedy_pass_at_1(GPTDecoder& decoder, const CharTokenizer& tok, const AdditionTask& task,
                        const std::vector<AdditionProblem>& problems, int seq_len);

// The sampled completion of a row (its masked targets), decoded; for logs and examples.
std::string completion_text(const RolloutBatch& batch, const CharTokenizer& tok, int row);

}  // namespace pulse
