// pulse-train's trainer role (src/train/trainer) at np 1, 2 and 4, for DDP, DiLoCo and PULSELoCo
// (an outer step after every inner step): a trainer restored from a checkpoint takes the next
// step bit for bit as the one that went on, so the checkpointed buffers are all of its state;
// every trainer holds the same weights after an outer step (DDP: after every step).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "comm/collectives.hpp"
#include "kernels/host_copy.hpp"
#include "model/gpt.hpp"
#include "rl/task.hpp"
#include "rl/tokenizer.hpp"
#include "train/generator.hpp"
#include "train/publisher.hpp"
#include "train/trainer.hpp"

using namespace pulse;

namespace {

std::vector<std::uint8_t> bytes_of(const RankCheckpoint& state) {
  std::vector<std::uint8_t> out;
  for (const CheckpointBuffer& b : state.buffers) {
    out.insert(out.end(), b.name.begin(), b.name.end());
    for (const std::byte x : b.bytes) out.push_back(std::uint8_t(x));
  }
  for (const auto& [key, value] : state.metadata) out.insert(out.end(), value.begin(), value.end());
  return out;
}

// Every trainer's weights equal trainer 0's.
bool same_on_every_trainer(const Communicator& trainers, const std::vector<bf16_bits>& mine) {
  std::vector<bf16_bits> first = mine;
  broadcast(trainers, as_view(first.data(), first.size()), 0, Channel::control);
  return allreduce_value(trainers, int(first == mine), ReduceOp::min) == 1;
}

void check_resume(const std::string& mode) {
  const Communicator world(MPI_COMM_WORLD);
  TrainConfig c;
  c.digits = 1, c.seed = 5, c.prompts_per_step = 4, c.group_size = 4, c.lr = 1e-3, c.warmup_steps = 0;
  c.trainer_sync = loco::parse_trainer_sync(mode), c.inner_steps = 1;
  GPTConfig config = gpt_preset("tiny");
  config.vocab_size = arithmetic_tokenizer().vocab_size();
  const TensorTable table = gpt_tensor_table(config);
  const int seq_len = AdditionTask(c.digits, 0).max_text_length() - 1;
  const int rows = c.prompts_per_step / world.size() * c.group_size;
  const std::vector<float> initial = gpt_init(config, 11);

  Trainer going_on(c, world, config, table, rows, seq_len, initial, nullptr);
  // This trainer's own rollouts from the initial weights (no inference ranks).
  Publisher versions(Communicator(MPI_COMM_SELF), table, c, SyncRole::trainer, true);
  Generator generator(c, config, seq_len, world.rank(), world.size(), {});
  TransferCounter copies;
  double comm_s = 0;
  RolloutBatch batch = generator.rollouts_for_step(1, versions, going_on.weights(), copies, comm_s);
  // Random weights earn no reward; rewards that vary within each group give the loss a gradient.
  for (std::size_t r = 0; r < batch.rewards.size(); ++r) batch.rewards[r] = float(r % 2);
  going_on.set_batch(batch);
  const std::vector<bf16_bits> before = to_host(going_on.weights());
  going_on.step(1, false, copies);
  RankCheckpoint state;
  going_on.save(state);
  const std::vector<bf16_bits> after_1 = to_host(going_on.weights());
  ASSERT_NE(after_1, before) << mode << ": the first step changes no weight";
  EXPECT_TRUE(same_on_every_trainer(world, after_1)) << mode;

  Trainer restored(c, world, config, table, rows, seq_len, initial, &state);
  EXPECT_EQ(restored.batch().serialize(), going_on.batch().serialize()) << mode;
  EXPECT_EQ(to_host(restored.weights()), after_1) << mode;
  const TrainStepResult a = going_on.step(2, false, copies);
  const TrainStepResult b = restored.step(2, false, copies);
  EXPECT_EQ(a.outer_step, mode != "ddp") << mode;
  EXPECT_EQ(a.loss, b.loss) << mode;
  EXPECT_EQ(a.grad_norm, b.grad_norm) << mode;
  const std::vector<bf16_bits> after_2 = to_host(going_on.weights());
  EXPECT_NE(after_2, after_1) << mode << ": the second step changes no weight";
  EXPECT_EQ(to_host(restored.weights()), after_2) << mode;
  EXPECT_TRUE(same_on_every_trainer(world, after_2)) << mode;
  RankCheckpoint state_a, state_b;
  going_on.save(state_a);
  restored.save(state_b);
  EXPECT_EQ(bytes_of(state_a), bytes_of(state_b)) << mode << ": master, Adam state and outer buffers";
}

}  // namespace

TEST(TrainerMpi, RestoredFromACheckpointTheNextStepIsBitIdenticalDdp) { check_resume("ddp"); }
TEST(TrainerMpi, RestoredFromACheckpointTheNextStepIsBitIdenticalDiloco) { check_resume("diloco"); }
TEST(TrainerMpi, RestoredFromACheckpointTheNextStepIsBitIdenticalPulseloco) { check_resume("pulseloco"); }
