#include "train/train_checkpoint.hpp"

#include <filesystem>
#include <fstream>
#include <regex>

#include "comm/collectives.hpp"
#include "core/atomic_file.hpp"
#include "core/error.hpp"

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

std::string rank_file(const std::string& dir, int rank, std::int64_t step) {
  return dir + "/rank-" + std::to_string(rank) + "-step-" + std::to_string(step) + ".safetensors";
}

}  // namespace

void save_checkpoint_collective(const Communicator& world, const std::string& dir, std::int64_t step,
                                const RankCheckpoint& state) {
  std::error_code ec;
  if (world.rank() == 0) fs::create_directories(dir, ec);
  world.barrier();
  std::vector<io::TensorToWrite> tensors;
  for (const auto& b : state.buffers) {
    const std::size_t size = io::dtype_size(b.dtype);
    tensors.push_back({b.name, b.dtype, {static_cast<std::int64_t>(b.bytes.size() / size)}, b.bytes.data(), b.bytes.size()});
  }
  std::map<std::string, std::string> metadata = state.metadata;
  metadata["step"] = std::to_string(step);
  // A failure on any rank must stop every rank before LATEST moves.
  int failed = 0;
  std::string error;
  try {
    io::write_safetensors(rank_file(dir, world.rank(), step), tensors, metadata);
  } catch (const std::exception& e) {
    failed = 1, error = e.what();
  }
  const int any_failed = allreduce_value(world, failed, ReduceOp::max);
  PULSE_CHECK(!failed, "checkpoint: " + error);
  PULSE_CHECK(any_failed == 0, "checkpoint: another rank failed to write its part in '" + dir + "'");
  if (world.rank() == 0) {
    const std::string text = std::to_string(step) + " " + std::to_string(world.size()) + "\n";
    write_file_atomically(dir + "/LATEST", text.data(), text.size());
  }
  world.barrier();
  // Older checkpoints of this rank go once LATEST has moved past them.
  const std::regex mine("rank-" + std::to_string(world.rank()) + "-step-([0-9]+)\\.safetensors");
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, m, mine) && std::stoll(m[1]) != step) fs::remove(entry.path(), ec);
  }
}

std::optional<std::int64_t> latest_checkpoint_step(const std::string& dir) {
  std::ifstream in(dir + "/LATEST");
  if (!in) return std::nullopt;
  long long step = -1, ranks = 0;
  in >> step >> ranks;
  PULSE_CHECK(in && step >= 0, "checkpoint record '" + dir + "/LATEST' is unreadable");
  return step;
}

RankCheckpoint load_rank_checkpoint(const std::string& dir, int rank, std::int64_t step) {
  const io::SafetensorsFile file = io::SafetensorsFile::open(rank_file(dir, rank, step));
  RankCheckpoint state;
  state.metadata = file.metadata();
  for (const io::TensorView& t : file.tensors()) state.add(t.name, t.dtype, t.data, t.bytes);
  PULSE_CHECK(state.meta("step") == std::to_string(step), "checkpoint '" + file.path() + "' is not of step " +
                                                               std::to_string(step));
  return state;
}

}  // namespace pulse
