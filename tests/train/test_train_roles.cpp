// pulse-train's publisher and generator roles (src/train/publisher, generator) at np 1, 2 and 4.
// Publisher: after each version every rank holds it bit for bit and still holds the versions the
// async lag needs, the changed counts are the change sets' sizes, another trainer copies its
// weights whole only when it keeps versions and hashes nothing, and a checkpoint round trip
// restores the versions. Generator: the rollouts a trainer
// receives over the routes from the inference ranks (np 2: 1 trainer + 1 inference rank; np 4:
// 2 + 2) are its rows of the batch one rank samples alone for all prompts, also when the async
// lag makes the ranks sample from the previous version.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "comm/collectives.hpp"
#include "core/error.hpp"
#include "kernels/bf16.hpp"
#include "kernels/host_copy.hpp"
#include "model/gpt.hpp"
#include "rl/task.hpp"
#include "rl/tokenizer.hpp"
#include "coding/digest.hpp"
#include "train/generator.hpp"
#include "train/publisher.hpp"

using namespace pulse;

namespace {

TensorTable small_table() {
  TensorTable t;
  t.add("w", {4, 5});
  t.add("empty", {0});
  t.add("b", {33});
  return t;
}

sync::Digest state_of(const TensorTable& table, const std::vector<bf16_bits>& bits) {
  return sync::compute_digests(bf16_tensor_refs(table, bits)).state;
}

// v0, then versions made by the change sets: 3 elements, none, every other element.
struct Versions {
  std::vector<std::vector<bf16_bits>> bits;
  std::vector<sync::ChangeSet> lists;  // lists[v] turns version v into v + 1
};

Versions small_versions(const TensorTable& table) {
  const std::size_t n = table.num_elements();
  Versions out;
  std::vector<bf16_bits> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = bf16_bits(0x3c00 + i * 3);
  out.bits.push_back(v);
  std::vector<sync::ChangeSet> lists(3);
  lists[0].indices = {0, 19, 52}, lists[0].new_bits = {0x1234, 0x8000, 0x7fc1};
  for (std::size_t i = 0; i < n; i += 2) lists[2].indices.push_back(index_t(i)), lists[2].new_bits.push_back(bf16_bits(i));
  for (sync::ChangeSet& list : lists) {
    list.tensor_begin = sync::tensor_begins(list.indices, table.offsets());
    for (std::size_t j = 0; j < list.size(); ++j) v[list.indices[j]] = list.new_bits[j];
    out.bits.push_back(v);
    out.lists.push_back(list);
  }
  return out;
}

TrainConfig lag_config(int async_lag) {
  TrainConfig c;
  c.async_lag = async_lag;
  return c;
}

}  // namespace

TEST(PublisherMpi, EveryRankHoldsEachVersionAndTheVersionsTheLagNeeds) {
  const Communicator world(MPI_COMM_WORLD);
  const TensorTable table = small_table();
  const Versions versions = small_versions(table);
  const SyncRole role = world.rank() == 0 ? SyncRole::sender : SyncRole::receiver;
  Publisher publisher(world, table, lag_config(1), role, false);
  publisher.start(role == SyncRole::sender ? versions.bits[0] : std::vector<bf16_bits>{}, false);
  ASSERT_EQ(publisher.version(), 0u);
  EXPECT_EQ(publisher.version_weights(0), versions.bits[0]);
  TransferCounter copies;
  for (std::uint64_t v = 1; v < versions.bits.size(); ++v) {
    sync::ChangeSet list = versions.lists[v - 1];
    const Publication p = publisher.publish(role == SyncRole::sender ? &list : nullptr, {}, copies);
    ASSERT_EQ(publisher.version(), v);
    EXPECT_EQ(publisher.version_weights(v), versions.bits[v]) << "version " << v;
    EXPECT_EQ(publisher.version_weights(v - 1), versions.bits[v - 1]) << "version " << v;
    if (v >= 2) EXPECT_THROW(publisher.version_weights(v - 2), Error) << "async lag 1 keeps two versions";
    EXPECT_EQ(p.sync.changed, versions.lists[v - 1].indices.size()) << "version " << v;
    EXPECT_EQ(p.sync.state, state_of(table, versions.bits[v])) << "version " << v;
  }
  EXPECT_EQ(copies.d2h_bytes, 0u);  // the sender's host copy follows from the change sets
}

// With async lag 0 the newest version is the only one kept, and it is turned into the next in
// place: the weights a rank holds stay where they are.
TEST(PublisherMpi, WithoutALagTheVersionIsUpdatedInPlace) {
  const Communicator world(MPI_COMM_WORLD);
  const TensorTable table = small_table();
  const Versions versions = small_versions(table);
  const SyncRole role = world.rank() == 0 ? SyncRole::sender : SyncRole::receiver;
  Publisher publisher(world, table, lag_config(0), role, false);
  publisher.start(role == SyncRole::sender ? versions.bits[0] : std::vector<bf16_bits>{}, false);
  const bf16_bits* held = publisher.version_weights(0).data();
  TransferCounter copies;
  for (std::uint64_t v = 1; v < versions.bits.size(); ++v) {
    sync::ChangeSet list = versions.lists[v - 1];
    publisher.publish(role == SyncRole::sender ? &list : nullptr, {}, copies);
    EXPECT_EQ(publisher.version_weights(v), versions.bits[v]) << "version " << v;
    EXPECT_EQ(publisher.version_weights(v).data(), held) << "version " << v;
    EXPECT_THROW(publisher.version_weights(v - 1), Error);
  }
}

TEST(PublisherMpi, AnotherTrainerCopiesItsWeightsWholeOnlyToKeepThem) {
  const Communicator self(MPI_COMM_SELF);
  const TensorTable table = small_table();
  const Versions versions = small_versions(table);
  for (const int lag : {0, 2})
    for (const bool samples : {false, true}) {
      SCOPED_TRACE("async lag " + std::to_string(lag) + (samples ? ", samples rollouts" : ""));
      const bool keeps = samples && lag > 0;  // with lag 0 it samples from its device weights
      Publisher publisher(self, table, lag_config(lag), SyncRole::trainer, samples);
      publisher.start(versions.bits[0], false);
      TransferCounter copies;
      for (std::uint64_t v = 1; v < versions.bits.size(); ++v) {
        const auto device = to_device(versions.bits[v]);
        const Publication p = publisher.publish(nullptr, device, copies);
        EXPECT_EQ(copies.d2h_bytes, keeps ? v * table.num_elements() * sizeof(bf16_bits) : 0u);
        EXPECT_EQ(p.sync.state, sync::Digest{});  // nothing hashed
        EXPECT_EQ(p.sync.patch_bytes, 0u);
        ASSERT_EQ(publisher.version(), v);
        if (keeps) EXPECT_EQ(publisher.version_weights(v), versions.bits[v]);
        else EXPECT_THROW(publisher.version_weights(v), Error);
      }
    }
}

TEST(PublisherMpi, CheckpointRestoresTheVersionAndTheKeptVersions) {
  const Communicator self(MPI_COMM_SELF);
  const TensorTable table = small_table();
  const Versions versions = small_versions(table);
  Publisher publisher(self, table, lag_config(1), SyncRole::sender, true);
  publisher.start(versions.bits[0], false);
  TransferCounter copies;
  for (std::uint64_t v = 1; v < versions.bits.size(); ++v) {
    sync::ChangeSet list = versions.lists[v - 1];
    publisher.publish(&list, {}, copies);
  }
  RankCheckpoint state;
  publisher.save(state);
  Publisher restored(self, table, lag_config(1), SyncRole::trainer, true);
  restored.load(state);
  const std::uint64_t last = versions.bits.size() - 1;
  ASSERT_EQ(restored.version(), last);
  EXPECT_EQ(restored.version_weights(last), versions.bits[last]);
  EXPECT_EQ(restored.version_weights(last - 1), versions.bits[last - 1]);
  EXPECT_THROW(restored.version_weights(last - 2), Error);
}

namespace {

// pulse-train's layout at this size: half the ranks (rounded down) infer, the rest train.
struct Layout {
  int num_trainers, rank;
  bool trainer() const { return rank < num_trainers; }
};

TrainConfig rollout_config(int inference_ranks, int async_lag) {
  TrainConfig c;
  c.digits = 1, c.seed = 7, c.prompts_per_step = 4, c.group_size = 2, c.temperature = 1.0;
  c.inference_ranks = inference_ranks, c.async_lag = async_lag, c.num_iterations = 1;
  return c;
}

GPTConfig tiny_config() {
  GPTConfig config = gpt_preset("tiny");
  config.vocab_size = arithmetic_tokenizer().vocab_size();
  return config;
}

int seq_len_of(const TrainConfig& c) { return AdditionTask(c.digits, 0).max_text_length() - 1; }

std::vector<bf16_bits> bf16_of(const std::vector<float>& x) {
  std::vector<bf16_bits> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = float_to_bf16(x[i]);
  return out;
}

// The batch one rank samples alone for every prompt of step t from `weights`, its version 0 (the
// lag makes step t sample version 0, the newest it holds: from the device weights).
RolloutBatch sampled_alone(TrainConfig c, std::int64_t t, const std::vector<bf16_bits>& weights) {
  c.inference_ranks = 0, c.async_lag = int(t);
  const TensorTable table = gpt_tensor_table(tiny_config());
  Publisher versions(Communicator(MPI_COMM_SELF), table, c, SyncRole::sender, true);
  versions.start(weights, false);
  Generator alone(c, tiny_config(), seq_len_of(c), 0, 1, {});
  TransferCounter copies;
  double comm_s = 0;
  return alone.rollouts_for_step(t, versions, to_device(weights), copies, comm_s);
}

void expect_rows_of(const RolloutBatch& part, const RolloutBatch& whole, int first_row, int rows) {
  ASSERT_EQ(part.rows, rows);
  ASSERT_EQ(part.seq_len, whole.seq_len);
  EXPECT_EQ(part.group_size, whole.group_size);
  const std::size_t a = std::size_t(first_row) * whole.seq_len, e = a + std::size_t(rows) * whole.seq_len;
  EXPECT_EQ(part.tokens, std::vector<int>(whole.tokens.begin() + a, whole.tokens.begin() + e));
  EXPECT_EQ(part.targets, std::vector<int>(whole.targets.begin() + a, whole.targets.begin() + e));
  EXPECT_EQ(part.completion_mask,
            std::vector<std::uint8_t>(whole.completion_mask.begin() + a, whole.completion_mask.begin() + e));
  EXPECT_EQ(part.old_logprobs, std::vector<float>(whole.old_logprobs.begin() + a, whole.old_logprobs.begin() + e));
  EXPECT_EQ(part.rewards,
            std::vector<float>(whole.rewards.begin() + first_row, whole.rewards.begin() + first_row + rows));
}

// Steps 1 and 2 as pulse-train runs them: rollouts, then trainer 0 publishes version 1.
void check_routed_rollouts(int async_lag) {
  const Communicator world(MPI_COMM_WORLD);
  const int inference = world.size() / 2;
  const Layout layout{world.size() - inference, world.rank()};
  const TrainConfig c = rollout_config(inference, async_lag);
  const GPTConfig config = tiny_config();
  const TensorTable table = gpt_tensor_table(config);
  const std::vector<bf16_bits> v0 = bf16_of(gpt_init(config, 3));
  std::vector<bf16_bits> v1 = v0;
  sync::ChangeSet list;
  for (std::size_t i = 0; i < v1.size(); i += 97) list.indices.push_back(index_t(i)), list.new_bits.push_back(0x3f80);
  list.tensor_begin = sync::tensor_begins(list.indices, table.offsets());
  sync::apply_change_set(list, v1.data(), v1.size());
  list.old_bits.clear();

  const Communicator sync = world.split(layout.rank == 0 || !layout.trainer() ? 0 : 1, layout.rank);
  std::vector<Communicator> routes;
  for (int r = layout.num_trainers; r < world.size(); ++r)
    routes.push_back(world.split(layout.trainer() || layout.rank == r ? 0 : 1, layout.rank));
  const SyncRole role = layout.rank == 0 ? SyncRole::sender : layout.trainer() ? SyncRole::trainer : SyncRole::receiver;
  Publisher publisher(sync, table, c, role, inference == 0);
  publisher.start(layout.trainer() ? v0 : std::vector<bf16_bits>{}, false);
  Generator generator(c, config, seq_len_of(c), layout.rank, layout.num_trainers, routes);
  const int rows = c.prompts_per_step / layout.num_trainers * c.group_size;
  TransferCounter copies;
  double comm_s = 0;
  Kokkos::View<const bf16_bits*> device;
  if (layout.trainer()) device = to_device(v0);

  const RolloutBatch step1 = generator.rollouts_for_step(1, publisher, device, copies, comm_s);
  if (layout.trainer()) device = to_device(v1);  // the trainers' optimizer step
  publisher.publish(layout.rank == 0 ? &list : nullptr, device, copies);
  const RolloutBatch step2 = generator.rollouts_for_step(2, publisher, device, copies, comm_s);
  if (!layout.trainer()) {
    EXPECT_EQ(step1.rows, 0) << "inference ranks keep no batch";
    EXPECT_EQ(step2.rows, 0);
    return;
  }
  expect_rows_of(step1, sampled_alone(c, 1, v0), layout.rank * rows, rows);
  EXPECT_EQ(step1.policy_version, 0u);
  // Step 2 samples version 1, or with lag 1 version 0 again (from the versions kept on the host).
  expect_rows_of(step2, sampled_alone(c, 2, async_lag ? v0 : v1), layout.rank * rows, rows);
  EXPECT_EQ(step2.policy_version, async_lag ? 0u : 1u);
}

}  // namespace

TEST(GeneratorMpi, TrainersReceiveTheirRowsOfTheBatchOneRankSamplesAlone) { check_routed_rollouts(0); }

TEST(GeneratorMpi, WithAnAsyncLagTheRanksSampleTheVersionBefore) { check_routed_rollouts(1); }

// The prompts of a step split over 1, 2, 3 and 4 generating ranks, evenly and not: each part
// sampled by a Generator of its own, whose decoder holds as many rows as that rank's would (so a
// part runs in decoder chunks of other sizes, with padding rows beside it). Every row's tokens,
// rewards and logprobs are the bits of the batch one rank samples for all prompts.
TEST(Generator, AnySplitOfThePromptsGivesTheSameRowsBitForBit) {
  TrainConfig c = rollout_config(0, 0);
  c.prompts_per_step = 12;
  const GPTConfig config = tiny_config();
  const auto weights = to_device(bf16_of(gpt_init(config, 5)));
  Generator alone(c, config, seq_len_of(c), 0, 1, {});
  const RolloutBatch whole = alone.generate(3, 0, c.prompts_per_step, weights);
  const std::vector<std::vector<int>> splits = {{12}, {6, 6}, {4, 4, 4}, {3, 3, 3, 3}, {5, 7},
                                                {1, 11}, {2, 3, 7}, {1, 2, 4, 5}, {11, 1}};
  for (const std::vector<int>& split : splits) {
    const int ranks = static_cast<int>(split.size());
    int first = 0;
    for (int part : split) {
      // A trainer-only layout of `ranks` trainers sizes this rank's decoder for 12 / ranks prompts.
      Generator rank_generator(c, config, seq_len_of(c), 0, ranks, {});
      const RolloutBatch b = rank_generator.generate(3, first, part, weights);
      SCOPED_TRACE("split of " + std::to_string(ranks) + ", prompts from " + std::to_string(first));
      expect_rows_of(b, whole, first * c.group_size, part * c.group_size);
      first += part;
    }
  }
}
