#pragma once
// pulse-train's settings: every flag can also be set in a TOML file (--config), key = flag name
// without the dashes ("inference-ranks = 1"). train_options() is the one table of them (name,
// meaning, accepted values); the command line, --config, to_toml(), validate(), the resume check
// and docs/pulse-train.md (`pulse-train --print-options`) all read it. Defaults are TrainConfig's
// member initialisers.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/precision.hpp"
#include "loco/trainer_sync.hpp"
#include "train/measured_points.hpp"

namespace pulse {

struct TrainConfig {
  // run and files
  std::string out = "runs/train.h5";
  bool overwrite = false;
  bool resume = false;
  bool quiet = false;
  int checkpoint_every = 50;  // steps; 0: only on SIGTERM/SIGUSR1 and at the end
  // model and task
  std::string model = "tiny";
  std::string init;  // BF16 safetensors to start from (pulse-sft's model.safetensors); empty: random init
  int sft_steps = 0;  // > 0: when init does not exist, make it first by this many SFT steps (cached)
  std::uint64_t seed = 1;
  int digits = 2;
  // GRPO
  int steps = 100;
  double lr = 3e-6;
  int warmup_steps = 20;
  Precision precision = Precision::mixed;
  double weight_decay = 0.0;
  double grad_clip = 1.0;
  int prompts_per_step = 8;
  int group_size = 8;
  double temperature = 1.0;
  double clip_low = 0.2, clip_high = 0.28;
  int num_iterations = 1;  // mu: optimizer steps per rollout batch
  int async_lag = 0;       // S: rollouts used at step t come from weights version t - 1 - S
  // ranks and PULSESync
  int inference_ranks = 0;
  std::string relay;      // empty: patches go over MPI; else a relay directory
  int anchor_every = 10;  // relay: full anchor every K versions
  int keep_anchors = 2;   // relay: anchors kept (older anchors and their patches are removed)
  // measurement
  int eval_every = 10;   // greedy pass@1 on held-out problems every N steps (0: never)
  int eval_problems = 128;
  int absorption_every = 10;  // absorption histograms every N steps (0: never)
  // trainer-to-trainer synchronisation (DDP every step, or DiLoCo / PULSELoCo every H steps)
  loco::TrainerSync trainer_sync = loco::TrainerSync::ddp;
  int inner_steps = 8;
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  loco::SparseExchange sparse_exchange = loco::SparseExchange::allgather;
  double dense_threshold = 0.25;  // sparse-allreduce goes dense above this density
};

// Sizes beyond these are refused by validate(): their buffers would not fit in memory (or an
// int) and the run would fail only after its files exist.
inline constexpr int max_group_size = 1024;
inline constexpr long long max_rows_per_rank = 16384;  // completions one rank samples or trains on per step

// path as seen from the working folder when a config file at config_file names it.
std::string resolve_config_path(const std::string& config_file, const std::string& path);

// One setting: its flag (--name) and TOML key (name), its meaning, and the values validate()
// accepts; its default is TrainConfig's member initialiser.
struct TrainOption {
  std::string name, help;
  std::string range;  // the accepted values as --help and the docs say them ("" for any)
  // In to_toml() and so in the recorded settings; false for how this process starts (overwrite,
  // resume, quiet), which is not part of what the run is.
  bool recorded = true;
  // A path: relative in a --config file means relative to the file's folder.
  bool path = false;
  // A resumed run may change it: it changes neither the weights nor the statistics rows of the
  // steps both runs make (steps: the run only ends elsewhere, and the evaluation at the last step
  // moves with it; checkpoint-every: only when state is saved; out: where the files are, after
  // they were moved).
  bool resume_may_change = false;
  std::function<CLI::Option*(CLI::App&, TrainConfig&)> add;  // registers --name
  std::function<std::string(const TrainConfig&)> toml;       // the value as TOML text
  std::function<std::string(const TrainConfig&)> shown;      // the value as --help and the docs show it
  std::function<bool(const TrainConfig&)> in_range;
};
// In the order of --help and to_toml().
const std::vector<TrainOption>& train_options();
const TrainOption* find_train_option(const std::string& name);  // nullptr when there is none
// The table as Markdown (flag, default, accepted values, meaning): what docs/pulse-train.md holds.
std::string train_options_markdown();

void add_train_options(CLI::App& app, TrainConfig& config);
// Throws pulse::Error with a one-line reason; world_size is the MPI rank count. Also checks that
// --out's folder is writable, so that no run trains only to fail at its first file.
void validate(const TrainConfig& config, int world_size);

// Rollout rows (prompts x group size) each trainer trains on per step.
int rows_per_trainer(const TrainConfig& config, int num_trainers);
// The settings as TOML (what the HDF5 file records and --config reads back).
std::string to_toml(const TrainConfig& config);
// Settings from TOML text as --config reads it (unknown keys are errors); throws CLI::Error.
TrainConfig parse_toml(const std::string& toml);

// key -> value text of the "key = value" lines of a to_toml() text.
std::map<std::string, std::string> toml_values(const std::string& toml);
// Keys whose values differ between two to_toml() texts, sorted; a key on one side only counts.
std::vector<std::string> differing_keys(const std::string& a, const std::string& b);
// What changed from the settings a checkpoint recorded (a to_toml() text) to `now`, as
// "key old -> new, ..." ("" when nothing did). Throws pulse::Error naming every changed key that
// is not an option with resume_may_change.
std::string resume_changes(const std::string& recorded, const TrainConfig& now);

}  // namespace pulse
