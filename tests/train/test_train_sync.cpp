// PULSESync in the training loop over MPI (src/train/weight_sync): trainer rank 0 codes each
// version as a patch from its change set and writes the set into its copy, every other rank
// applies the patch to its copy; every copy must equal the target bit for bit, with the counts
// of changed elements known by construction, and the patches are those encode_patch writes from
// the two versions. Runs at np 1, 2 and 4 (at np 1 the sender has no receiver and still encodes
// every version).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "comm/collectives.hpp"
#include "core/error.hpp"
#include "coding/digest.hpp"
#include "sync/change_history.hpp"
#include "train/weight_sync.hpp"

using namespace pulse;

namespace {

TensorTable sync_table() {
  TensorTable t;
  t.add("w", {4, 5});
  t.add("empty", {0});
  t.add("b", {33});
  return t;
}

struct Version {
  std::vector<bf16_bits> bits;
  std::uint64_t changed;  // elements whose bits differ from the version before
};

// v0; v1: 3 elements; v2: none; v3: all but a +0; v4: that +0 -> -0 and a NaN payload (2 elements).
std::vector<Version> sync_versions(const TensorTable& table) {
  const std::size_t n = table.num_elements();
  std::vector<bf16_bits> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = bf16_bits(0x3c00 + i * 5);
  v[3] = 0x0000, v[25] = 0x7fc0;
  std::vector<Version> out{{v, 0}};
  v[0] ^= 1, v[19] ^= 0x40, v[52] = 0xff80;
  out.push_back({v, 3});
  out.push_back({v, 0});
  for (std::size_t i = 0; i < n; ++i)
    if (i != 3) v[i] = bf16_bits(v[i] + 1);  // NaN 0x7fc0 -> 0x7fc1: a change of payload
  out.push_back({v, n - 1});
  v[3] = 0x8000, v[25] = 0x7fc2;
  out.push_back({v, 2});
  return out;
}

sync::Digest state_of(const TensorTable& table, const std::vector<bf16_bits>& bits) {
  return sync::compute_digests(bf16_tensor_refs(table, bits)).state;
}

// What turns `from` into `to`, as AdamW lists it; `also` lists an element besides, whose bits
// may stay (the list may hold such elements).
sync::ChangeSet change_set(const TensorTable& table, const std::vector<bf16_bits>& from,
                           const std::vector<bf16_bits>& to, std::size_t also = SIZE_MAX) {
  sync::ChangeSet set;
  for (std::size_t i = 0; i < from.size(); ++i)
    if (from[i] != to[i] || i == also) set.indices.push_back(index_t(i)), set.new_bits.push_back(to[i]);
  set.tensor_begin = sync::tensor_begins(set.indices, table.offsets());
  return set;
}

// Sender: version v from v - 1 through its change set; receivers: from the patch.
SyncStepStats step_to(WeightSync& sync, const TensorTable& table, const std::vector<Version>& versions, std::uint64_t v,
                      std::vector<bf16_bits>& held, std::size_t also = SIZE_MAX) {
  sync::ChangeSet set = change_set(table, versions[v - 1].bits, versions[v].bits, also);
  return sync.step(v, sync.is_sender() ? &set : nullptr, held);
}

}  // namespace

TEST(WeightSyncMpi, EveryReceiverHoldsTheSendersVersionAfterEachPatch) {
  const Communicator world(MPI_COMM_WORLD);
  const TensorTable table = sync_table();
  const auto versions = sync_versions(table);
  WeightSync sync(world, table, "", 10, 2);
  EXPECT_EQ(sync.is_sender(), world.rank() == 0);
  // Receivers start from zeros: bootstrap brings them the sender's version 0 densely.
  std::vector<bf16_bits> held = sync.is_sender() ? versions[0].bits : std::vector<bf16_bits>(table.num_elements());
  sync.bootstrap(0, held);
  ASSERT_EQ(held, versions[0].bits);
  for (std::uint64_t v = 1; v < versions.size(); ++v) {
    sync::ChangeSet set = change_set(table, versions[v - 1].bits, versions[v].bits);
    const SyncStepStats stats = sync.step(v, sync.is_sender() ? &set : nullptr, held);
    EXPECT_EQ(held, versions[v].bits) << "version " << v;
    if (sync.is_sender())  // the set keeps what it overwrote
      for (std::size_t j = 0; j < set.size(); ++j) EXPECT_EQ(set.old_bits[j], versions[v - 1].bits[set.indices[j]]);
    EXPECT_EQ(stats.changed, versions[v].changed) << "version " << v;
    EXPECT_EQ(stats.state, state_of(table, versions[v].bits)) << "version " << v;
    // Receivers report the size of the patch the sender encoded.
    std::uint64_t sent = stats.patch_bytes;
    broadcast(world, as_view(&sent, 1), 0, Channel::control);
    EXPECT_GT(sent, 0u) << "version " << v;
    EXPECT_EQ(stats.patch_bytes, sent) << "version " << v;
  }
}

// A receiver whose copy is no longer the patch's base (here: an element the patch does not write,
// in a tensor it does) refuses the patch and keeps its copy as it was.
TEST(WeightSyncMpi, ReceiverWithADifferentBaseRefusesThePatchAndKeepsItsCopy) {
  const Communicator world(MPI_COMM_WORLD);
  const TensorTable table = sync_table();
  const auto versions = sync_versions(table);
  WeightSync sync(world, table, "", 10, 2);
  std::vector<bf16_bits> held = sync.is_sender() ? versions[0].bits : std::vector<bf16_bits>(table.num_elements());
  sync.bootstrap(0, held);
  if (sync.is_sender()) {
    EXPECT_NO_THROW(step_to(sync, table, versions, 1, held));
  } else {
    held[7] ^= 1;  // versions 0 and 1 agree at 7
    const std::vector<bf16_bits> before = held;
    EXPECT_THROW(step_to(sync, table, versions, 1, held), Error);
    EXPECT_EQ(held, before);
  }
}

TEST(WeightSyncMpi, StepBeforeBootstrapIsRefused) {
  const Communicator self(MPI_COMM_SELF);
  const TensorTable table = sync_table();
  const auto versions = sync_versions(table);
  WeightSync sync(self, table, "", 10, 2);
  std::vector<bf16_bits> held = versions[0].bits;
  EXPECT_THROW(step_to(sync, table, versions, 1, held), Error);
  EXPECT_EQ(held, versions[0].bits);
}

// A sender without a change set, or with one that does not fit the table, is refused before it
// writes anything, and so is every receiver (they agree on the sender's error).
TEST(WeightSyncMpi, SenderWithoutAFittingChangeSetIsRefusedEverywhere) {
  const Communicator world(MPI_COMM_WORLD);
  const TensorTable table = sync_table();
  const auto versions = sync_versions(table);
  WeightSync sync(world, table, "", 10, 2);
  std::vector<bf16_bits> held = sync.is_sender() ? versions[0].bits : std::vector<bf16_bits>(table.num_elements());
  sync.bootstrap(0, held);
  EXPECT_THROW(sync.step(1, nullptr, held), Error);
  sync::ChangeSet misfit = change_set(table, versions[0].bits, versions[1].bits);
  misfit.tensor_begin.pop_back();
  EXPECT_THROW(sync.step(1, sync.is_sender() ? &misfit : nullptr, held), Error);
  EXPECT_EQ(held, versions[0].bits);
  EXPECT_NO_THROW(step_to(sync, table, versions, 1, held));  // the next try goes through
  EXPECT_EQ(held, versions[1].bits);
}

TEST(WeightSyncMpi, TensorRefsViewTheTableSlices) {
  const TensorTable table = sync_table();
  const auto bits = sync_versions(table)[0].bits;
  const auto refs = bf16_tensor_refs(table, bits);
  ASSERT_EQ(refs.size(), 3u);
  EXPECT_EQ(refs[0].name, "w");
  EXPECT_EQ(refs[0].dtype, "BF16");
  EXPECT_EQ(refs[0].shape, (std::vector<std::int64_t>{4, 5}));
  EXPECT_EQ(refs[0].data, reinterpret_cast<const std::byte*>(bits.data()));
  EXPECT_EQ(refs[0].bytes, 40u);
  EXPECT_EQ(refs[1].bytes, 0u);
  EXPECT_EQ(refs[2].name, "b");
  EXPECT_EQ(refs[2].data, reinterpret_cast<const std::byte*>(bits.data() + 20));
  EXPECT_EQ(refs[2].bytes, 66u);
}

// The sender's change set lists an element that keeps its bits besides the changes: the receivers
// reach every version, and the patches are those encode_patch writes from the two versions
// against a change history that follows them (the size here; test_change_set the bytes).
TEST(WeightSyncMpi, PatchesFromTheChangeSetAreThoseOfComparingVersions) {
  const Communicator world(MPI_COMM_WORLD);
  const TensorTable table = sync_table();
  const auto versions = sync_versions(table);
  WeightSync sync(world, table, "", 10, 2);
  std::vector<bf16_bits> held = sync.is_sender() ? versions[0].bits : std::vector<bf16_bits>(table.num_elements());
  sync.bootstrap(0, held);
  sync::ChangeHistory history(bf16_tensor_refs(table, versions[0].bits), state_of(table, versions[0].bits));
  for (std::uint64_t v = 1; v < versions.size(); ++v) {
    const auto base = bf16_tensor_refs(table, versions[v - 1].bits), target = bf16_tensor_refs(table, versions[v].bits);
    sync::EncodeOptions options = sync::exponent_class_history_options(history);
    options.base_version = v - 1, options.target_version = v;
    sync::StateDigests target_digests;
    const auto expected = sync::encode_patch(base, target, options, nullptr, &target_digests);
    history.advance(base, target, target_digests.state);
    const SyncStepStats a = step_to(sync, table, versions, v, held, 7);
    EXPECT_EQ(held, versions[v].bits) << "version " << v;
    EXPECT_EQ(a.changed, versions[v].changed) << "version " << v;
    EXPECT_EQ(a.state, state_of(table, versions[v].bits)) << "version " << v;
    EXPECT_EQ(a.patch_bytes, expected.size()) << "version " << v;
    if (sync.is_sender()) {
      const sync::ParsedPatch parsed = sync::parse_patch(expected.data(), expected.size());
      EXPECT_EQ(a.patch_raw_bytes, parsed.header.index_stream.raw + parsed.header.value_stream.raw +
                                       parsed.header.whole_stream.raw) << "version " << v;
    }
  }
}

// Over MPI both ends keep a change history and code with expclass-history. A run that saves its
// WeightSync in a checkpoint after version 2 and resumes in new objects (load, then bootstrap at
// version 2) sends the patches of the run that went on, byte for byte; a resume without the
// saved history starts a new one at both ends and still reaches every version.
TEST(WeightSyncMpi, CheckpointedHistoryResumesWithTheSamePatches) {
  const Communicator world(MPI_COMM_WORLD);
  const TensorTable table = sync_table();
  const auto versions = sync_versions(table);
  auto start = [&](WeightSync& sync, std::uint64_t version) {
    std::vector<bf16_bits> held = sync.is_sender() ? versions[version].bits : std::vector<bf16_bits>(table.num_elements());
    sync.bootstrap(version, held);
    return held;
  };
  auto next = [&](WeightSync& sync, std::uint64_t v, std::vector<bf16_bits>& held, std::vector<std::uint64_t>* sizes) {
    const SyncStepStats s = step_to(sync, table, versions, v, held);
    EXPECT_EQ(held, versions[v].bits) << "version " << v;
    if (sizes) sizes->push_back(s.patch_bytes);
  };
  WeightSync going_on(world, table, "", 10, 2);
  std::vector<bf16_bits> held = start(going_on, 0);
  std::vector<std::uint64_t> expected, resumed_sizes;
  RankCheckpoint saved;
  for (std::uint64_t v = 1; v < versions.size(); ++v) {
    next(going_on, v, held, v > 2 ? &expected : nullptr);
    if (v == 2) going_on.save(saved);
  }
  ASSERT_TRUE(saved.has("sync.change_history"));
  WeightSync resumed(world, table, "", 10, 2);
  resumed.load(saved);
  held = start(resumed, 2);
  for (std::uint64_t v = 3; v < versions.size(); ++v) next(resumed, v, held, &resumed_sizes);
  EXPECT_EQ(resumed_sizes, expected);
  RankCheckpoint end_going_on, end_resumed, end_fresh;
  going_on.save(end_going_on);
  resumed.save(end_resumed);
  EXPECT_EQ(end_resumed.meta("sync.change_history_digest"), end_going_on.meta("sync.change_history_digest"));
  EXPECT_EQ(end_resumed.get<std::uint8_t>("sync.change_history"), end_going_on.get<std::uint8_t>("sync.change_history"));
  WeightSync fresh(world, table, "", 10, 2);
  held = start(fresh, 2);
  for (std::uint64_t v = 3; v < versions.size(); ++v) next(fresh, v, held, nullptr);
  fresh.save(end_fresh);  // the same versions from another origin: another history
  EXPECT_NE(end_fresh.meta("sync.change_history_digest"), end_going_on.meta("sync.change_history_digest"));
}
