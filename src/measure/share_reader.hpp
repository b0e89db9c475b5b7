#pragma once
// Reading one rank's share of a checkpoint: the pieces of its units, in unit order, concatenated
// into one buffer with pread() (one copy, as read() costs; no page faults on a map), adjacent
// pieces of a shard file in one call. pulse-measure runs it on a second thread for the next
// checkpoint while it measures the current one, so reading from disk overlaps the comparisons.
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "measure/work_split.hpp"

namespace pulse::measure {

// Memory for one version of a share, not zero-filled: it is overwritten whole. (Huge pages
// were tried: the kernel's compaction made filling slower, not faster.)
class ShareBuffer {
 public:
  explicit ShareBuffer(std::size_t bytes) : data_(new std::byte[std::max<std::size_t>(bytes, 1)]) {}
  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }

 private:
  std::unique_ptr<std::byte[]> data_;
};

// Reads the pieces of units [first, last) of the checkpoint at `path` (a file or a Hugging Face
// folder) into out, which holds their bytes. Throws pulse::Error naming the file when a tensor is
// missing or a read fails.
void read_share(const std::string& path, const std::vector<MeasuredTensor>& tensors, const std::vector<Unit>& units,
                std::size_t first, std::size_t last, std::byte* out);

}  // namespace pulse::measure
