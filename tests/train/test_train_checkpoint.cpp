// pulse-train's checkpoints (src/train/train_checkpoint, rank_checkpoint): every rank's state
// round trips through a collective save (np 1, 2, 4), LATEST moves and older steps go, and a file
// that is well-formed safetensors but whose buffers or metadata no longer match its checksum, or
// that belongs to another step, or is cut short, is refused with a one-line error.
#include <gtest/gtest.h>
#include <unistd.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "comm/collectives.hpp"
#include "core/error.hpp"
#include "train/train_checkpoint.hpp"

using namespace pulse;
namespace fs = std::filesystem;

namespace {

// One folder for all ranks: rank 0 makes it and every rank learns its name.
struct SharedTempDir {
  const Communicator& world;
  std::string path;
  explicit SharedTempDir(const Communicator& w) : world(w) {
    if (world.rank() == 0) {
      std::string t = (fs::temp_directory_path() / "pulse-ckpt-test-XXXXXX").string();
      path = ::mkdtemp(t.data());
    }
    std::uint64_t length = path.size();
    broadcast(world, as_view(&length, 1), 0, Channel::control);
    path.resize(length);
    broadcast(world, as_view(path.data(), path.size()), 0, Channel::control);
  }
  ~SharedTempDir() {
    world.barrier();
    if (world.rank() == 0) fs::remove_all(path);
  }
};

RankCheckpoint state_of_rank(int rank, std::int64_t step) {
  RankCheckpoint s;
  s.metadata = {{"program", "test_train_checkpoint"}, {"rank", std::to_string(rank)}};
  s.add("master", io::DType::F32, std::vector<float>{float(rank), 0.5f * float(step), -0.0f});
  s.add("weights", io::DType::BF16, std::vector<std::uint16_t>{std::uint16_t(0x3f80 + rank), 0x7fc1});
  s.add("empty", io::DType::U8, std::vector<std::uint8_t>{});
  return s;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(TrainCheckpointMpi, EveryRankReadsBackItsOwnStateAndOlderStepsGo) {
  const Communicator world(MPI_COMM_WORLD);
  SharedTempDir dir(world);
  EXPECT_EQ(latest_checkpoint_step(dir.path), std::nullopt);
  save_checkpoint_collective(world, dir.path, 3, state_of_rank(world.rank(), 3));
  EXPECT_EQ(latest_checkpoint_step(dir.path), std::optional<std::int64_t>(3));
  save_checkpoint_collective(world, dir.path, 7, state_of_rank(world.rank(), 7));
  EXPECT_EQ(latest_checkpoint_step(dir.path), std::optional<std::int64_t>(7));

  const RankCheckpoint back = load_rank_checkpoint(dir.path, world.rank(), 7);
  const RankCheckpoint want = state_of_rank(world.rank(), 7);
  EXPECT_EQ(back.get<float>("master", 3), want.get<float>("master"));
  EXPECT_EQ(back.get<std::uint16_t>("weights", 2), want.get<std::uint16_t>("weights"));
  EXPECT_TRUE(back.get<std::uint8_t>("empty").empty());
  EXPECT_EQ(back.meta("rank"), std::to_string(world.rank()));
  EXPECT_EQ(back.meta("step"), "7");
  EXPECT_EQ(checkpoint_checksum(back), back.meta("checksum"));

  world.barrier();  // every rank has removed its step-3 file
  if (world.rank() == 0) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir.path)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    std::vector<std::string> expected = {"LATEST"};
    for (int r = 0; r < world.size(); ++r) expected.push_back("rank-" + std::to_string(r) + "-step-7.safetensors");
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(names, expected);
    std::ifstream latest(dir.path + "/LATEST");
    std::string text((std::istreambuf_iterator<char>(latest)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text, "7 " + std::to_string(world.size()) + "\n");
  }
}

// The files below are valid safetensors written by the library's own writer, so only the
// checksum (or the step) can tell that they are not what the checkpoint writer wrote.
TEST(TrainCheckpoint, RefusesAWellFormedFileThatFailsItsChecksum) {
  const Communicator self(MPI_COMM_SELF);
  SharedTempDir dir(self);
  const std::string path = dir.path + "/rank-0-step-4.safetensors";
  write_rank_checkpoint(path, 4, state_of_rank(0, 4));
  const RankCheckpoint good = read_rank_checkpoint(path, 4);

  // rewrite(buffers, metadata): the same file layout with the stored checksum kept as it was
  auto rewrite = [&](const std::vector<CheckpointBuffer>& buffers, const std::map<std::string, std::string>& meta) {
    std::vector<io::TensorToWrite> tensors;
    for (const auto& b : buffers)
      tensors.push_back({b.name, b.dtype,
                         {std::int64_t(b.bytes.size() / io::dtype_size(b.dtype))},
                         b.bytes.data(),
                         b.bytes.size()});
    io::write_safetensors(path, tensors, meta);
  };
  rewrite(good.buffers, good.metadata);
  EXPECT_NO_THROW(read_rank_checkpoint(path, 4));  // the rewrite itself is faithful

  auto changed_value = good.buffers;
  for (auto& b : changed_value)
    if (b.name == "master") b.bytes[0] ^= std::byte{0x80};
  rewrite(changed_value, good.metadata);
  const std::string value_error = error_of([&] { read_rank_checkpoint(path, 4); });
  EXPECT_NE(value_error.find("fails its checksum"), std::string::npos) << value_error;
  EXPECT_EQ(value_error.find('\n'), std::string::npos) << value_error;

  auto changed_meta = good.metadata;
  changed_meta["rank"] = "1";
  rewrite(good.buffers, changed_meta);
  EXPECT_NE(error_of([&] { read_rank_checkpoint(path, 4); }).find("fails its checksum"), std::string::npos);

  auto renamed = good.buffers;
  for (auto& b : renamed)
    if (b.name == "weights") b.name = "weightz";
  rewrite(renamed, good.metadata);
  EXPECT_NE(error_of([&] { read_rank_checkpoint(path, 4); }).find("fails its checksum"), std::string::npos);

  auto forged = good.metadata;
  forged["checksum"] = "xxh3-128:00000000000000000000000000000000";
  rewrite(good.buffers, forged);
  EXPECT_NE(error_of([&] { read_rank_checkpoint(path, 4); }).find("fails its checksum"), std::string::npos);
}

TEST(TrainCheckpoint, RefusesAnotherStepsFileAndATruncatedFile) {
  const Communicator self(MPI_COMM_SELF);
  SharedTempDir dir(self);
  const std::string path = dir.path + "/rank-0-step-4.safetensors";
  write_rank_checkpoint(path, 4, state_of_rank(0, 4));
  fs::copy_file(path, dir.path + "/rank-0-step-5.safetensors");  // named step 5, holds step 4
  EXPECT_NE(error_of([&] { load_rank_checkpoint(dir.path, 0, 5); }).find("is not of step 5"), std::string::npos);
  fs::resize_file(path, fs::file_size(path) - 1);
  EXPECT_NE(error_of([&] { load_rank_checkpoint(dir.path, 0, 4); }), "");
  EXPECT_NE(error_of([&] { load_rank_checkpoint(dir.path, 1, 4); }).find("missing"), std::string::npos);
}

TEST(TrainCheckpoint, UnreadableLatestIsAnError) {
  const Communicator self(MPI_COMM_SELF);
  SharedTempDir dir(self);
  for (const std::string text : {"", "seven 1\n", "-1 1\n", "7\n"}) {
    std::ofstream(dir.path + "/LATEST") << text;
    EXPECT_NE(error_of([&] { latest_checkpoint_step(dir.path); }).find("unreadable"), std::string::npos)
        << "'" << text << "'";
  }
  std::ofstream(dir.path + "/LATEST") << "12 4\n";
  EXPECT_EQ(latest_checkpoint_step(dir.path), std::optional<std::int64_t>(12));
}

// A FIFO (or any special file) where LATEST or a rank's file should be is refused at once: an
// open that waited for a writer would hang the resume.
TEST(TrainCheckpoint, SpecialFilesAreRefusedWithoutBlocking) {
  const Communicator self(MPI_COMM_SELF);
  SharedTempDir dir(self);
  ASSERT_EQ(::mkfifo((dir.path + "/LATEST").c_str(), 0644), 0);
  EXPECT_NE(error_of([&] { latest_checkpoint_step(dir.path); }).find("not a regular file (a FIFO)"), std::string::npos);
  ASSERT_EQ(::mkfifo((dir.path + "/rank-0-step-3.safetensors").c_str(), 0644), 0);
  EXPECT_NE(error_of([&] { load_rank_checkpoint(dir.path, 0, 3); }).find("not a regular file (a FIFO)"), std::string::npos);
}

TEST(TrainCheckpoint, AccessorsRefuseMissingOrMisSizedBuffers) {
  const RankCheckpoint s = state_of_rank(2, 1);
  EXPECT_TRUE(s.has("master"));
  EXPECT_FALSE(s.has("moments"));
  EXPECT_NE(error_of([&] { s.get<float>("moments"); }).find("no buffer 'moments'"), std::string::npos);
  EXPECT_NE(error_of([&] { s.get<float>("master", 4); }), "");         // 3 floats, not 4
  EXPECT_NE(error_of([&] { s.get<double>("master"); }), "");           // 12 bytes are not whole doubles
  EXPECT_EQ(s.get<std::uint32_t>("master").size(), 3u);                // same size, other type: fine
  EXPECT_NE(error_of([&] { s.meta("step"); }).find("no 'step'"), std::string::npos);
}
