// Writes the seed corpora of fuzz_train_config (TOML configs, FOLDER/config-*),
// fuzz_train_checkpoint (rank checkpoint files of step 3, FOLDER/checkpoint-*) and
// fuzz_latest_record (LATEST records, FOLDER/latest-*) into FOLDER.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "train/latest_record.hpp"
#include "train/rank_checkpoint.hpp"
#include "train/train_config.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s FOLDER\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  try {
    pulse::TrainConfig relay_run;
    relay_run.inference_ranks = 2, relay_run.relay = "runs/relay", relay_run.trainer_sync = pulse::loco::TrainerSync::pulseloco;
    relay_run.prompts_per_step = 16, relay_run.seed = 18446744073709551615ull, relay_run.lr = 1e-5;
    std::ofstream(dir + "/config-default.toml") << pulse::to_toml({});
    std::ofstream(dir + "/config-relay.toml") << pulse::to_toml(relay_run);
    std::ofstream(dir + "/config-short.toml") << "steps = 3\nmodel = \"small\"\n[section]\nquiet = true\n";
    std::ofstream(dir + "/latest-first") << pulse::format_latest({0, 1});
    std::ofstream(dir + "/latest-max") << pulse::format_latest({INT64_MAX, 4096});

    pulse::RankCheckpoint state;
    state.metadata = {{"program", "pulse-train"}, {"version", "3"}, {"ranks", "2"}, {"config", pulse::to_toml({})}};
    state.add("master", pulse::io::DType::F32, std::vector<float>{1.0f, -2.0f, 0.5f});
    state.add("weights", pulse::io::DType::BF16, std::vector<std::uint16_t>{0x3f80, 0xc000, 0x3f00});
    state.add("rollouts", pulse::io::DType::U8, std::vector<std::uint8_t>{});
    pulse::write_rank_checkpoint(dir + "/checkpoint-trainer.safetensors", 3, state);
    pulse::RankCheckpoint inference;
    inference.metadata = {{"resumes", "after step 2 at 2026-01-01T00:00:00Z: steps 2 -> 3\n"}};
    inference.add("history.0", pulse::io::DType::BF16, std::vector<std::uint16_t>{1, 2, 3, 4});
    pulse::write_rank_checkpoint(dir + "/checkpoint-inference.safetensors", 3, inference);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
