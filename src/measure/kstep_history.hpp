#pragma once
// pulse-measure's k-step comparison of a rank's share: for each checkpoint, how many elements
// differ from the checkpoint k steps back (k in a list, up to 32). The history is a change log
// per checkpoint (measure/change_log.hpp), block by block; a block of the checkpoint before is
// reverted with the logs, newest first, and the count of elements that differ from the block
// measured is carried along: each log's positions change it, and only there, so a step back
// costs the changes it undoes, not a pass over the block.
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "measure/change_log.hpp"

namespace pulse::measure {

class KStepHistory {
 public:
  // ks: the distances counted (steps apart, increasing, positive).
  explicit KStepHistory(std::vector<int> ks);
  const std::vector<int>& ks() const { return ks_; }

  // Starts the checkpoint of `step`, whose predecessor in the series is previous_step (none for
  // the first): keeps the logs from checkpoints at most the largest k back and opens a new one
  // for the changes from the previous checkpoint.
  void start(std::int64_t step, std::optional<std::int64_t> previous_step);

  // The next block of the share (blocks come in the same order and sizes at every checkpoint):
  // m elements of element_bytes at now and at before (the previous checkpoint's). Adds to
  // differing[j] (one per k) the elements of now that differ from the checkpoint ks[j] steps
  // back where the history holds it. Returns the positions of the elements that changed since
  // before, increasing, valid until the next call.
  const std::vector<std::uint16_t>& add_block(const std::byte* now, const std::byte* before, std::size_t m,
                                              std::size_t element_bytes, std::int64_t* differing);

 private:
  static constexpr std::size_t kNone = std::size_t(-1);
  std::vector<int> ks_;
  bool recording_ = false;  // the checkpoint has one before it
  std::deque<ChangeLog> logs_;     // newest first: from the previous checkpoint, ...
  std::vector<ChangeLog> spare_;   // dropped, with their buffers
  std::vector<std::size_t> k_of_log_;  // the index into ks_ of the version logs 0..l revert to, or kNone
  std::size_t reverted_logs_ = 0;      // logs a block is reverted with: up to the last with a k
  std::size_t block_ = 0;              // blocks of this checkpoint so far
  std::vector<std::byte> scratch_;     // a block reverted
};

}  // namespace pulse::measure
