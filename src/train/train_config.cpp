#include "train/train_config.hpp"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <type_traits>

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
      if (const TrainOption* option = find_train_option(item.name); item.inputs.size() == 1 && option && option->path)
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

namespace {

constexpr double inf = std::numeric_limits<double>::infinity();

// TOML keeps 17 significant digits (the same double back); --help and the docs show the shortest
// text that reads back as the same double.
std::string toml_number(double v) {
  std::ostringstream s;
  s.precision(17);
  s << v;
  return s.str();
}
std::string shortest_number(double v) {
  char text[32];
  return std::string(text, std::to_chars(text, text + sizeof text, v).ptr);
}

// The values an option accepts. Infinity and NaN never are.
struct Range {
  double low = -inf, high = inf;
  bool low_open = false, high_open = true;
  bool contains(double v) const {
    return std::isfinite(v) && (low_open ? v > low : v >= low) && (high_open ? v < high : v <= high);
  }
  // ">= 1", "> 0", "in 1..9" (integers), "in (0, 1)", "in [0, 1]"; "" for any.
  std::string text(bool integer) const {
    if (low == -inf) return "";
    if (high == inf) return (low_open ? "> " : ">= ") + shortest_number(low);
    if (integer) return "in " + shortest_number(low) + ".." + shortest_number(high);
    return std::string(low_open ? "in (" : "in [") + shortest_number(low) + ", " + shortest_number(high) + (high_open ? ")" : "]");
  }
};
Range at_least(double low) { return {low, inf, false, true}; }
Range above(double low) { return {low, inf, true, true}; }
Range in(double low, double high, bool low_open = false, bool high_open = false) {
  return {low, high, low_open, high_open};
}

std::string quoted(const std::string& v) { return "\"" + v + "\""; }

TrainOption row(const std::string& name, const std::string& help, const std::string& range) {
  TrainOption o;
  o.name = name, o.help = help, o.range = range;
  return o;
}

template <class T>
TrainOption number(const std::string& name, T TrainConfig::*member, const std::string& help, Range range = {}) {
  TrainOption o = row(name, help, range.text(std::is_integral_v<T>));
  const std::string shown_help = o.range.empty() ? help : help + " (" + o.range + ")";
  o.add = [name, member, shown_help](CLI::App& app, TrainConfig& c) {
    CLI::Option* option = app.add_option("--" + name, c.*member, shown_help);
    if constexpr (std::is_same_v<T, std::uint64_t>) option->check(cli::unsigned_decimal());
    return option;
  };
  o.toml = [member](const TrainConfig& c) {
    if constexpr (std::is_floating_point_v<T>) return toml_number(c.*member);
    else return std::to_string(c.*member);
  };
  o.shown = [member](const TrainConfig& c) {
    if constexpr (std::is_floating_point_v<T>) return shortest_number(c.*member);
    else return std::to_string(c.*member);
  };
  o.in_range = [member, range](const TrainConfig& c) { return range.contains(double(c.*member)); };
  return o;
}

// A text; choices, when given, are the values it may take.
TrainOption text(const std::string& name, std::string TrainConfig::*member, const std::string& help,
                 const std::vector<std::string>& choices = {}) {
  std::string range;
  for (const std::string& choice : choices) range += (range.empty() ? "" : ", ") + choice;
  TrainOption o = row(name, help, range);
  o.add = [name, member, help, choices](CLI::App& app, TrainConfig& c) {
    CLI::Option* option = app.add_option("--" + name, c.*member, help);
    if (!choices.empty()) option->check(CLI::IsMember(choices));
    return option;
  };
  o.toml = [member](const TrainConfig& c) { return quoted(c.*member); };
  o.shown = [member](const TrainConfig& c) { return c.*member; };
  o.in_range = [member, choices](const TrainConfig& c) {
    return choices.empty() || std::find(choices.begin(), choices.end(), c.*member) != choices.end();
  };
  return o;
}

TrainOption path(const std::string& name, std::string TrainConfig::*member, const std::string& help) {
  TrainOption o = text(name, member, help);
  o.path = true;
  return o;
}

// How this process starts: not recorded.
TrainOption flag(const std::string& name, bool TrainConfig::*member, const std::string& help) {
  TrainOption o = row(name, help, "");
  o.recorded = false;
  o.add = [name, member, help](CLI::App& app, TrainConfig& c) { return app.add_flag("--" + name, c.*member, help); };
  o.toml = o.shown = [member](const TrainConfig& c) { return std::string(c.*member ? "true" : "false"); };
  o.in_range = [](const TrainConfig&) { return true; };
  return o;
}

// A mode: an enum, written as the names of its table.
template <class E, std::size_t N>
TrainOption choice(const std::string& name, E TrainConfig::*member, const NamedValue<E> (&names)[N],
                   const std::string& help) {
  TrainOption o = row(name, help, names_text(names));
  o.add = [name, member, help, &names](CLI::App& app, TrainConfig& c) {
    return app
        .add_option_function<std::string>(
            "--" + name, [&c, member, &names](const std::string& value) { c.*member = *value_named(names, value); },
            help)
        ->check(CLI::IsMember(names_of(names)))
        ->default_str(name_of(names, c.*member));
  };
  o.toml = [member, &names](const TrainConfig& c) { return quoted(name_of(names, c.*member)); };
  o.shown = [member, &names](const TrainConfig& c) { return std::string(name_of(names, c.*member)); };
  o.in_range = [member, &names](const TrainConfig& c) { return *name_of(names, c.*member) != '\0'; };
  return o;
}

TrainOption may_change_on_resume(TrainOption o) {
  o.resume_may_change = true;
  return o;
}

std::vector<TrainOption> make_train_options() {
  using C = TrainConfig;
  return {
      // run and files
      may_change_on_resume(path("out", &C::out, "statistics file (HDF5); checkpoints go to OUT's stem + .ckpt/")),
      flag("overwrite", &C::overwrite, "replace an existing output"),
      flag("resume", &C::resume, "continue the run in --out from its last checkpoint"),
      flag("quiet", &C::quiet, "no per-step progress lines"),
      may_change_on_resume(number("checkpoint-every", &C::checkpoint_every,
                                  "steps between checkpoints (0: only on signals and at the end)", at_least(0))),
      // model and task
      text("model", &C::model, "GPT preset", {"tiny", "small", "base"}),
      path("init", &C::init,
           "BF16 weights to start from: a safetensors file (e.g. pulse-sft's model.safetensors) or a Hugging Face "
           "folder"),
      number("sft-steps", &C::sft_steps, "when --init does not exist, make it by this many SFT steps first (then cached)",
             at_least(0)),
      number("seed", &C::seed, "seed of initial weights, problems and sampling"),
      number("digits", &C::digits, "addition operands have up to this many digits", in(1, 9)),
      // GRPO
      may_change_on_resume(number("steps", &C::steps, "GRPO optimizer steps", at_least(1))),
      number("lr", &C::lr, "AdamW learning rate after warm-up", above(0)),
      number("warmup-steps", &C::warmup_steps, "linear learning-rate warm-up steps", at_least(0)),
      choice("precision", &C::precision, precision_names,
             "mixed: FP32 master weights; bf16: BF16 weights and Adam state"),
      number("weight-decay", &C::weight_decay, "AdamW weight decay", at_least(0)),
      number("grad-clip", &C::grad_clip, "clip the global gradient norm to this (0: off)", at_least(0)),
      number("prompts-per-step", &C::prompts_per_step, "prompts per rollout batch (all ranks together)", at_least(1)),
      number("group-size", &C::group_size, "sampled completions per prompt (advantages are relative within a group)",
             in(2, max_group_size)),
      number("temperature", &C::temperature, "sampling temperature", at_least(0)),
      number("clip-low", &C::clip_low, "DAPO ratio clip below 1", in(0, 1, true, true)),
      number("clip-high", &C::clip_high, "DAPO ratio clip above 1", above(0)),
      number("num-iterations", &C::num_iterations, "mu: optimizer steps per rollout batch (batch reuse)", at_least(1)),
      number("async-lag", &C::async_lag, "S: rollouts used at step t come from weights version t-1-S", at_least(0)),
      // ranks and PULSESync
      number("inference-ranks", &C::inference_ranks,
             "ranks that only generate rollouts (BF16 weights via PULSESync); fewer than the ranks", at_least(0)),
      path("relay", &C::relay, "relay directory for patches (default: MPI broadcast)"),
      number("anchor-every", &C::anchor_every, "relay: a full anchor every K versions", at_least(1)),
      number("keep-anchors", &C::keep_anchors, "relay: newest anchors kept (with the patches after them)", at_least(1)),
      // measurement
      number("eval-every", &C::eval_every, "greedy pass@1 on held-out problems every N steps (0: never)", at_least(0)),
      number("eval-problems", &C::eval_problems, "held-out problems per evaluation", in(1, 1 << 20)),
      number("absorption-every", &C::absorption_every, "absorption histograms every N steps (0: never)", at_least(0)),
      // trainer-to-trainer synchronisation
      choice("trainer-sync", &C::trainer_sync, loco::trainer_sync_names,
             "ddp: gradient allreduce every step; diloco, pulseloco: outer step every H"),
      number("inner-steps", &C::inner_steps, "H: inner steps per outer step (diloco, pulseloco)", at_least(1)),
      number("outer-lr", &C::outer_lr, "outer SGD learning rate (diloco, pulseloco)", above(0)),
      number("outer-momentum", &C::outer_momentum, "outer Nesterov momentum (diloco, pulseloco)", in(0, 1, false, true)),
      choice("sparse-exchange", &C::sparse_exchange, loco::sparse_exchange_names,
             "pulseloco: allgather of payloads, or a sparse allreduce"),
      number("dense-threshold", &C::dense_threshold, "pulseloco sparse-allreduce: go dense above this density",
             in(0, 1)),
  };
}

}  // namespace

const std::vector<TrainOption>& train_options() {
  static const std::vector<TrainOption> options = make_train_options();
  return options;
}

const TrainOption* find_train_option(const std::string& name) {
  for (const TrainOption& option : train_options())
    if (option.name == name) return &option;
  return nullptr;
}

std::string train_options_markdown() {
  const TrainConfig defaults;
  std::string table =
      "| flag (`--config` key) | default | accepted | on `--resume` | meaning |\n"
      "|---|---|---|---|---|\n";
  for (const TrainOption& o : train_options()) {
    const std::string shown = o.shown(defaults);
    table += "| `--" + o.name + "` | " + (shown.empty() ? "" : "`" + shown + "`") + " | " + o.range + " | " +
             (!o.recorded ? "not recorded" : o.resume_may_change ? "may change" : "must match") + " | " + o.help +
             " |\n";
  }
  return table;
}

void add_train_options(CLI::App& app, TrainConfig& c) {
  app.set_config("--config", "", "TOML file of settings (keys are flag names; relative paths in it are relative to its "
                                 "folder); flags given on the command line win");
  app.config_formatter(std::make_shared<ConfigFileReader>(app.get_config_ptr()));
  app.allow_config_extras(CLI::config_extras_mode::error);
  for (const TrainOption& option : train_options()) option.add(app, c);
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
  for (const TrainOption& o : train_options())
    check_positive(o.in_range(c), o.name + " must be " + o.range + ", got " + o.shown(c));
  check_positive(c.sft_steps == 0 || !c.init.empty(), "sft-steps needs init (the file it caches)");
  check_positive(c.trainer_sync == loco::TrainerSync::ddp || c.precision == Precision::mixed,
                 std::string("trainer-sync ") + loco::trainer_sync_name(c.trainer_sync) +
                     " needs precision mixed (FP32 local and global weights)");
  check_positive(!(c.overwrite && c.resume), "--overwrite and --resume exclude each other");
  for (const TrainOption& o : train_options())
    if (o.path) check_path(o.name, o.shown(c));
  check_output(c.out);
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
  PULSE_CHECK(c.trainer_sync == loco::TrainerSync::ddp || c.inference_ranks == 0,
              std::string("config: trainer-sync ") + loco::trainer_sync_name(c.trainer_sync) +
                  " runs without inference ranks (each trainer samples its own)");
}

std::string to_toml(const TrainConfig& c) {
  std::string toml;
  for (const TrainOption& o : train_options())
    if (o.recorded) toml += o.name + " = " + o.toml(c) + "\n";
  return toml;
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
    if (const TrainOption* option = find_train_option(key); !option || !option->resume_may_change)
      refused.push_back(key);
    changes.push_back(key + " " + value(before, key) + " -> " + value(after, key));
  }
  std::vector<std::string> changeable;
  for (const TrainOption& option : train_options())
    if (option.resume_may_change) changeable.push_back(option.name);
  PULSE_CHECK(refused.empty(), "--resume: settings differ from the checkpoint's in " + join(refused) + " (only " +
                                   join(changeable) + " may change)");
  return join(changes);
}

int rows_per_trainer(const TrainConfig& config, int num_trainers) {
  return config.prompts_per_step / num_trainers * config.group_size;
}

}  // namespace pulse
