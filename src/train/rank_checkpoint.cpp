#include "train/rank_checkpoint.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>

#include "core/error.hpp"
#include "core/file_read.hpp"

namespace pulse {

namespace fs = std::filesystem;

void RankCheckpoint::add(const std::string& name, io::DType dtype, const void* data, std::size_t bytes) {
  CheckpointBuffer b{name, dtype, std::vector<std::byte>(bytes)};
  if (bytes) std::memcpy(b.bytes.data(), data, bytes);
  buffers.push_back(std::move(b));
}

bool RankCheckpoint::has(const std::string& name) const {
  for (const auto& b : buffers)
    if (b.name == name) return true;
  return false;
}

const CheckpointBuffer& RankCheckpoint::find(const std::string& name, std::size_t element_size,
                                             long long expected) const {
  for (const auto& b : buffers) {
    if (b.name != name) continue;
    PULSE_CHECK(b.bytes.size() % element_size == 0,
                "checkpoint buffer '" + name + "' holds " + std::to_string(b.bytes.size()) + " bytes, not whole elements");
    PULSE_CHECK(expected < 0 || b.bytes.size() == std::size_t(expected) * element_size,
                "checkpoint buffer '" + name + "' holds " + std::to_string(b.bytes.size() / element_size) +
                    " elements, expected " + std::to_string(expected));
    return b;
  }
  throw Error("checkpoint has no buffer '" + name + "'");
}

const std::string& RankCheckpoint::meta(const std::string& key) const {
  const auto it = metadata.find(key);
  PULSE_CHECK(it != metadata.end(), "checkpoint metadata has no '" + key + "'");
  return it->second;
}

namespace {

constexpr const char* checksum_key = "checksum";

std::string checksum_of(const std::vector<CheckpointBuffer>& buffers, const std::map<std::string, std::string>& metadata) {
  std::vector<const CheckpointBuffer*> sorted;
  for (const auto& b : buffers) sorted.push_back(&b);
  // The file lists tensors by offset, the writer by insertion: name order is the same for both.
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->name < b->name; });
  XXH3_state_t* state = XXH3_createState();
  PULSE_CHECK(state != nullptr, "checkpoint: out of memory for the checksum state");
  XXH3_128bits_reset(state);
  auto text = [&](const std::string& s) { XXH3_128bits_update(state, s.c_str(), s.size() + 1); };
  for (const CheckpointBuffer* b : sorted) {
    text(b->name);
    text(io::dtype_name(b->dtype));
    const std::uint64_t bytes = b->bytes.size();
    XXH3_128bits_update(state, &bytes, sizeof bytes);
    XXH3_128bits_update(state, b->bytes.data(), b->bytes.size());
  }
  for (const auto& [key, value] : metadata)
    if (key != checksum_key) text(key), text(value);
  const XXH128_hash_t h = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  char hex[64];
  std::snprintf(hex, sizeof hex, "xxh3-128:%016" PRIx64 "%016" PRIx64, std::uint64_t(h.high64), std::uint64_t(h.low64));
  return hex;
}

}  // namespace

std::string checkpoint_checksum(const RankCheckpoint& state) { return checksum_of(state.buffers, state.metadata); }

void write_rank_checkpoint(const std::string& path, std::int64_t step, const RankCheckpoint& state) {
  std::vector<io::TensorToWrite> tensors;
  for (const auto& b : state.buffers) {
    const std::size_t size = io::dtype_size(b.dtype);
    tensors.push_back({b.name, b.dtype, {static_cast<std::int64_t>(b.bytes.size() / size)}, b.bytes.data(), b.bytes.size()});
  }
  std::map<std::string, std::string> metadata = state.metadata;
  metadata["step"] = std::to_string(step);
  metadata[checksum_key] = checksum_of(state.buffers, metadata);
  io::write_safetensors(path, tensors, metadata);
}

RankCheckpoint read_rank_checkpoint(const std::string& path, std::int64_t step) {
  std::error_code ec;
  PULSE_CHECK(fs::exists(fs::symlink_status(path, ec)), "checkpoint '" + path + "' is missing");
  const auto bytes = read_regular_file(path, physical_memory_bytes(), "checkpoint");
  return parse_rank_checkpoint(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size(), step, path);
}

RankCheckpoint parse_rank_checkpoint(const std::byte* file, std::size_t size, std::int64_t step,
                                     const std::string& source) {
  const io::ParsedHeader header = io::parse_header(file, size, {}, source);
  RankCheckpoint state;
  state.metadata = header.metadata;
  for (const io::HeaderEntry& t : header.tensors)
    state.add(t.name, t.dtype, file + header.data_offset + t.begin, t.end - t.begin);
  const auto stored = state.metadata.find(checksum_key);
  PULSE_CHECK(stored != state.metadata.end(), "checkpoint '" + source + "' has no checksum");
  PULSE_CHECK(stored->second == checkpoint_checksum(state),
              "checkpoint '" + source + "' fails its checksum (the file is damaged)");
  PULSE_CHECK(state.meta("step") == std::to_string(step), "checkpoint '" + source + "' is not of step " +
                                                              std::to_string(step));
  return state;
}

}  // namespace pulse
