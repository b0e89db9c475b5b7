#include "train/train_config.hpp"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "cli/unsigned_option.hpp"
#include "core/error.hpp"

namespace pulse {

namespace {

// Reads --config files as CLI11's TOML reader does, then makes their relative paths relative to
// the file's folder. CLI11 applies a config value only to options the command line left unset,
// so paths typed on the command line stay relative to the working folder.
class ConfigFileReader : public CLI::ConfigTOML {
 public:
  explicit ConfigFileReader(const CLI::Option* config_option) : config_option_(config_option) {}
  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override {
    std::vector<CLI::ConfigItem> items = CLI::ConfigTOML::from_config(input);
    // CLI11 lets the first of two equal keys win, silently: a typo'd copy would be ignored.
    std::set<std::string> seen;
    for (const CLI::ConfigItem& item : items)
      if (!seen.insert(item.fullname()).second)
        throw CLI::ConfigError("config: '" + item.fullname() + "' is given twice");
    const std::string file = config_option_->as<std::string>();
    if (file.empty()) return items;  // parse_toml(): recorded settings, whose paths are resolved already
    for (CLI::ConfigItem& item : items)
      if (item.inputs.size() == 1 && std::find(config_path_keys.begin(), config_path_keys.end(), item.name) != config_path_keys.end())
        item.inputs[0] = resolve_config_path(file, item.inputs[0]);
    return items;
  }

 private:
  const CLI::Option* config_option_;
};

}  // namespace

std::string resolve_config_path(const std::string& config_file, const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty() || fs::path(path).is_absolute()) return path;
  // Lexically normal ("jobs/configs/../../runs/x" -> "runs/x"), so that the recorded settings
  // read as the user would write them.
  return (fs::path(config_file).parent_path() / path).lexically_normal().string();
}

void add_train_options(CLI::App& app, TrainConfig& c) {
  app.set_config("--config", "", "TOML file of settings (keys are flag names; relative paths in it are relative to its "
                                 "folder); flags given on the command line win");
  app.config_formatter(std::make_shared<ConfigFileReader>(app.get_config_ptr()));
  app.allow_config_extras(CLI::config_extras_mode::error);
  app.add_option("--out", c.out, "statistics file (HDF5); checkpoints go to OUT's stem + .ckpt/");
  app.add_flag("--overwrite", c.overwrite, "replace an existing output");
  app.add_flag("--resume", c.resume, "continue the run in --out from its last checkpoint");
  app.add_flag("--quiet", c.quiet, "no per-step progress lines");
  app.add_option("--checkpoint-every", c.checkpoint_every, "steps between checkpoints (0: only on signals and at the end)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--model", c.model, "GPT preset")->check(CLI::IsMember({"tiny", "small", "base"}));
  app.add_option("--init", c.init, "BF16 weights to start from: a safetensors file (e.g. pulse-sft's model.safetensors) or a Hugging Face folder");
  app.add_option("--sft-steps", c.sft_steps, "when --init does not exist, make it by this many SFT steps first (then cached)");
  app.add_option("--seed", c.seed, "seed of initial weights, problems and sampling")->check(cli::unsigned_decimal());
  app.add_option("--digits", c.digits, "addition operands have up to this many digits");
  app.add_option("--steps", c.steps, "GRPO optimizer steps");
  app.add_option("--lr", c.lr, "AdamW learning rate after warm-up");
  app.add_option("--warmup-steps", c.warmup_steps, "linear learning-rate warm-up steps");
  app.add_option("--precision", c.precision, "mixed: FP32 master weights; bf16: BF16 weights and Adam state")
      ->check(CLI::IsMember({"mixed", "bf16"}));
  app.add_option("--weight-decay", c.weight_decay, "AdamW weight decay");
  app.add_option("--grad-clip", c.grad_clip, "clip the global gradient norm to this (0: off)");
  app.add_option("--prompts-per-step", c.prompts_per_step, "prompts per rollout batch (all ranks together)");
  app.add_option("--group-size", c.group_size, "sampled completions per prompt");
  app.add_option("--temperature", c.temperature, "sampling temperature");
  app.add_option("--clip-low", c.clip_low, "DAPO ratio clip below 1");
  app.add_option("--clip-high", c.clip_high, "DAPO ratio clip above 1");
  app.add_option("--num-iterations", c.num_iterations, "mu: optimizer steps per rollout batch (batch reuse)");
  app.add_option("--async-lag", c.async_lag, "S: rollouts used at step t come from weights version t-1-S");
  app.add_option("--inference-ranks", c.inference_ranks, "ranks that only generate rollouts (BF16 weights via PULSESync)");
  app.add_option("--relay", c.relay, "relay directory for patches (default: MPI broadcast)");
  app.add_option("--anchor-every", c.anchor_every, "relay: a full anchor every K versions");
  app.add_option("--keep-anchors", c.keep_anchors, "relay: newest anchors kept (with the patches after them)");
  app.add_option("--eval-every", c.eval_every, "greedy pass@1 on held-out problems every N steps (0: never)");
  app.add_option("--eval-problems", c.eval_problems, "held-out problems per evaluation");
  app.add_option("--absorption-every", c.absorption_every, "absorption histograms every N steps (0: never)");
  app.add_option("--trainer-sync", c.trainer_sync, "ddp: gradient allreduce every step; diloco, pulseloco: outer step every H")
      ->check(CLI::IsMember({"ddp", "diloco", "pulseloco"}));
  app.add_option("--inner-steps", c.inner_steps, "H: inner steps per outer step (diloco, pulseloco)");
  app.add_option("--outer-lr", c.outer_lr, "outer SGD learning rate (diloco, pulseloco)");
  app.add_option("--outer-momentum", c.outer_momentum, "outer Nesterov momentum (diloco, pulseloco)");
  app.add_option("--sparse-exchange", c.sparse_exchange, "pulseloco: allgather of payloads, or a sparse allreduce")
      ->check(CLI::IsMember({"allgather", "sparse-allreduce"}));
  app.add_option("--dense-threshold", c.dense_threshold, "pulseloco sparse-allreduce: go dense above this density");
}

namespace {

void check_positive(bool ok, const std::string& what) { PULSE_CHECK(ok, "config: " + what); }

// Paths are recorded in the TOML config (HDF5 attribute, checkpoint JSON): valid UTF-8, and no
// quote, backslash or control character that the TOML string would need to escape.
bool recordable_text(const std::string& s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f || c == '"' || c == '\\') return false;
    const int extra = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : -1;
    if (extra < 0 || s.size() - i <= std::size_t(extra)) return false;
    std::uint32_t code = extra == 0 ? c : c & (0x3F >> extra);
    for (int k = 1; k <= extra; ++k) {
      const auto next = static_cast<unsigned char>(s[i + k]);
      if ((next & 0xC0) != 0x80) return false;
      code = code << 6 | (next & 0x3F);
    }
    const std::uint32_t least[] = {0, 0x80, 0x800, 0x10000};  // overlong encodings are invalid
    if (code < least[extra] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return false;
    i += extra + 1;
  }
  return true;
}

void check_path(const std::string& flag, const std::string& path) {
  PULSE_CHECK(recordable_text(path), "config: " + flag + " must be UTF-8 without quotes, backslashes or control characters");
}

// --out and the checkpoint folder next to it must be creatable before anything is written.
void check_output(const std::string& out) {
  namespace fs = std::filesystem;
  check_path("out", out);
  const fs::path p(out);
  PULSE_CHECK(!out.empty() && p.has_filename() && !p.stem().empty(), "config: out '" + out + "' names no file");
  std::error_code ec;
  PULSE_CHECK(!fs::is_directory(p, ec), "config: out '" + out + "' is a folder");
  const fs::path folder = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  PULSE_CHECK(fs::is_directory(folder, ec) && ::access(folder.c_str(), W_OK | X_OK) == 0,
              "config: out's folder '" + folder.string() + "' is not a writable folder");
  const fs::path ckpt = folder / (p.stem().string() + ".ckpt");
  PULSE_CHECK(!fs::exists(ckpt, ec) || fs::is_directory(ckpt, ec),
              "config: '" + ckpt.string() + "' (the checkpoint folder of out) exists and is not a folder");
}

}  // namespace

void validate(const TrainConfig& c, int world_size) {
  check_positive(c.sft_steps >= 0 && (c.sft_steps == 0 || !c.init.empty()), "sft-steps needs init (the file it caches)");
  check_positive(c.steps >= 1, "steps must be at least 1, got " + std::to_string(c.steps));
  check_positive(std::isfinite(c.lr) && c.lr > 0, "lr must be a positive number, got " + std::to_string(c.lr));
  check_positive(c.warmup_steps >= 0, "warmup-steps must be >= 0");
  check_positive(std::isfinite(c.weight_decay) && c.weight_decay >= 0, "weight-decay must be >= 0");
  check_positive(std::isfinite(c.grad_clip) && c.grad_clip >= 0, "grad-clip must be >= 0");
  check_positive(c.digits >= 1 && c.digits <= 9, "digits must be in 1..9, got " + std::to_string(c.digits));
  check_positive(c.prompts_per_step >= 1, "prompts-per-step must be at least 1");
  check_positive(c.group_size >= 2, "group-size must be at least 2 (advantages are relative within a group)");
  check_positive(c.group_size <= max_group_size, "group-size must be at most " + std::to_string(max_group_size) +
                                                     ", got " + std::to_string(c.group_size));
  check_positive(std::isfinite(c.temperature) && c.temperature >= 0, "temperature must be >= 0");
  check_positive(c.clip_low > 0 && c.clip_low < 1 && c.clip_high > 0, "clip-low must be in (0, 1) and clip-high > 0");
  check_positive(c.num_iterations >= 1, "num-iterations must be at least 1");
  check_positive(c.async_lag >= 0, "async-lag must be >= 0");
  check_positive(c.checkpoint_every >= 0, "checkpoint-every must be >= 0");
  check_positive(c.anchor_every >= 1 && c.keep_anchors >= 1, "anchor-every and keep-anchors must be at least 1");
  check_positive(c.eval_every >= 0 && c.eval_problems >= 1, "eval-every must be >= 0 and eval-problems >= 1");
  check_positive(c.absorption_every >= 0, "absorption-every must be >= 0");
  check_positive(c.inner_steps >= 1, "inner-steps must be at least 1");
  check_positive(std::isfinite(c.outer_lr) && c.outer_lr > 0, "outer-lr must be positive");
  check_positive(c.outer_momentum >= 0 && c.outer_momentum < 1, "outer-momentum must be in [0, 1)");
  check_positive(c.dense_threshold >= 0 && c.dense_threshold <= 1, "dense-threshold must be in [0, 1]");
  check_positive(c.trainer_sync == "ddp" || c.precision == "mixed",
                 "trainer-sync " + c.trainer_sync + " needs precision mixed (FP32 local and global weights)");
  check_positive(!(c.overwrite && c.resume), "--overwrite and --resume exclude each other");
  check_positive(c.eval_problems <= 1 << 20, "eval-problems must be at most 1048576");
  check_output(c.out);
  check_path("init", c.init);
  check_path("relay", c.relay);
  std::error_code ec;
  PULSE_CHECK(c.relay.empty() || c.resume || !std::filesystem::exists(c.relay, ec) ||
                  (std::filesystem::is_directory(c.relay, ec) && std::filesystem::is_empty(c.relay, ec)),
              "config: relay '" + c.relay + "' is not an empty folder: it holds another run's versions "
              "(continue that run with --resume, or give a new folder)");
  PULSE_CHECK(c.inference_ranks >= 0 && c.inference_ranks < world_size,
              "config: inference-ranks " + std::to_string(c.inference_ranks) + " leaves no trainer among " +
                  std::to_string(world_size) + " ranks");
  const int trainers = world_size - c.inference_ranks;
  PULSE_CHECK(c.prompts_per_step % trainers == 0, "config: prompts-per-step " + std::to_string(c.prompts_per_step) +
                                                      " is not a multiple of the " + std::to_string(trainers) +
                                                      " trainer ranks");
  if (c.inference_ranks > 0)
    PULSE_CHECK(c.prompts_per_step % c.inference_ranks == 0,
                "config: prompts-per-step " + std::to_string(c.prompts_per_step) + " is not a multiple of the " +
                    std::to_string(c.inference_ranks) + " inference ranks");
  // In 64 bits: prompts-per-step x group-size overflows an int long before it fits in memory.
  const int samplers = c.inference_ranks > 0 ? c.inference_ranks : trainers;
  const long long rows = (long long)c.prompts_per_step / std::min(trainers, samplers) * c.group_size;
  PULSE_CHECK(rows <= max_rows_per_rank, "config: prompts-per-step " + std::to_string(c.prompts_per_step) +
                                             " x group-size " + std::to_string(c.group_size) + " gives " +
                                             std::to_string(rows) + " completions on one rank, more than " +
                                             std::to_string(max_rows_per_rank));
  PULSE_CHECK(c.trainer_sync == "ddp" || c.inference_ranks == 0,
              "config: trainer-sync " + c.trainer_sync + " runs without inference ranks (each trainer samples its own)");
}

std::string to_toml(const TrainConfig& c) {
  std::ostringstream s;
  s.precision(17);
  auto str = [](const std::string& v) { return "\"" + v + "\""; };
  s << "out = " << str(c.out) << "\ncheckpoint-every = " << c.checkpoint_every << "\nmodel = " << str(c.model)
 << "\ninit = " << str(c.init) << "\nsft-steps = " << c.sft_steps << "\nseed = " << c.seed << "\ndigits = " << c.digits << "\nsteps = " << c.steps
    << "\nlr = " << c.lr << "\nwarmup-steps = " << c.warmup_steps << "\nprecision = " << str(c.precision)
    << "\nweight-decay = " << c.weight_decay << "\ngrad-clip = " << c.grad_clip
    << "\nprompts-per-step = " << c.prompts_per_step << "\ngroup-size = " << c.group_size
    << "\ntemperature = " << c.temperature << "\nclip-low = " << c.clip_low << "\nclip-high = " << c.clip_high
    << "\nnum-iterations = " << c.num_iterations << "\nasync-lag = " << c.async_lag
    << "\ninference-ranks = " << c.inference_ranks << "\nrelay = " << str(c.relay)
    << "\nanchor-every = " << c.anchor_every << "\nkeep-anchors = " << c.keep_anchors << "\neval-every = " << c.eval_every
    << "\neval-problems = " << c.eval_problems << "\nabsorption-every = " << c.absorption_every
    << "\ntrainer-sync = " << str(c.trainer_sync) << "\ninner-steps = " << c.inner_steps
    << "\nouter-lr = " << c.outer_lr << "\nouter-momentum = " << c.outer_momentum
    << "\nsparse-exchange = " << str(c.sparse_exchange) << "\ndense-threshold = " << c.dense_threshold << "\n";
  return s.str();
}

TrainConfig parse_toml(const std::string& toml) {
  TrainConfig config;
  CLI::App app;
  add_train_options(app, config);
  std::istringstream in(toml);
  app.parse_from_stream(in);
  return config;
}

std::map<std::string, std::string> toml_values(const std::string& toml) {
  std::map<std::string, std::string> values;
  std::istringstream in(toml);
  for (std::string line; std::getline(in, line);) {
    const auto eq = line.find(" = ");
    if (eq != std::string::npos) values[line.substr(0, eq)] = line.substr(eq + 3);
  }
  return values;
}

std::vector<std::string> differing_keys(const std::string& a, const std::string& b) {
  const auto va = toml_values(a), vb = toml_values(b);
  std::vector<std::string> keys;
  for (const auto& [key, value] : va) {
    const auto it = vb.find(key);
    if (it == vb.end() || it->second != value) keys.push_back(key);
  }
  for (const auto& [key, value] : vb)
    if (!va.count(key)) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  return keys;
}

std::string resume_changes(const std::string& recorded, const TrainConfig& now) {
  const std::string current = to_toml(now);
  const auto before = toml_values(recorded), after = toml_values(current);
  auto value = [](const std::map<std::string, std::string>& values, const std::string& key) {
    const auto it = values.find(key);
    return it == values.end() ? std::string("(none)") : it->second;
  };
  auto join = [](const std::vector<std::string>& items) {
    std::string out;
    for (const std::string& item : items) out += (out.empty() ? "" : ", ") + item;
    return out;
  };
  std::vector<std::string> refused, changes;
  for (const std::string& key : differing_keys(recorded, current)) {
    if (std::find(resume_changeable_keys.begin(), resume_changeable_keys.end(), key) == resume_changeable_keys.end())
      refused.push_back(key);
    changes.push_back(key + " " + value(before, key) + " -> " + value(after, key));
  }
  PULSE_CHECK(refused.empty(), "--resume: settings differ from the checkpoint's in " + join(refused) + " (only " +
                                   join(resume_changeable_keys) + " may change)");
  return join(changes);
}

int rows_per_trainer(const TrainConfig& config, int num_trainers) {
  return config.prompts_per_step / num_trainers * config.group_size;
}

}  // namespace pulse
