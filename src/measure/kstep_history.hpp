#pragma once
// pulse-measure's k-step comparison of a rank's share: for each checkpoint, how many elements
// differ from the checkpoint k steps back (k in a list, up to 32). The history is a change log
// per checkpoint (core/block_change_log.hpp), block by block: reverting a block of a version with
// the logs, newest first, passes through every earlier version's block, exactly.
// Checkpoints come in batches of consecutive ones, measured block by block: a block of every
// checkpoint of the batch is recorded (compared with the one before it) before the next block,
// so each checkpoint's block is read from memory once, and compared again, as the block before,
// from cache. Then one chain of reverts serves the whole batch: from the block before the
// batch's last checkpoint back to the oldest version any of them is compared with, counting the
// elements that differ from each checkpoint's block at the versions k steps back from it. A
// batch of b checkpoints reverts 30 + b logs where one at a time reverts 31 each (--max-k 32).
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "core/block_change_log.hpp"

namespace pulse::measure {

class KStepHistory {
 public:
  // ks: the distances counted (steps apart, increasing, positive).
  explicit KStepHistory(std::vector<int> ks);
  const std::vector<int>& ks() const { return ks_; }

  // Starts a batch of consecutive checkpoints of the series, of these steps (increasing), the
  // first of which follows the checkpoint of previous_step (none: the batch starts the series):
  // keeps the logs from checkpoints at most the largest k back from the first and opens one for
  // the changes to each checkpoint of the batch that has one before it.
  void start(const std::vector<std::int64_t>& steps, std::optional<std::int64_t> previous_step);

  // The next block of the share for checkpoint j of the batch (blocks come in the same order and
  // sizes at every checkpoint): m elements of element_bytes at now and at before (the previous
  // checkpoint's). Records its changes, and adds their number to differing[j'] where the
  // checkpoint before is ks[j'] steps back. Returns the positions of the elements that changed,
  // increasing, valid until the next call.
  const std::vector<std::uint16_t>& record(std::size_t j, const std::byte* now, const std::byte* before, std::size_t m,
                                           std::size_t element_bytes, std::int64_t* differing);

  // Once every checkpoint of the batch with one before it has recorded the block: blocks[0] is
  // the block of the checkpoint before the batch, blocks[j + 1] that of checkpoint j (m elements
  // of element_bytes each). Adds to differing[j][j'] the elements of checkpoint j's block that
  // differ from the checkpoint ks[j'] steps back, where the history holds it and it is not the
  // one before (record counted those).
  void count(const std::vector<const std::byte*>& blocks, std::size_t m, std::size_t element_bytes,
             const std::vector<std::int64_t*>& differing);

 private:
  struct Stop {  // a version the chain of reverts reaches, compared with checkpoint j's block
    std::size_t j, k;
  };
  struct Log {  // the changes from the checkpoint of base_step to the next one
    std::int64_t base_step = 0;
    BlockChangeLog changes;
  };
  std::vector<int> ks_;
  std::deque<Log> logs_;    // newest first: to the batch's last checkpoint, ...
  std::vector<Log> spare_;  // dropped, with their buffers
  struct Recording {              // per checkpoint of the batch
    bool recording = false;       // it has a checkpoint before it
    std::size_t log = 0;          // into logs_: the changes to it
    std::optional<std::size_t> k_before;  // index into ks_ of the checkpoint before it
    std::size_t blocks = 0;       // blocks recorded
  };
  std::vector<Recording> batch_;
  std::vector<std::vector<Stop>> stops_;  // per log l: after reverting logs_[1..l], the block is of logs_[l]'s base step
  std::size_t counted_ = 0;               // blocks counted in this batch
  std::vector<std::byte> scratch_;        // a block reverted
};

}  // namespace pulse::measure
