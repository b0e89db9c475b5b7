#pragma once
// One rank's training state as a checkpoint file: named 1-D buffers in a safetensors file whose
// metadata holds the step and an xxh3-128 checksum ("checksum") of the buffers (name, dtype,
// bytes; in name order) and of the other metadata, checked whenever the file is read.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "io/safetensors.hpp"

namespace pulse {

struct CheckpointBuffer {
  std::string name;
  io::DType dtype = io::DType::U8;
  std::vector<std::byte> bytes;
};

struct RankCheckpoint {
  std::map<std::string, std::string> metadata;
  std::vector<CheckpointBuffer> buffers;

  void add(const std::string& name, io::DType dtype, const void* data, std::size_t bytes);
  template <class T>
  void add(const std::string& name, io::DType dtype, const std::vector<T>& values) {
    add(name, dtype, values.data(), values.size() * sizeof(T));
  }
  bool has(const std::string& name) const;
  // Throws pulse::Error when the buffer is missing or its size is not a multiple of sizeof(T)
  // (or, with expected_elements >= 0, not exactly that many elements).
  template <class T>
  std::vector<T> get(const std::string& name, long long expected_elements = -1) const {
    const CheckpointBuffer& b = find(name, sizeof(T), expected_elements);
    std::vector<T> out(b.bytes.size() / sizeof(T));
    if (!out.empty()) std::memcpy(out.data(), b.bytes.data(), b.bytes.size());
    return out;
  }
  const std::string& meta(const std::string& key) const;

 private:
  const CheckpointBuffer& find(const std::string& name, std::size_t element_size, long long expected) const;
};

// Writes state as the checkpoint of step (atomically), with "step" and "checksum" added.
void write_rank_checkpoint(const std::string& path, std::int64_t step, const RankCheckpoint& state);
// Reads a checkpoint file whole (a regular file, into memory: a file truncated meanwhile gives
// an error, not SIGBUS) and parses it.
RankCheckpoint read_rank_checkpoint(const std::string& path, std::int64_t step);
// A whole checkpoint file held in memory; throws pulse::Error naming source when it is
// malformed, fails its checksum or is not of `step`.
RankCheckpoint parse_rank_checkpoint(const std::byte* file, std::size_t size, std::int64_t step,
                                     const std::string& source);
// "xxh3-128:<32 hex digits>" over the buffers and the metadata other than "checksum" itself.
std::string checkpoint_checksum(const RankCheckpoint& state);

}  // namespace pulse
