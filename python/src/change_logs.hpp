#pragma once
// The k-step history of pulse.torch's recorder: the versions of the parameters (flat arrays of
// elements of one width, held by the caller) and the change log of each of the last `keep`
// steps, block by block (core/block_change_log.hpp, as pulse-measure's history): the positions
// that changed and their old bits, or the whole old block where that takes less memory (most
// changed). Reverting the newest logs in turn gives the versions 1, 2, ... steps back, so the
// history costs the changes, not keep copies of the model, and every revert runs on one block
// at a time, in cache. Every count is the same at any thread count.
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "core/block_change_log.hpp"

namespace pulse::python {

class ChangeLogs {
 public:
  // Logs of elements of element_bytes (1, 2, 4 or 8).
  ChangeLogs(std::size_t element_bytes, std::size_t keep);

  // Logs the change from recorded to now (n elements each), reading both only (so it may run
  // while other readers hold them). Returns the changed elements of each parameter, parameter p
  // being elements [ends[p - 1], ends[p]) (ends ascending, the last n).
  std::vector<std::uint64_t> log(const std::byte* now, const std::byte* recorded, std::size_t n,
                                 const std::vector<std::uint64_t>& ends, unsigned threads);

  // {k: elements of latest (the version logged last as now) that differ from the version k
  // steps back} for each k in ks that the logs reach (k <= depth()).
  std::map<std::size_t, std::uint64_t> differing(const std::byte* latest, std::size_t n,
                                                 const std::vector<std::size_t>& ks, unsigned threads) const;

  // The steps logged (at most keep).
  std::size_t depth() const { return logs_.size(); }

  // Bytes of the logs (BlockChangeLog::bytes).
  std::size_t bytes() const;

 private:
  std::size_t element_bytes_, keep_;
  std::deque<BlockChangeLog> logs_;  // oldest first
  // The last log's changed positions, per block (kept between steps: no allocation each step).
  std::vector<std::vector<std::uint16_t>> found_;
};

}  // namespace pulse::python
