// pulse-train's building blocks (src/train; its settings: test_train_config.cpp): the checkpoint
// checksum, the removal of killed writers' temporary files (each rank on its own,
// MPI_COMM_SELF), and a relay run resumed from an older checkpoint (MPI_COMM_WORLD).
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "comm/collectives.hpp"
#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "coding/digest.hpp"
#include "train/train_checkpoint.hpp"
#include "train/train_config.hpp"
#include "sync/relay.hpp"
#include "train/weight_sync.hpp"
#include "support/temp_dir.hpp"

using namespace pulse;
namespace fs = std::filesystem;

using test::TempDir;

TEST(TrainCheckpoint, ChecksumCoversBuffersAndMetadata) {
  RankCheckpoint s;
  s.metadata = {{"config", "lr = 1"}, {"step", "3"}};
  s.add("master", io::DType::F32, std::vector<float>{1.0f, 2.0f});
  s.add("rollouts", io::DType::U8, std::vector<std::uint8_t>{});
  const std::string sum = checkpoint_checksum(s);
  EXPECT_EQ(sum.rfind("xxh3-128:", 0), 0u);
  EXPECT_EQ(sum.size(), 9u + 32u);
  RankCheckpoint reordered;  // buffer order does not matter (the file orders them by offset)
  reordered.metadata = s.metadata;
  reordered.add("rollouts", io::DType::U8, std::vector<std::uint8_t>{});
  reordered.add("master", io::DType::F32, std::vector<float>{1.0f, 2.0f});
  EXPECT_EQ(checkpoint_checksum(reordered), sum);
  reordered.metadata["checksum"] = "anything";  // the stored checksum itself is not covered
  EXPECT_EQ(checkpoint_checksum(reordered), sum);
  RankCheckpoint flipped = s;
  flipped.buffers[0].bytes[1] ^= std::byte{0x01};
  EXPECT_NE(checkpoint_checksum(flipped), sum);
  RankCheckpoint renamed = s;
  renamed.metadata["config"] = "lr = 2";
  EXPECT_NE(checkpoint_checksum(renamed), sum);
  RankCheckpoint retyped = s;
  retyped.buffers[0].dtype = io::DType::I32;
  EXPECT_NE(checkpoint_checksum(retyped), sum);
}

namespace {

std::vector<std::byte> file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> b(c.size());
  std::memcpy(b.data(), c.data(), c.size());
  return b;
}

}  // namespace

TEST(TrainCheckpoint, RoundTripAndEveryFlippedBitRefused) {
  TempDir dir;
  const Communicator world(MPI_COMM_SELF);
  RankCheckpoint s;
  s.metadata = {{"program", "test"}, {"config", to_toml(TrainConfig{})}};
  const std::vector<float> master = {0.5f, -1.25f, 3.0e-8f, 7.0f};
  s.add("master", io::DType::F32, master);
  s.add("weights", io::DType::BF16, std::vector<std::uint16_t>{0x3f80, 0xbf80});
  save_checkpoint_collective(world, dir.path.string(), 5, s);
  ASSERT_EQ(latest_checkpoint_step(dir.path.string()), std::optional<std::int64_t>(5));
  const RankCheckpoint back = load_rank_checkpoint(dir.path.string(), 0, 5);
  EXPECT_EQ(back.get<float>("master", 4), master);
  EXPECT_EQ(back.get<std::uint16_t>("weights", 2), (std::vector<std::uint16_t>{0x3f80, 0xbf80}));
  EXPECT_EQ(back.meta("config"), to_toml(TrainConfig{}));
  EXPECT_EQ(back.meta("step"), "5");
  EXPECT_THROW(load_rank_checkpoint(dir.path.string(), 0, 4), Error);  // no such step

  // Every single-bit flip anywhere in the file is refused (parse error or checksum), except
  // in the header's space padding, which the parser accepts as NUL: those read the same content.
  const std::vector<std::byte> bytes = file_bytes(dir.path / "rank-0-step-5.safetensors");
  const RankCheckpoint original = parse_rank_checkpoint(bytes.data(), bytes.size(), 5, "file");
  const std::size_t data_bytes = 4 * 4 + 2 * 2;
  int refused_in_data = 0;
  for (std::size_t i = 0; i < bytes.size(); ++i)
    for (int bit = 0; bit < 8; ++bit) {
      std::vector<std::byte> damaged = bytes;
      damaged[i] ^= std::byte(1 << bit);
      try {
        const RankCheckpoint read = parse_rank_checkpoint(damaged.data(), damaged.size(), 5, "file");
        EXPECT_EQ(read.metadata, original.metadata) << "flip of bit " << bit << " at byte " << i;
        EXPECT_EQ(checkpoint_checksum(read), checkpoint_checksum(original)) << "flip of bit " << bit << " at byte " << i;
        EXPECT_LT(i, bytes.size() - data_bytes) << "a flip in the tensor data was accepted";
      } catch (const Error&) {
        refused_in_data += i >= bytes.size() - data_bytes;
      }
    }
  EXPECT_EQ(refused_in_data, int(data_bytes * 8));
}

TEST(TrainCheckpoint, RefusesCheckpointWithoutChecksum) {
  TempDir dir;
  const std::vector<float> v = {1.0f};
  const std::string path = (dir.path / "rank-0-step-1.safetensors").string();
  io::write_safetensors(path, {{"master", io::DType::F32, {1}, v.data(), 4}}, {{"step", "1"}});
  try {
    load_rank_checkpoint(dir.path.string(), 0, 1);
    FAIL() << "accepted a checkpoint without checksum";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no checksum"), std::string::npos) << e.what();
  }
}

TEST(AtomicFile, AbandonedTemporaryFilesGoLiveOnesStay) {
  TempDir dir;
  auto touch = [&](const std::string& name) {
    std::ofstream(dir.path / name) << "partial";
    return dir.path / name;
  };
  const auto abandoned = touch("rank-0-step-4.safetensors.tmp.aB3dE9");
  const auto other_base = touch("notes.txt.tmp.aB3dE9");          // not ours: is_ours refuses
  const auto short_suffix = touch("rank-0-step-4.safetensors.tmp.aB3dE");  // not mkstemp's grammar
  const auto not_alnum = touch("rank-0-step-4.safetensors.tmp.aB3-E9");
  const auto live = touch("rank-0-step-5.safetensors.tmp.LiVe00");
  const int fd = ::open(live.c_str(), O_RDONLY);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);  // as a live AtomicFile holds it (another open file description)
  fs::create_directory(dir.path / "rank-0-step-6.safetensors.tmp.dIr000");  // not a regular file
  auto ours = [](const std::string& base) { return base.rfind("rank-", 0) == 0; };
  EXPECT_EQ(remove_abandoned_temp_files(dir.path.string(), ours), 1);
  EXPECT_FALSE(fs::exists(abandoned));
  for (const auto& p : {other_base, short_suffix, not_alnum, live}) EXPECT_TRUE(fs::exists(p)) << p;
  EXPECT_TRUE(fs::exists(dir.path / "rank-0-step-6.safetensors.tmp.dIr000"));
  ::close(fd);
  EXPECT_EQ(remove_abandoned_temp_files(dir.path.string(), ours), 1);  // its writer is gone now
  EXPECT_FALSE(fs::exists(live));
}

TEST(AtomicFile, WriterKeepsItsTemporaryFileFromCleaners) {
  TempDir dir;
  const std::string path = (dir.path / "LATEST").string();
  AtomicFile writer(path);
  writer.write("7 1\n", 4);
  EXPECT_EQ(remove_abandoned_temp_files(dir.path.string(), [](const std::string&) { return true; }), 0);
  writer.commit();
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "7 1\n");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator{}), 1);
}

namespace {

TensorTable small_table() {
  TensorTable t;
  t.add("a", {3, 5});
  t.add("b", {7});
  return t;
}

// BF16 weights of version v: a third of the elements change from one version to the next.
std::vector<bf16_bits> weights_of(const TensorTable& table, std::uint64_t v) {
  std::vector<bf16_bits> w(table.num_elements());
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = bf16_bits(0x3f80 + ((i * 31 + (i % 3 == 0 ? v * 7 : 0)) & 0x7f));
  return w;
}

// What turns `from` into `to`, as AdamW lists it.
sync::ChangeSet change_set(const TensorTable& table, const std::vector<bf16_bits>& from, const std::vector<bf16_bits>& to) {
  sync::ChangeSet set;
  for (std::size_t i = 0; i < from.size(); ++i)
    if (from[i] != to[i]) set.indices.push_back(index_t(i)), set.new_bits.push_back(to[i]);
  set.tensor_begin = sync::tensor_begins(set.indices, table.offsets());
  return set;
}

// Versions first..last through sync (the sender makes them, receivers follow and must match).
// The barrier stands for pulse-train's collectives between steps: a receiver reads the relay
// before the sender publishes the next version.
void run_versions(const Communicator& comm, WeightSync& sync, const TensorTable& table, std::uint64_t first,
                  std::uint64_t last, std::vector<bf16_bits>& held) {
  for (std::uint64_t v = first; v <= last; ++v) {
    sync::ChangeSet set = change_set(table, weights_of(table, v - 1), weights_of(table, v));
    const SyncStepStats stats = sync.step(v, sync.is_sender() ? &set : nullptr, held);
    EXPECT_EQ(stats.state, sync::compute_digests(bf16_tensor_refs(table, held)).state) << "version " << v;
    EXPECT_EQ(held, weights_of(table, v)) << "version " << v;
    comm.barrier();
  }
}

std::string shared_temp_dir(const Communicator& world) {
  std::string path;
  if (world.rank() == 0) path = TempDir().path.string();  // the name only: its folder is removed again
  std::uint64_t length = path.size();
  broadcast(world, as_view(&length, 1), 0, Channel::control);
  path.resize(length);
  broadcast(world, as_view(path.data(), path.size()), 0, Channel::control);
  return path;
}

}  // namespace

// A run publishes versions 0..4, is killed, and resumes from its checkpoint at version 2: the
// relay already holds 3 and 4, which the resumed run makes again (over MPI) before it publishes
// 5 and 6. Before the fix, bootstrap refused: "version 2 is not newer than the head 4".
TEST(WeightSync, RelayRunResumesFromAnOlderCheckpoint) {
  const Communicator world(MPI_COMM_WORLD);
  const TensorTable table = small_table();
  const std::string relay = shared_temp_dir(world);
  {
    WeightSync sync(world, table, relay, 2, 2);
    std::vector<bf16_bits> held = sync.is_sender() ? weights_of(table, 0) : std::vector<bf16_bits>(table.num_elements());
    sync.bootstrap(0, held);
    EXPECT_EQ(held, weights_of(table, 0));
    run_versions(world, sync, table, 1, 4, held);
  }
  world.barrier();
  {
    WeightSync sync(world, table, relay, 2, 2);
    std::vector<bf16_bits> held = sync.is_sender() ? weights_of(table, 2) : std::vector<bf16_bits>(table.num_elements());
    ASSERT_NO_THROW(sync.bootstrap(2, held));
    run_versions(world, sync, table, 3, 6, held);
  }
  world.barrier();
  if (world.rank() == 0) {
    const sync::Relay r(relay);
    const auto want = weights_of(table, 6);
    ASSERT_TRUE(r.head().has_value());
    EXPECT_EQ(r.head()->version, 6u);
    EXPECT_EQ(r.head()->state, sync::compute_digests(bf16_tensor_refs(table, want)).state);
    const sync::PullResult pulled = r.pull(nullptr, 0);  // a new reader, from the anchor
    EXPECT_EQ(pulled.version, 6u);
    std::vector<bf16_bits> got;
    for (const auto& d : pulled.state.data)
      for (std::size_t i = 0; i < d.size(); i += 2) got.push_back(bf16_bits(std::to_integer<int>(d[i]) | std::to_integer<int>(d[i + 1]) << 8));
    EXPECT_EQ(got, want);
    fs::remove_all(relay);
  }
  world.barrier();
}

// The relay must hold the checkpoint's weights: other weights at the checkpoint's version, or a
// replay that does not reach the relay's head digest, are errors (each rank its own relay).
TEST(WeightSync, ResumeRefusesARelayOfOtherWeights) {
  const Communicator self(MPI_COMM_SELF);
  const TensorTable table = small_table();
  TempDir dir;
  const std::string relay = (dir.path / "relay").string();
  {
    WeightSync sync(self, table, relay, 2, 2);
    std::vector<bf16_bits> held = weights_of(table, 0);
    sync.bootstrap(0, held);
    run_versions(self, sync, table, 1, 3, held);
  }
  WeightSync sync(self, table, relay, 2, 2);
  std::vector<bf16_bits> other = weights_of(table, 9);
  EXPECT_THROW(sync.bootstrap(3, other), Error);  // the relay's version 3 is other weights
  std::vector<bf16_bits> held = weights_of(table, 1);
  sync.bootstrap(1, held);  // the relay is ahead (3): versions 2 and 3 are replayed
  const std::vector<bf16_bits> v2 = weights_of(table, 2);
  sync::ChangeSet to_v2 = change_set(table, held, v2);
  sync.step(2, &to_v2, held);
  EXPECT_EQ(held, v2);
  sync::ChangeSet to_other = change_set(table, v2, weights_of(table, 7));  // not the relay's version 3
  EXPECT_THROW(sync.step(3, &to_other, held), Error);
  EXPECT_EQ(held, v2);  // the sender still holds the version before
}

// The relay transport publishes the patches it coded from the change sets: the relay's files are
// those Relay::publish writes comparing each version with the one before (pulse-sync publish).
TEST(WeightSync, RelayPatchesAreThoseOfComparingVersions) {
  const Communicator self(MPI_COMM_SELF);
  const TensorTable table = small_table();
  TempDir dir;
  const std::string by_sets = (dir.path / "sets").string(), by_comparing = (dir.path / "comparing").string();
  WeightSync sync(self, table, by_sets, 2, 10);
  std::vector<bf16_bits> held = weights_of(table, 0);
  sync.bootstrap(0, held);
  run_versions(self, sync, table, 1, 5, held);
  sync::Relay relay(by_comparing);
  sync::PublishOptions options;
  options.anchor_every = 2, options.keep_anchors = 10;
  for (std::uint64_t v = 0; v <= 5; ++v) {
    const auto previous = weights_of(table, v ? v - 1 : 0), now = weights_of(table, v);
    const auto previous_refs = bf16_tensor_refs(table, previous);
    relay.publish(v, bf16_tensor_refs(table, now), v ? &previous_refs : nullptr, options);
  }
  auto read = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  for (std::uint64_t v = 1; v <= 5; ++v) {
    const std::string a = sync::Relay(by_sets).patch_path(v - 1, v), b = relay.patch_path(v - 1, v);
    ASSERT_TRUE(fs::exists(a)) << a;
    EXPECT_EQ(read(a), read(b)) << "patch " << v;
    if (v % 2 == 0) EXPECT_EQ(read(sync::Relay(by_sets).anchor_path(v)), read(relay.anchor_path(v))) << "anchor " << v;
  }
}
