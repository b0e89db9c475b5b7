#pragma once
// pulse-train's settings: every flag can also be set in a TOML file (--config), key = flag name
// without the dashes ("inference-ranks = 1"). add_train_options() registers them all on a CLI11
// app, so `pulse-train --help` documents each; validate() checks everything that can be checked
// before a file is created.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

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
  std::string precision = "mixed";  // mixed: FP32 master + BF16 copy; bf16: BF16 weights and state
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
  std::string trainer_sync = "ddp";
  int inner_steps = 8;
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  std::string sparse_exchange = "allgather";  // pulseloco: allgather | sparse-allreduce
  double dense_threshold = 0.25;              // sparse-allreduce goes dense above this density
};

// k-step distances and gradient thresholds every run measures.
inline const std::vector<int> kstep_values = {1, 2, 4, 8, 16, 32};
inline const std::vector<float> grad_thresholds = {0.0f, 1e-10f, 1e-8f, 1e-6f};
inline const std::vector<double> adam_quantiles = {0.5, 0.9, 0.99, 0.999};

// Sizes beyond these are refused by validate(): their buffers would not fit in memory (or an
// int) and the run would fail only after its files exist.
inline constexpr int max_group_size = 1024;
inline constexpr long long max_rows_per_rank = 16384;  // completions one rank samples or trains on per step

// Keys whose values are paths. In a --config file a relative one is relative to the file's folder.
inline const std::vector<std::string> config_path_keys = {"out", "init", "relay"};
// path as seen from the working folder when a config file at config_file names it.
std::string resolve_config_path(const std::string& config_file, const std::string& path);

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
// Keys a resumed run may change: they cannot change the weights or the statistics rows of the
// steps both runs make (steps: the run only ends elsewhere, and the evaluation at the last step
// moves with it; checkpoint-every: only when state is saved; out: where the files are, after
// they were moved).
inline const std::vector<std::string> resume_changeable_keys = {"steps", "checkpoint-every", "out"};
// What changed from the settings a checkpoint recorded (a to_toml() text) to `now`, as
// "key old -> new, ..." ("" when nothing did). Throws pulse::Error naming every changed key
// outside resume_changeable_keys.
std::string resume_changes(const std::string& recorded, const TrainConfig& now);

}  // namespace pulse
