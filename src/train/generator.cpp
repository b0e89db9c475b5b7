#include "train/generator.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "comm/collectives.hpp"
#include "core/error.hpp"
#include "rl/task.hpp"

namespace pulse {

namespace {

// splitmix64 of a few words: seeds of problem sets and sampling streams.
std::uint64_t mix(std::uint64_t a, std::uint64_t b, std::uint64_t c = 0) {
  std::uint64_t x = a ^ (b * 0x9E3779B97F4A7C15ull) ^ (c * 0xC2B2AE3D27D4EB4Full);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

Generator::Generator(const TrainConfig& c, const GPTConfig& config, int seq_len, int rank, int num_trainers,
                     std::vector<Communicator> routes)
    : c_(c), seq_len_(seq_len), rank_(rank), num_trainers_(num_trainers),
      rows_per_trainer_(rows_per_trainer(c, num_trainers)), trainer_(rank < num_trainers),
      samples_(c.inference_ranks == 0 ? trainer_ : !trainer_), routes_(std::move(routes)) {
  const char* ahead = std::getenv("PULSE_GENERATE_AHEAD");
  ahead_enabled_ = ahead == nullptr || std::strcmp(ahead, "0") != 0;
  const int parts = c_.inference_ranks ? c_.inference_ranks : num_trainers_;
  if (samples_) decoder_ = std::make_unique<GPTDecoder>(config, c_.prompts_per_step / parts * c_.group_size, seq_len_);
}

RolloutBatch Generator::generate(std::uint64_t generation, int first_prompt, int num_prompts,
                                 const Kokkos::View<const bf16_bits*>& weights) {
  PULSE_CHECK(decoder_ != nullptr, "internal: rank " + std::to_string(rank_) + " does not sample rollouts");
  AdditionTask task(c_.digits, mix(c_.seed, generation, 1));
  std::vector<AdditionProblem> all;
  for (int p = 0; p < c_.prompts_per_step; ++p) all.push_back(task.sample());
  const std::vector<AdditionProblem> mine(all.begin() + first_prompt, all.begin() + first_prompt + num_prompts);
  decoder_->set_weights(weights);
  SamplingOptions options;
  options.temperature = static_cast<float>(c_.temperature);
  options.max_new_tokens = c_.digits + 2;
  options.seed = mix(c_.seed, generation, 2);
  options.first_row = std::uint64_t(first_prompt) * c_.group_size;  // the same draws however prompts are split
  return sample_rollouts(*decoder_, tok_, task, mine, c_.group_size, seq_len_, options);
}

std::uint64_t Generator::rollout_version(std::int64_t t) const {
  return std::uint64_t(std::max<std::int64_t>(0, t - 1 - c_.async_lag));
}

RolloutBatch Generator::sample_share(std::int64_t t, int part, int parts, const Publisher& versions,
                                     const Kokkos::View<const bf16_bits*>& trainer_weights, TransferCounter& copies) {
  const std::uint64_t generation = std::uint64_t(t - 1) / c_.num_iterations;
  const std::uint64_t from_version = rollout_version(t);
  const int per = c_.prompts_per_step / parts;
  Kokkos::View<const bf16_bits*> weights = trainer_weights;
  if (!trainer_ || from_version != versions.version()) weights = copies.to_device(versions.version_weights(from_version));
  RolloutBatch b = generate(generation, part * per, per, weights);
  b.policy_version = from_version;
  return b;
}

void Generator::sample_ahead(std::int64_t t, std::int64_t last_step, const Publisher& versions,
                             TransferCounter& copies) {
  if (!samples_ || trainer_ || !ahead_enabled_) return;
  const std::int64_t next = t + c_.num_iterations - (t - 1) % c_.num_iterations;  // next step with new rollouts
  if (next > last_step || ahead_step_ == next || rollout_version(next) > versions.version()) return;
  ahead_ = sample_share(next, rank_ - num_trainers_, c_.inference_ranks, versions, {}, copies);
  ahead_step_ = next;
}

RolloutBatch Generator::rollouts_for_step(std::int64_t t, const Publisher& versions,
                                          const Kokkos::View<const bf16_bits*>& trainer_weights,
                                          TransferCounter& copies, double& comm_seconds) {
  if (c_.inference_ranks == 0)
    return trainer_ ? sample_share(t, rank_, num_trainers_, versions, trainer_weights, copies) : RolloutBatch{};
  // Each inference rank broadcasts its share over its route (the trainers and itself), so an
  // inference rank receives no other's rollouts.
  std::vector<RolloutBatch> parts;
  for (int i = 0; i < c_.inference_ranks; ++i) {
    const int sender = num_trainers_ + i;
    if (!trainer_ && rank_ != sender) continue;
    const Communicator& route = routes_[i];
    std::vector<std::uint8_t> bytes;
    if (rank_ == sender) {
      bytes = (ahead_step_ == t ? ahead_ : sample_share(t, i, c_.inference_ranks, versions, {}, copies)).serialize();
      ahead_step_ = 0, ahead_ = RolloutBatch{};
    }
    Kokkos::Timer timer;
    std::uint64_t size = bytes.size();
    broadcast(route, as_view(&size, 1), route.size() - 1, Channel::rollouts);
    bytes.resize(size);
    broadcast(route, as_view(bytes.data(), bytes.size()), route.size() - 1, Channel::rollouts);
    comm_seconds += timer.seconds();
    if (trainer_) parts.push_back(RolloutBatch::deserialize(bytes.data(), bytes.size()));
  }
  return trainer_ ? trainer_rows(parts) : RolloutBatch{};
}

RolloutBatch Generator::trainer_rows(const std::vector<RolloutBatch>& parts) const {
  // Inference rank i's prompts are consecutive; trainer j takes its share of the concatenation.
  RolloutBatch out = parts.front();
  out.rows = rows_per_trainer_;
  for (auto* v : {&out.tokens, &out.targets}) v->clear();
  out.completion_mask.clear(), out.old_logprobs.clear(), out.rewards.clear();
  const int first_row = rank_ * rows_per_trainer_;
  int row = 0;
  for (const RolloutBatch& p : parts)
    for (int r = 0; r < p.rows; ++r, ++row) {
      if (row < first_row || row >= first_row + rows_per_trainer_) continue;
      const std::size_t a = std::size_t(r) * p.seq_len, e = a + p.seq_len;
      out.tokens.insert(out.tokens.end(), p.tokens.begin() + a, p.tokens.begin() + e);
      out.targets.insert(out.targets.end(), p.targets.begin() + a, p.targets.begin() + e);
      out.completion_mask.insert(out.completion_mask.end(), p.completion_mask.begin() + a, p.completion_mask.begin() + e);
      out.old_logprobs.insert(out.old_logprobs.end(), p.old_logprobs.begin() + a, p.old_logprobs.begin() + e);
      out.rewards.push_back(p.rewards[r]);
    }
  return out;
}

}  // namespace pulse
