// SftTrainer, the supervised warm start shared by pulse-sft and pulse-train: it learns, it is
// deterministic, it never trains on held-out problems, and its checkpoint reads back bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <numeric>
#include <unistd.h>

#include "core/error.hpp"
#include "io/safetensors.hpp"
#include "kernels/host_copy.hpp"
#include "rl/sft_trainer.hpp"

namespace {

pulse::GPTConfig tiny_config() {
  pulse::GPTConfig c = pulse::gpt_preset("tiny");
  c.vocab_size = pulse::arithmetic_tokenizer().vocab_size();
  return c;
}

pulse::SftOptions short_run(int digits, int steps) {
  pulse::SftOptions o;
  o.digits = digits;
  o.steps = steps;
  return o;
}

}  // namespace

TEST(SftTrainer, LossFallsOnOneDigitAddition) {
  pulse::SftTrainer trainer(tiny_config(), short_run(1, 100));
  EXPECT_EQ(trainer.options().warmup, 10);  // clamped to steps / 10
  std::vector<double> losses;
  for (int i = 0; i < 100; ++i) losses.push_back(trainer.step());
  EXPECT_EQ(trainer.steps_done(), 100);
  const double first = std::accumulate(losses.begin(), losses.begin() + 10, 0.0) / 10;
  const double last = std::accumulate(losses.end() - 10, losses.end(), 0.0) / 10;
  // From near ln 13 = 2.56 (uniform over the vocabulary; 2.13 over the first ten) to well below.
  EXPECT_GT(first, 1.8);
  EXPECT_LT(last, 0.6 * first) << "first " << first << ", last " << last;
}

TEST(SftTrainer, SameOptionsGiveBitIdenticalWeights) {
  const pulse::SftOptions o = short_run(2, 200);
  pulse::SftOptions other_seed = o;
  other_seed.seed = 2;
  pulse::SftTrainer a(tiny_config(), o), b(tiny_config(), o), c(tiny_config(), other_seed);
  for (int i = 0; i < 15; ++i) {
    const double la = a.step(), lb = b.step();
    ASSERT_EQ(std::memcmp(&la, &lb, sizeof la), 0) << "step " << i + 1;
    c.step();
  }
  const auto wa = pulse::to_host(a.weights()), wb = pulse::to_host(b.weights()), wc = pulse::to_host(c.weights());
  ASSERT_EQ(wa.size(), std::size_t(a.table().num_elements()));
  EXPECT_EQ(wa, wb);
  EXPECT_NE(wa, wc);  // the seed matters, so equality above is not vacuous
  // weights() is bf16(master): the FP32 master moved away from its BF16 rounding somewhere.
  const auto master = pulse::to_host(a.master());
  std::size_t inexact = 0;
  for (std::size_t i = 0; i < master.size(); ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, &master[i], sizeof bits);
    inexact += (bits & 0xFFFFu) != 0;
  }
  EXPECT_GT(inexact, master.size() / 2);
}

TEST(SftTrainer, HeldOutProblemsAreNeverTrainedOn) {
  // a < 25: exactly a quarter of the 2-digit problem space, the largest set still excluded.
  std::set<std::pair<std::int64_t, std::int64_t>> held_out;
  for (std::int64_t a = 0; a < 25; ++a)
    for (std::int64_t b = 0; b < 100; ++b) held_out.insert({a, b});
  pulse::SftOptions o = short_run(2, 100);
  o.batch = 64;
  pulse::SftTrainer with(tiny_config(), o, held_out), without(tiny_config(), o);
  ASSERT_TRUE(with.excludes_held_out());
  EXPECT_TRUE(with.last_batch().empty());
  int hits_with = 0, hits_without = 0;
  for (int i = 0; i < 8; ++i) {
    with.step(), without.step();
    ASSERT_EQ(with.last_batch().size(), std::size_t(o.batch));
    for (const auto& p : with.last_batch()) hits_with += held_out.count({p.a, p.b});
    for (const auto& p : without.last_batch()) hits_without += held_out.count({p.a, p.b});
  }
  EXPECT_EQ(hits_with, 0);
  EXPECT_GT(hits_without, 64) << "about a quarter of 512 samples should hit the set when it is not excluded";

  // One more problem and the set would crowd out training: it is kept but not excluded.
  held_out.insert({25, 0});
  pulse::SftTrainer crowded(tiny_config(), o, held_out);
  EXPECT_FALSE(crowded.excludes_held_out());
}

TEST(SftTrainer, RejectsBadConfigAndDivergence) {
  pulse::GPTConfig wrong_vocab = pulse::gpt_preset("tiny");  // 256, not the tokenizer's 13
  EXPECT_THROW(pulse::SftTrainer(wrong_vocab, short_run(1, 10)), pulse::Error);
  pulse::GPTConfig short_context = tiny_config();
  short_context.max_seq_len = 8;  // 2-digit "aa+bb=ccc$" needs 10 inputs
  EXPECT_THROW(pulse::SftTrainer(short_context, short_run(2, 10)), pulse::Error);

  pulse::SftOptions wild = short_run(1, 10);
  wild.lr = 1e30, wild.warmup = 1;  // the first update overflows the weights
  pulse::SftTrainer trainer(tiny_config(), wild);
  bool threw = false;
  for (int i = 0; i < 5 && !threw; ++i) {
    try {
      trainer.step();
    } catch (const pulse::Error& e) {
      threw = true;
      EXPECT_NE(std::string(e.what()).find("diverged at step " + std::to_string(trainer.steps_done() + 1)),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_TRUE(threw);
}

TEST(SftTrainer, CheckpointRoundTrips) {
  pulse::SftTrainer trainer(tiny_config(), short_run(2, 100));
  for (int i = 0; i < 3; ++i) trainer.step();
  const auto dir = std::filesystem::temp_directory_path() / ("pulse_test_sft_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "model.safetensors").string();
  pulse::write_sft_checkpoint(path, trainer, "tiny");
  {
    const auto file = pulse::io::SafetensorsFile::open(path);
    const auto weights = pulse::to_host(trainer.weights());
    const auto& table = trainer.table().tensors();
    ASSERT_EQ(file.tensors().size(), table.size());
    for (std::size_t i = 0; i < table.size(); ++i) {
      const pulse::io::TensorView& t = file.tensors()[i];  // data order is table order
      EXPECT_EQ(t.name, table[i].name);
      EXPECT_EQ(t.dtype, pulse::io::DType::BF16);
      EXPECT_EQ(t.shape, std::vector<std::int64_t>(table[i].shape.begin(), table[i].shape.end()));
      ASSERT_EQ(t.bytes, std::size_t(table[i].numel) * sizeof(pulse::bf16_bits));
      EXPECT_EQ(std::memcmp(t.data, weights.data() + table[i].offset, t.bytes), 0) << t.name;
    }
    const auto& meta = file.metadata();
    EXPECT_EQ(meta.at("program"), "pulse-sft");
    EXPECT_EQ(meta.at("model"), "tiny");
    EXPECT_EQ(meta.at("alphabet"), "0123456789+=$");
    EXPECT_EQ(meta.at("digits"), "2");
    EXPECT_EQ(meta.at("steps"), "3");
    EXPECT_EQ(meta.at("vocab_size"), "13");
    EXPECT_EQ(meta.at("channels"), std::to_string(trainer.config().channels));
    EXPECT_EQ(meta.at("tied_lm_head"), "true");
  }
  std::filesystem::remove_all(dir);
}
