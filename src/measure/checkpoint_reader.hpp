#pragma once
// The bytes of one checkpoint that a rank measures, where they lie: each shard file mapped
// read-only, so comparisons read the page cache directly (no copy into the rank's memory: at
// most a third of the time a read() into a buffer takes, measured); and, for the checkpoints after
// those being measured, requests to the kernel to start reading the rank's pieces into the page
// cache (posix_fadvise WILLNEED, which returns at once), so reading from disk overlaps the
// comparisons. A file cut short while mapped raises SIGBUS, which pulse-measure turns into a
// one-line error. Its calls are safe from several threads at once (files are opened and mapped
// on first use, under a lock).
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
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

  // Elements [begin, end) of tensor t, valid while the reader lives. Throws pulse::Error naming
  // the file when the checkpoint lacks the tensor or the file cannot be mapped or is too short.
  const std::byte* data(const MeasuredTensor& t, std::int64_t begin, std::int64_t end);

  // Asks the kernel to read the unit's pieces ahead (no error if it cannot).
  void read_ahead(const std::vector<MeasuredTensor>& tensors, const Unit& unit);

  // Unmaps the whole pages of the unit's pieces (they stay in the page cache, and data()'s
  // pointers stay valid: a later access maps them again), so the process holds only the pages
  // still to be compared.
  void release(const std::vector<MeasuredTensor>& tensors, const Unit& unit);

 private:
  struct File {
    int fd = -1;
    const std::byte* map = nullptr;  // the whole file, or nullptr until data() needs it
    std::uint64_t bytes = 0;
  };
  File& file_of(std::size_t shard);

  std::string path_;
  io::ModelState state_;
  std::map<std::size_t, File> files_;  // by shard
  std::mutex files_lock_;              // held while files_ is looked up or grows
};

}  // namespace pulse::measure
