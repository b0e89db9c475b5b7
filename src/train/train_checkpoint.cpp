#include "train/train_checkpoint.hpp"

#include <filesystem>
#include <regex>

#include "comm/agree.hpp"
#include "comm/collectives.hpp"
#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "core/file_read.hpp"
#include "train/latest_record.hpp"

namespace pulse {

namespace fs = std::filesystem;

namespace {

std::string rank_file(const std::string& dir, int rank, std::int64_t step) {
  return dir + "/rank-" + std::to_string(rank) + "-step-" + std::to_string(step) + ".safetensors";
}

bool is_checkpoint_file(const std::string& base) {
  static const std::regex name("rank-[0-9]+-step-[0-9]+\\.safetensors|LATEST");
  return std::regex_match(base, name);
}

}  // namespace

void save_checkpoint_collective(const Communicator& world, const std::string& dir, std::int64_t step,
                                const RankCheckpoint& state) {
  std::error_code ec;
  if (world.rank() == 0) {
    fs::create_directories(dir, ec);
    remove_abandoned_temp_files(dir, is_checkpoint_file);  // of writers killed in earlier runs
  }
  world.barrier();
  // A failure on any rank stops every rank before LATEST moves, with that rank's message.
  agree_on_error(world.raw(), [&] {
    try {
      write_rank_checkpoint(rank_file(dir, world.rank(), step), step, state);
    } catch (const std::exception& e) {
      throw Error("checkpoint: " + std::string(e.what()));
    }
  });
  agree_on_error(world.raw(), [&] {  // and a barrier: LATEST has moved on every rank's return
    if (world.rank() != 0) return;
    const std::string text = format_latest({step, world.size()});
    write_file_atomically(dir + "/LATEST", text.data(), text.size());
  });
  // Older checkpoints of this rank go once LATEST has moved past them.
  const std::regex mine("rank-" + std::to_string(world.rank()) + "-step-([0-9]+)\\.safetensors");
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, m, mine) && m[1] != std::to_string(step)) fs::remove(entry.path(), ec);
  }
}

std::optional<std::int64_t> latest_checkpoint_step(const std::string& dir) {
  const std::string path = dir + "/LATEST";
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return std::nullopt;
  const auto bytes = read_regular_file(path, 64, "checkpoint record");
  return parse_latest(std::string(bytes.begin(), bytes.end()), path).step;
}

RankCheckpoint load_rank_checkpoint(const std::string& dir, int rank, std::int64_t step) {
  return read_rank_checkpoint(rank_file(dir, rank, step), step);
}

}  // namespace pulse
