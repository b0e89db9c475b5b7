#pragma once
// Training checkpoints: everything a rank needs to continue bit for bit (weights, Adam moments,
// lagged weight versions, a reused rollout batch, outer-loop buffers) as named 1-D buffers in one
// safetensors file per rank, plus a LATEST record naming the step. Each rank writes
//   DIR/rank-<r>-step-<s>.safetensors   (atomically)
// then, after all ranks have written, rank 0 writes DIR/LATEST (atomically) and removes older
// steps. A crash at any point leaves LATEST naming a complete earlier checkpoint. Each rank file
// carries an xxh3-128 checksum of its buffers and metadata (metadata key "checksum"), checked
// when it is read.
#include <cstddef>
#include <cstring>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
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

// Collective over world: every rank passes its own state. Returns after LATEST names step.
void save_checkpoint_collective(const Communicator& world, const std::string& dir, std::int64_t step,
                                const RankCheckpoint& state);
// The step LATEST names, if dir holds a checkpoint.
std::optional<std::int64_t> latest_checkpoint_step(const std::string& dir);
RankCheckpoint load_rank_checkpoint(const std::string& dir, int rank, std::int64_t step);
// A whole rank checkpoint file held in memory (what load_rank_checkpoint reads); throws
// pulse::Error naming source when it is malformed, fails its checksum or is not of `step`.
RankCheckpoint parse_rank_checkpoint(const std::byte* file, std::size_t size, std::int64_t step,
                                     const std::string& source);
// "xxh3-128:<32 hex digits>" over the buffers (name, dtype, bytes; in name order) and the
// metadata other than "checksum" itself.
std::string checkpoint_checksum(const RankCheckpoint& state);

}  // namespace pulse
