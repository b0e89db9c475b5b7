#include "measure/kstep_history.hpp"

#include <cstring>

#include "core/error.hpp"
#include "measure/compare.hpp"

namespace pulse::measure {

namespace {

// Elements of a block per change that a pass counting its differing elements costs as much as
// (a vector compare covers a cache line of elements; comparing a change as it is reverted costs a
// few instructions more than writing it back). An estimate: on a loaded machine 4, 16 and 64
// gave the same speed within the noise.
constexpr std::size_t kChangesPerPass = 16;

}  // namespace

KStepHistory::KStepHistory(std::vector<int> ks) : ks_(std::move(ks)) {
  for (std::size_t j = 0; j < ks_.size(); ++j)
    PULSE_CHECK(ks_[j] > 0 && (j == 0 || ks_[j] > ks_[j - 1]), "KStepHistory: k values must increase from 1 on");
}

void KStepHistory::start(std::int64_t step, std::optional<std::int64_t> previous_step) {
  block_ = 0;
  const std::int64_t oldest = ks_.empty() ? step : step - ks_.back();
  while (!logs_.empty() && logs_.back().base_step() < oldest) {
    spare_.push_back(std::move(logs_.back()));
    logs_.pop_back();
  }
  recording_ = previous_step.has_value();
  if (recording_) {
    logs_.emplace_front();
    if (!spare_.empty()) logs_.front() = std::move(spare_.back()), spare_.pop_back();
    logs_.front().clear(*previous_step);
  }
  k_of_log_.assign(logs_.size(), kNone);
  reverted_logs_ = 0;
  for (std::size_t l = 0; l < logs_.size(); ++l)
    for (std::size_t j = 0; j < ks_.size(); ++j)
      if (step - ks_[j] == logs_[l].base_step()) k_of_log_[l] = j, reverted_logs_ = l + 1;
}

const std::vector<std::uint16_t>& KStepHistory::add_block(const std::byte* now, const std::byte* before, std::size_t m,
                                                          std::size_t element_bytes, std::int64_t* differing) {
  PULSE_CHECK(recording_, "KStepHistory: a block of the first checkpoint, which has none before it");
  const std::size_t b = block_++;
  const std::vector<std::uint16_t>& changed = logs_.front().record(now, before, m, element_bytes);
  std::uint64_t count = changed.size();  // elements of now that differ from the version reached
  if (k_of_log_[0] != kNone) differing[k_of_log_[0]] += std::int64_t(count);
  if (reverted_logs_ <= 1) return changed;
  if (scratch_.size() < m * element_bytes) scratch_.resize(m * element_bytes);
  std::memcpy(scratch_.data(), before, m * element_bytes);
  // The logs up to the next with a k (the checkpoint of logs_[l].base_step()): counted at each
  // change, or by one pass over the block after them where they change more than a pass costs.
  for (std::size_t first = 1; first < reverted_logs_;) {
    std::size_t last = first, changes = logs_[first].changed(b);
    while (k_of_log_[last] == kNone) changes += logs_[++last].changed(b);
    if (changes * kChangesPerPass > m) {
      for (std::size_t l = first; l <= last; ++l) logs_[l].revert(b, scratch_.data(), m, element_bytes);
      count = count_differing(now, scratch_.data(), m, element_bytes);
    } else {
      for (std::size_t l = first; l <= last; ++l) count = logs_[l].revert(b, scratch_.data(), now, count, m, element_bytes);
    }
    differing[k_of_log_[last]] += std::int64_t(count);
    first = last + 1;
  }
  return changed;
}

}  // namespace pulse::measure
