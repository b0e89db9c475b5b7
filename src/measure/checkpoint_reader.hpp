#pragma once
// Reading the pieces of one checkpoint that a rank measures: pread() of element ranges of its
// tensors straight into the caller's memory (one copy, as read() costs; no page faults on a map),
// each shard file opened once; and, for the checkpoint after the one being measured, a request
// to the kernel to start reading the rank's pieces into the page cache (posix_fadvise WILLNEED,
// which returns at once), so reading from disk overlaps the comparisons without a second buffer.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/model_state.hpp"
#include "measure/work_split.hpp"

namespace pulse::measure {

class CheckpointReader {
 public:
  // Opens the checkpoint's header (a .safetensors file or a Hugging Face folder).
  explicit CheckpointReader(const std::string& path);
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;
  ~CheckpointReader();

  // Elements [begin, end) of tensor t into out. Throws pulse::Error naming the file when the
  // checkpoint lacks the tensor or a read fails.
  void read(const MeasuredTensor& t, std::int64_t begin, std::int64_t end, std::byte* out);

  // Asks the kernel to read the pieces of units [first, last) ahead (no error if it cannot).
  void read_ahead(const std::vector<MeasuredTensor>& tensors, const std::vector<Unit>& units, std::size_t first,
                  std::size_t last);

 private:
  struct Location {
    int fd;
    std::uint64_t offset;  // of the range's first byte in its file
  };
  Location locate(const MeasuredTensor& t, std::int64_t begin);

  std::string path_;
  io::ModelState state_;
  std::map<std::size_t, int> fds_;  // by shard
};

}  // namespace pulse::measure
