#include "measure/kstep_history.hpp"

#include <cstring>

#include "core/error.hpp"
#include "core/element_compare.hpp"

namespace pulse::measure {

KStepHistory::KStepHistory(std::vector<int> ks) : ks_(std::move(ks)) {
  for (std::size_t j = 0; j < ks_.size(); ++j)
    PULSE_CHECK(ks_[j] > 0 && (j == 0 || ks_[j] > ks_[j - 1]), "KStepHistory: k values must increase from 1 on");
}

void KStepHistory::start(const std::vector<std::int64_t>& steps, std::optional<std::int64_t> previous_step) {
  PULSE_CHECK(!steps.empty(), "KStepHistory: an empty batch");
  for (std::size_t j = 1; j < steps.size(); ++j) PULSE_CHECK(steps[j] > steps[j - 1], "KStepHistory: steps must increase");
  const std::int64_t oldest = ks_.empty() ? steps.front() : steps.front() - ks_.back();
  while (!logs_.empty() && logs_.back().base_step < oldest) {
    spare_.push_back(std::move(logs_.back()));
    logs_.pop_back();
  }
  batch_.assign(steps.size(), Recording{});
  std::size_t opened = 0;
  for (std::size_t j = 0; j < steps.size(); ++j) {
    const std::optional<std::int64_t> before = j ? std::optional<std::int64_t>(steps[j - 1]) : previous_step;
    if (!before) continue;
    logs_.emplace_front();
    if (!spare_.empty()) logs_.front() = std::move(spare_.back()), spare_.pop_back();
    logs_.front().base_step = *before;
    logs_.front().changes.clear();
    batch_[j].recording = true;
    batch_[j].log = opened++;  // counted from the batch's first log; turned around below
  }
  stops_.assign(logs_.size(), {});
  for (std::size_t j = 0; j < steps.size(); ++j) {
    Recording& r = batch_[j];
    if (!r.recording) continue;
    r.log = opened - 1 - r.log;
    for (std::size_t k = 0; k < ks_.size(); ++k)
      for (std::size_t l = r.log; l < logs_.size(); ++l) {  // the checkpoint before j, and older ones
        if (steps[j] - ks_[k] != logs_[l].base_step) continue;
        if (l == r.log)
          r.k_before = k;  // counted as its changes are recorded
        else
          stops_[l].push_back({j, k});
      }
  }
  while (!stops_.empty() && stops_.back().empty()) stops_.pop_back();  // the chain's end
  counted_ = 0;
}

const std::vector<std::uint16_t>& KStepHistory::record(std::size_t j, const std::byte* now, const std::byte* before,
                                                       std::size_t m, std::size_t element_bytes, std::int64_t* differing) {
  PULSE_CHECK(j < batch_.size() && batch_[j].recording,
              "KStepHistory: a block of a checkpoint outside the batch or of the first, which has none before it");
  Recording& r = batch_[j];
  PULSE_CHECK(r.blocks == counted_, "KStepHistory: a block recorded twice before the batch's count of it");
  ++r.blocks;
  const std::vector<std::uint16_t>& changed = logs_[r.log].changes.record(now, before, m, element_bytes);
  if (r.k_before) differing[*r.k_before] += std::int64_t(changed.size());
  return changed;
}

void KStepHistory::count(const std::vector<const std::byte*>& blocks, std::size_t m, std::size_t element_bytes,
                         const std::vector<std::int64_t*>& differing) {
  PULSE_CHECK(blocks.size() == batch_.size() + 1 && differing.size() == batch_.size(),
              "KStepHistory: count takes the blocks of the batch and the one before it");
  const std::size_t b = counted_;
  for (const Recording& r : batch_)
    PULSE_CHECK(!r.recording || r.blocks == b + 1, "KStepHistory: a block counted before the batch recorded it");
  ++counted_;
  if (stops_.empty()) return;
  // From the block before the batch's last checkpoint (logs_[0]'s base) back to the oldest stop.
  if (scratch_.size() < m * element_bytes) scratch_.resize(m * element_bytes);
  std::memcpy(scratch_.data(), blocks[batch_.size() - 1], m * element_bytes);
  for (std::size_t l = 1; l < stops_.size(); ++l) {
    logs_[l].changes.revert(b, scratch_.data(), m, element_bytes);
    for (const Stop& s : stops_[l])
      differing[s.j][s.k] += std::int64_t(count_differing(blocks[s.j + 1], scratch_.data(), m, element_bytes));
  }
}

}  // namespace pulse::measure
