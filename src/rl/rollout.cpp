#include "rl/rollout.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.hpp"
#include "kernels/cross_entropy.hpp"
#include "kernels/host_copy.hpp"
#include "rl/counter_rng.hpp"

namespace pulse {

namespace {

constexpr char rollout_magic[8] = {'P', 'U', 'L', 'S', 'E', 'R', 'B', '1'};
constexpr std::size_t header_bytes = sizeof(rollout_magic) + 3 * sizeof(std::int32_t) + sizeof(std::uint64_t);
// Each position carries tokens, targets, mask and old_logprobs.
constexpr std::size_t bytes_per_position = 2 * sizeof(std::int32_t) + sizeof(std::uint8_t) + sizeof(float);

// A draw from softmax(logits) given a uniform u (greedy: the argmax, first of ties), and its
// log-probability in the trainer's arithmetic (row_target_logprob). sample_rollouts hands it the
// logits already divided by the temperature in float, as GPT::set_temperature divides them, so
// the trainer's logprob of the same row is the same bits.
struct Draw {
  int token;
  float logprob;
};

Draw draw_token(const float* logits, int V, bool greedy, double u) {
  double mx = -std::numeric_limits<double>::infinity();
  int argmax = 0;
  for (int v = 0; v < V; ++v)
    if (logits[v] > mx) mx = logits[v], argmax = v;
  int token = argmax;
  if (!greedy) {
    double z = 0;
    for (int v = 0; v < V; ++v) z += std::exp(logits[v] - mx);
    // Inverse CDF on the unnormalised weights; the last positive weight takes rounding's tail.
    const double target = u * z;
    double cumulative = 0;
    for (int v = 0; v < V; ++v) {
      const double p = std::exp(logits[v] - mx);
      if (p <= 0) continue;
      token = v;
      cumulative += p;
      if (cumulative > target) break;
    }
  }
  return {token, row_target_logprob(logits, V, token)};
}

template <class T>
void put(std::vector<std::uint8_t>& out, const T* values, std::size_t count) {
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(values);
  out.insert(out.end(), bytes, bytes + count * sizeof(T));
}

template <class T>
void take(const std::uint8_t*& cursor, T* values, std::size_t count) {
  std::memcpy(values, cursor, count * sizeof(T));
  cursor += count * sizeof(T);
}

}  // namespace

std::vector<std::uint8_t> RolloutBatch::serialize() const {
  const std::size_t n = std::size_t(rows) * seq_len;
  PULSE_CHECK(rows >= 0 && seq_len > 0 && group_size > 0 && rows % group_size == 0,
              "rollout batch: rows " + std::to_string(rows) + ", seq_len " + std::to_string(seq_len) +
                  ", group_size " + std::to_string(group_size) + " are inconsistent");
  PULSE_CHECK(tokens.size() == n && targets.size() == n && completion_mask.size() == n && old_logprobs.size() == n &&
                  rewards.size() == std::size_t(rows),
              "rollout batch: array sizes do not match rows x seq_len = " + std::to_string(n));
  std::vector<std::uint8_t> out;
  out.reserve(header_bytes + n * bytes_per_position + rewards.size() * sizeof(float));
  put(out, rollout_magic, sizeof(rollout_magic));
  const std::int32_t dims[3] = {rows, seq_len, group_size};
  put(out, dims, 3);
  put(out, &policy_version, 1);
  put(out, tokens.data(), n);
  put(out, targets.data(), n);
  put(out, completion_mask.data(), n);
  put(out, old_logprobs.data(), n);
  put(out, rewards.data(), rewards.size());
  return out;
}

RolloutBatch RolloutBatch::deserialize(const std::uint8_t* data, std::size_t size) {
  PULSE_CHECK(data != nullptr || size == 0, "rollout batch: null data");
  PULSE_CHECK(size >= header_bytes, "rollout batch: " + std::to_string(size) + " bytes is shorter than the header");
  PULSE_CHECK(std::memcmp(data, rollout_magic, sizeof(rollout_magic)) == 0, "rollout batch: bad magic (not PULSERB1)");
  const std::uint8_t* cursor = data + sizeof(rollout_magic);
  std::int32_t dims[3];
  take(cursor, dims, 3);
  RolloutBatch b;
  b.rows = dims[0], b.seq_len = dims[1], b.group_size = dims[2];
  take(cursor, &b.policy_version, 1);
  PULSE_CHECK(b.rows >= 0 && b.seq_len > 0 && b.group_size > 0 && b.rows % b.group_size == 0,
              "rollout batch: bad header (rows " + std::to_string(b.rows) + ", seq_len " + std::to_string(b.seq_len) +
                  ", group_size " + std::to_string(b.group_size) + ")");
  // Both factors are below 2^31, so the products fit in 64 bits: no overflow before the check.
  const std::size_t n = std::size_t(b.rows) * std::size_t(b.seq_len);
  const std::size_t expected = header_bytes + n * bytes_per_position + std::size_t(b.rows) * sizeof(float);
  PULSE_CHECK(size == expected, "rollout batch: " + std::to_string(size) + " bytes, but the header needs " +
                                    std::to_string(expected) + " (truncated or trailing data)");
  b.tokens.resize(n);
  b.targets.resize(n);
  b.completion_mask.resize(n);
  b.old_logprobs.resize(n);
  b.rewards.resize(b.rows);
  take(cursor, b.tokens.data(), n);
  take(cursor, b.targets.data(), n);
  take(cursor, b.completion_mask.data(), n);
  take(cursor, b.old_logprobs.data(), n);
  take(cursor, b.rewards.data(), b.rewards.size());
  for (std::size_t i = 0; i < n; ++i) {
    PULSE_CHECK(b.tokens[i] >= 0 && b.targets[i] >= 0,
                "rollout batch: negative token id at position " + std::to_string(i));
    PULSE_CHECK(b.completion_mask[i] <= 1, "rollout batch: completion mask value " +
                                               std::to_string(b.completion_mask[i]) + " at position " +
                                               std::to_string(i) + " is not 0 or 1");
  }
  return b;
}

RolloutBatch sample_rollouts(GPTDecoder& decoder, const CharTokenizer& tok, const AdditionTask& task,
                             const std::vector<AdditionProblem>& prompts, int group_size, int seq_len,
                             const SamplingOptions& options) {
  PULSE_CHECK(group_size > 0, "rollouts: group_size must be positive, got " + std::to_string(group_size));
  PULSE_CHECK(seq_len > 0 && seq_len <= decoder.max_len(),
              "rollouts: seq_len " + std::to_string(seq_len) + " is outside 1..decoder max_len " +
                  std::to_string(decoder.max_len()));
  PULSE_CHECK(decoder.config().vocab_size == tok.vocab_size(),
              "rollouts: the model's vocabulary (" + std::to_string(decoder.config().vocab_size) +
                  ") is not the tokenizer's (" + std::to_string(tok.vocab_size()) + ")");
  PULSE_CHECK(options.temperature >= 0 && std::isfinite(options.temperature),
              "rollouts: temperature must be finite and >= 0, got " + std::to_string(options.temperature));
  PULSE_CHECK(options.max_new_tokens >= 0, "rollouts: max_new_tokens must be >= 0");
  RolloutBatch out;
  out.rows = static_cast<int>(prompts.size()) * group_size;
  out.seq_len = seq_len;
  out.group_size = group_size;
  const std::size_t n = std::size_t(out.rows) * seq_len;
  out.tokens.assign(n, tok.eos());
  out.targets.assign(n, tok.eos());
  out.completion_mask.assign(n, 0);
  out.old_logprobs.assign(n, 0.0f);
  out.rewards.assign(out.rows, 0.0f);

  const int B = decoder.batch(), V = tok.vocab_size(), eos = tok.eos();
  const bool greedy = options.temperature == 0.0f;
  std::vector<std::vector<int>> prompt_ids(prompts.size());
  for (std::size_t p = 0; p < prompts.size(); ++p) {
    prompt_ids[p] = tok.encode(prompts[p].prompt);
    PULSE_CHECK(!prompt_ids[p].empty() && int(prompt_ids[p].size()) <= seq_len,
                "rollouts: prompt '" + prompts[p].prompt + "' does not leave room for a completion in seq_len " +
                    std::to_string(seq_len));
  }
  Kokkos::View<int*> step_tokens("pulse::rollouts::step_tokens", B);
  auto step_tokens_h = Kokkos::create_mirror_view(step_tokens);
  for (int first = 0; first < out.rows; first += B) {
    const int active = std::min(B, out.rows - first);
    // text[b]: seq_len + 1 characters, the inputs and the last target.
    std::vector<std::vector<int>> text(active, std::vector<int>(seq_len + 1, eos));
    std::vector<int> prompt_len(active), last(active);
    std::vector<bool> done(active, false);
    for (int b = 0; b < active; ++b) {
      const std::vector<int>& ids = prompt_ids[(first + b) / group_size];
      std::copy(ids.begin(), ids.end(), text[b].begin());
      prompt_len[b] = static_cast<int>(ids.size());
      last[b] = options.max_new_tokens > 0 ? std::min(seq_len, prompt_len[b] + options.max_new_tokens - 1) : seq_len;
    }
    decoder.reset();
    int remaining = active;
    for (int pos = 0; pos < seq_len && remaining > 0; ++pos) {
      for (int b = 0; b < B; ++b) step_tokens_h(b) = b < active ? text[b][pos] : eos;
      Kokkos::deep_copy(step_tokens, step_tokens_h);
      std::vector<float> logits = to_host(decoder.step(step_tokens, pos));
      // The policy's logits: over the temperature (greedy draws score at temperature 1).
      if (!greedy && options.temperature != 1.0f)
        for (float& l : logits) l /= options.temperature;
      for (int b = 0; b < active; ++b) {
        if (done[b] || pos + 1 < prompt_len[b]) continue;  // finished, or still reading the prompt
        const std::uint64_t row = options.first_row + std::uint64_t(first + b);
        const Draw d = draw_token(logits.data() + std::size_t(b) * V, V, greedy,
                                  counter_uniform(options.seed, row, std::uint64_t(pos + 1)));
        text[b][pos + 1] = d.token;
        const std::size_t i = std::size_t(first + b) * seq_len + pos;
        out.completion_mask[i] = 1;
        out.old_logprobs[i] = d.logprob;
        if (d.token == eos || pos + 1 == last[b]) done[b] = true, --remaining;
      }
    }
    for (int b = 0; b < active; ++b) {
      const std::size_t row = std::size_t(first + b);
      std::copy(text[b].begin(), text[b].end() - 1, out.tokens.begin() + row * seq_len);
      std::copy(text[b].begin() + 1, text[b].end(), out.targets.begin() + row * seq_len);
      out.rewards[row] =
          static_cast<float>(task.reward(prompts[row / group_size], completion_text(out, tok, static_cast<int>(row))));
    }
  }
  return out;
}

double greedy_pass_at_1(GPTDecoder& decoder, const CharTokenizer& tok, const AdditionTask& task,
                        const std::vector<AdditionProblem>& problems, int seq_len) {
  PULSE_CHECK(!problems.empty(), "greedy_pass_at_1: no problems");
  SamplingOptions greedy;
  greedy.temperature = 0;
  const RolloutBatch b = sample_rollouts(decoder, tok, task, problems, 1, seq_len, greedy);
  double solved = 0;
  for (float r : b.rewards) solved += r;
  return solved / problems.size();
}

std::string completion_text(const RolloutBatch& batch, const CharTokenizer& tok, int row) {
  PULSE_CHECK(row >= 0 && row < batch.rows, "completion_text: row " + std::to_string(row) + " is outside 0.." +
                                                std::to_string(batch.rows - 1));
  std::vector<int> ids;
  for (int t = 0; t < batch.seq_len; ++t) {
    const std::size_t i = std::size_t(row) * batch.seq_len + t;
    if (batch.completion_mask[i]) ids.push_back(batch.targets[i]);
  }
  return tok.decode(ids);
}

}  // namespace pulse
