#include "train/publisher.hpp"

#include <string>
#include <utility>

#include "comm/wait.hpp"
#include "core/error.hpp"

namespace pulse {

Publisher::Publisher(const Communicator& sync, const TensorTable& table, const TrainConfig& c, SyncRole role,
                     bool keep_versions)
    : table_(table), role_(role), keep_versions_(role != SyncRole::trainer || (keep_versions && c.async_lag > 0)),
      versions_kept_(std::size_t(c.async_lag) + 1) {
  if (role_ != SyncRole::trainer)
    weight_sync_ = std::make_unique<WeightSync>(sync, table_, c.relay, c.anchor_every, c.keep_anchors);
}

const std::vector<bf16_bits>& Publisher::version_weights(std::uint64_t version) const {
  const std::uint64_t back = version_ - version;
  PULSE_CHECK(back < history_.size(), "internal: weights of version " + std::to_string(version) + " are gone");
  return history_[history_.size() - 1 - back];
}

void Publisher::remember_version(std::vector<bf16_bits> weights) {
  history_.push_back(std::move(weights));
  while (history_.size() > versions_kept_) history_.pop_front();
}

void Publisher::start(std::vector<bf16_bits> weights, bool resumed) {
  // Every fresh history that is kept starts with trainer 0's weights (kept in checkpoints).
  if (role_ != SyncRole::receiver && keep_versions_ && !resumed) remember_version(weights);
  if (role_ == SyncRole::receiver) weights.assign(table_.num_elements(), 0);
  if (weight_sync_) weight_sync_->bootstrap(version_, weights);  // receivers start from trainer 0's bytes
  if (role_ != SyncRole::receiver) return;
  PULSE_CHECK(!resumed || history_.empty() || history_.back() == weights,
              "--resume: this inference rank's checkpoint does not match trainer 0's weights");
  if (!resumed) remember_version(std::move(weights));
}

std::vector<bf16_bits>& Publisher::next_version() {
  PULSE_CHECK(!history_.empty(), "internal: no version to publish from");
  if (versions_kept_ > 1) {
    std::vector<bf16_bits> slot;
    if (history_.size() == versions_kept_) {
      slot = std::move(history_.front());
      history_.pop_front();
    }
    slot = history_.back();
    history_.push_back(std::move(slot));
  }
  return history_.back();
}

Publication Publisher::publish(sync::ChangeSet* changes, const Kokkos::View<const bf16_bits*>& trainer_weights,
                               TransferCounter& copies) {
  ++version_;
  Publication out;
  if (role_ == SyncRole::trainer) {
    // Other trainers hold no previous version on the host: they copy the new one whole, and only
    // when they sample rollouts from it later.
    if (keep_versions_) remember_version(copies.to_host(trainer_weights));
    return out;
  }
  Kokkos::Timer timer;
  const double waited_before = wait_totals().seconds;
  out.sync = weight_sync_->step(version_, role_ == SyncRole::sender ? changes : nullptr, next_version());
  out.seconds = timer.seconds();
  out.wait_seconds = wait_totals().seconds - waited_before;
  return out;
}

void Publisher::save(RankCheckpoint& state) const {
  state.metadata["version"] = std::to_string(version_);
  for (std::size_t i = 0; i < history_.size(); ++i) state.add("history." + std::to_string(i), io::DType::BF16, history_[i]);
  if (weight_sync_) weight_sync_->save(state);
}

void Publisher::load(const RankCheckpoint& state) {
  const index_t n = table_.num_elements();
  version_ = std::stoull(state.meta("version"));
  history_.clear();
  for (int i = 0; state.has("history." + std::to_string(i)); ++i)
    history_.push_back(state.get<bf16_bits>("history." + std::to_string(i), n));
  if (weight_sync_) weight_sync_->load(state);
}

}  // namespace pulse
