// pulse-train's settings (src/train/train_config): TOML text sets every kind of value, values of
// the wrong type or outside their choices are parse errors, and validate() refuses each setting
// just outside its range (accepting the value at the edge) with a one-line message naming it;
// TOML round trips, overflowing batches, paths that cannot be recorded, used relays and the
// resume comparison.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>

#include "core/error.hpp"
#include "train/train_config.hpp"
#include "support/temp_dir.hpp"

using namespace pulse;
namespace fs = std::filesystem;

namespace {

using test::TempDir;

TrainConfig valid_config(const TempDir& dir) {
  TrainConfig c;
  c.out = (dir.path / "run.h5").string();
  return c;
}

std::string validate_error(const TrainConfig& c, int world_size = 1) {
  try {
    validate(c, world_size);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(TrainConfigParse, TomlSetsEveryKindOfValue) {
  const TrainConfig c = parse_toml(
      "steps = 7\nlr = 2.5e-4\nprecision = \"bf16\"\nrelay = \"some/dir\"\nseed = 18446744073709551615\n"
      "overwrite = true\ntrainer-sync = \"pulseloco\"\nsparse-exchange = \"sparse-allreduce\"\n"
      "# a comment\n\ninference-ranks = 1\n");
  EXPECT_EQ(c.steps, 7);
  EXPECT_EQ(c.lr, 2.5e-4);
  EXPECT_EQ(c.precision, Precision::bf16);
  EXPECT_EQ(c.relay, "some/dir");
  EXPECT_EQ(c.seed, 18446744073709551615ull);
  EXPECT_TRUE(c.overwrite);
  EXPECT_EQ(c.trainer_sync, loco::TrainerSync::pulseloco);
  EXPECT_EQ(c.sparse_exchange, loco::SparseExchange::sparse_allreduce);
  EXPECT_EQ(c.inference_ranks, 1);
  // Keys not given keep their defaults.
  const TrainConfig defaults;
  EXPECT_EQ(c.group_size, defaults.group_size);
  EXPECT_EQ(c.out, defaults.out);
}

TEST(TrainConfigParse, RefusesValuesOfTheWrongTypeOrOutsideTheChoices) {
  for (const char* bad : {"steps = \"ten\"\n", "steps = 1.5\n", "lr = \"fast\"\n", "precision = \"fp8\"\n",
                          "trainer-sync = \"allreduce\"\n", "sparse-exchange = \"dense\"\n", "digits = 99999999999\n",
                          "precision = 0\n", "trainer-sync = 1\n", "model = \"huge\"\n", "steps\n",
                          // issue 27: a seed that would wrap to 2^64-1 or overflow; a key given twice
                          "seed = -1\n", "seed = 18446744073709551616\n", "seed = +3\n", "steps = 7\nsteps = 8\n",
                          "lr = 1e-3\nseed = 2\nlr = 2e-3\n"})
    EXPECT_THROW(parse_toml(bad), CLI::Error) << bad;
  try {  // apart, CLI11 would let the first win
    parse_toml("lr = 1e-3\nseed = 2\nlr = 2e-3\n");
    ADD_FAILURE() << "a key given twice was accepted";
  } catch (const CLI::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'lr' is given twice"), std::string::npos) << e.what();
  }
}

// Each case: a change to a valid config, the words its error must contain, and the edge value
// that must still be accepted.
struct RangeCase {
  const char* name;
  std::function<void(TrainConfig&)> refused;
  std::function<void(TrainConfig&)> accepted;
  const char* words;
};

TEST(TrainConfigValidate, EachSettingJustOutsideItsRangeIsRefusedTheEdgeAccepted) {
  TempDir dir;
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const std::vector<RangeCase> cases = {
      {"steps", [](TrainConfig& c) { c.steps = 0; }, [](TrainConfig& c) { c.steps = 1; }, "steps must be >= 1, got 0"},
      {"lr 0", [](TrainConfig& c) { c.lr = 0; }, [](TrainConfig& c) { c.lr = 1e-300; }, "lr must be > 0, got 0"},
      {"lr NaN", [&](TrainConfig& c) { c.lr = nan; }, [](TrainConfig&) {}, "lr must be > 0, got nan"},
      {"lr inf", [&](TrainConfig& c) { c.lr = inf; }, [](TrainConfig&) {}, "lr must be > 0, got inf"},
      {"warmup-steps", [](TrainConfig& c) { c.warmup_steps = -1; }, [](TrainConfig& c) { c.warmup_steps = 0; },
       "warmup-steps"},
      {"weight-decay", [](TrainConfig& c) { c.weight_decay = -1e-9; }, [](TrainConfig& c) { c.weight_decay = 0; },
       "weight-decay"},
      {"grad-clip", [&](TrainConfig& c) { c.grad_clip = nan; }, [](TrainConfig& c) { c.grad_clip = 0; }, "grad-clip"},
      {"digits low", [](TrainConfig& c) { c.digits = 0; }, [](TrainConfig& c) { c.digits = 1; }, "digits must be in 1..9, got 0"},
      {"digits high", [](TrainConfig& c) { c.digits = 10; }, [](TrainConfig& c) { c.digits = 9; },
       "digits must be in 1..9, got 10"},
      {"group-size", [](TrainConfig& c) { c.group_size = 1; }, [](TrainConfig& c) { c.group_size = 2; }, "group-size"},
      {"group-size max", [](TrainConfig& c) { c.group_size = max_group_size + 1; },
       [](TrainConfig& c) { c.group_size = max_group_size, c.prompts_per_step = 1; }, "group-size must be in 2..1024"},
      {"temperature", [](TrainConfig& c) { c.temperature = -0.5; }, [](TrainConfig& c) { c.temperature = 0; },
       "temperature"},
      {"clip-low", [](TrainConfig& c) { c.clip_low = 1; }, [](TrainConfig& c) { c.clip_low = 0.999; }, "clip-low"},
      {"clip-high", [](TrainConfig& c) { c.clip_high = 0; }, [](TrainConfig& c) { c.clip_high = 1e-9; }, "clip-high"},
      {"clip-high inf", [&](TrainConfig& c) { c.clip_high = inf; }, [](TrainConfig& c) { c.clip_high = 1e300; },
       "clip-high must be > 0, got inf"},
      {"temperature inf", [&](TrainConfig& c) { c.temperature = inf; }, [](TrainConfig& c) { c.temperature = 1e300; },
       "temperature must be >= 0, got inf"},
      {"sft-steps negative", [](TrainConfig& c) { c.sft_steps = -1; }, [](TrainConfig& c) { c.sft_steps = 0; },
       "sft-steps must be >= 0"},
      {"num-iterations", [](TrainConfig& c) { c.num_iterations = 0; }, [](TrainConfig& c) { c.num_iterations = 1; },
       "num-iterations"},
      {"async-lag", [](TrainConfig& c) { c.async_lag = -1; }, [](TrainConfig& c) { c.async_lag = 0; }, "async-lag"},
      {"checkpoint-every", [](TrainConfig& c) { c.checkpoint_every = -1; },
       [](TrainConfig& c) { c.checkpoint_every = 0; }, "checkpoint-every"},
      {"anchor-every", [](TrainConfig& c) { c.anchor_every = 0; }, [](TrainConfig& c) { c.anchor_every = 1; },
       "anchor-every"},
      {"keep-anchors", [](TrainConfig& c) { c.keep_anchors = 0; }, [](TrainConfig& c) { c.keep_anchors = 1; },
       "keep-anchors"},
      {"eval-problems", [](TrainConfig& c) { c.eval_problems = (1 << 20) + 1; },
       [](TrainConfig& c) { c.eval_problems = 1 << 20; }, "eval-problems must be in 1..1048576"},
      {"outer-momentum", [](TrainConfig& c) { c.outer_momentum = 1; }, [](TrainConfig& c) { c.outer_momentum = 0; },
       "outer-momentum must be in [0, 1), got 1"},
      {"outer-lr", [](TrainConfig& c) { c.outer_lr = 0; }, [](TrainConfig& c) { c.outer_lr = 1e-9; }, "outer-lr"},
      {"dense-threshold", [](TrainConfig& c) { c.dense_threshold = 1.0000001; },
       [](TrainConfig& c) { c.dense_threshold = 1; }, "dense-threshold must be in [0, 1]"},
      {"sft-steps", [](TrainConfig& c) { c.sft_steps = 5; }, [&](TrainConfig& c) {
         c.sft_steps = 5, c.init = (dir.path / "sft.safetensors").string();
       }, "sft-steps needs init"},
      {"overwrite and resume", [](TrainConfig& c) { c.overwrite = c.resume = true; },
       [](TrainConfig& c) { c.overwrite = true; }, "exclude each other"},
      {"trainer-sync bf16",
       [](TrainConfig& c) { c.trainer_sync = loco::TrainerSync::diloco, c.precision = Precision::bf16; },
       [](TrainConfig& c) { c.trainer_sync = loco::TrainerSync::diloco; }, "trainer-sync diloco needs precision mixed"},
  };
  for (const RangeCase& k : cases) {
    TrainConfig c;
    c.out = (dir.path / "run.h5").string();
    TrainConfig edge = c;
    k.refused(c);
    const std::string error = validate_error(c);
    EXPECT_NE(error.find(k.words), std::string::npos) << k.name << ": '" << error << "'";
    EXPECT_EQ(error.find('\n'), std::string::npos) << k.name << ": not one line";
    k.accepted(edge);
    EXPECT_EQ(validate_error(edge), "") << k.name;
  }
}

TEST(TrainConfigValidate, RankLayoutMustLeaveTrainersAndSplitPromptsEvenly) {
  TempDir dir;
  TrainConfig c;
  c.out = (dir.path / "run.h5").string();
  c.prompts_per_step = 6;
  c.inference_ranks = 2;
  EXPECT_NE(validate_error(c, 2).find("leaves no trainer among 2 ranks"), std::string::npos);
  EXPECT_NE(validate_error(c, 6).find("not a multiple of the 4 trainer ranks"), std::string::npos);
  EXPECT_EQ(validate_error(c, 5), "");  // 3 trainers and 2 inference ranks each divide 6
  c.inference_ranks = 4;
  EXPECT_NE(validate_error(c, 7).find("not a multiple of the 4 inference ranks"), std::string::npos);
  c.inference_ranks = -1;
  EXPECT_NE(validate_error(c, 2), "");
  c.inference_ranks = 1, c.prompts_per_step = 4, c.trainer_sync = loco::TrainerSync::pulseloco;
  EXPECT_NE(validate_error(c, 3).find("runs without inference ranks"), std::string::npos);
  c.inference_ranks = 0;
  EXPECT_EQ(validate_error(c, 2), "");
}

TEST(TrainConfig, TomlRoundTripKeepsEverySetting) {
  TrainConfig c;
  c.out = "runs/x.h5", c.relay = "relay dir", c.seed = 0xFFFFFFFFFFFFFFFFull, c.lr = 1.0 / 3.0;
  c.steps = 12345, c.trainer_sync = loco::TrainerSync::pulseloco, c.dense_threshold = 0.125;
  const TrainConfig back = parse_toml(to_toml(c));
  EXPECT_EQ(to_toml(back), to_toml(c));
  EXPECT_EQ(back.seed, c.seed);
  EXPECT_EQ(back.lr, c.lr);  // 17 significant digits: the same double
  EXPECT_EQ(back.relay, "relay dir");
}

TEST(TrainConfig, ParseRefusesUnknownKeys) {
  EXPECT_THROW(parse_toml("learning-rate-typo = 1\n"), CLI::Error);
}

TEST(TrainConfig, ValidAcceptsDefaults) {
  TempDir dir;
  EXPECT_EQ(validate_error(valid_config(dir)), "");
}

TEST(TrainConfig, RefusesBatchesThatOverflowOrCannotFit) {
  TempDir dir;
  TrainConfig c = valid_config(dir);
  c.prompts_per_step = 1073741824;  // x group-size 8 overflows an int
  EXPECT_NE(validate_error(c).find("completions on one rank"), std::string::npos) << validate_error(c);
  c = valid_config(dir);
  c.group_size = 100000;
  EXPECT_NE(validate_error(c).find("group-size must be in 2..1024, got 100000"), std::string::npos);
  c = valid_config(dir);
  c.prompts_per_step = 4096, c.group_size = 8;  // 32768 rows on one rank
  EXPECT_NE(validate_error(c), "");
  EXPECT_EQ(validate_error(c, 2), "");  // split over two trainers: 16384 rows each
  c = valid_config(dir);
  c.prompts_per_step = 2147483647, c.group_size = 1024;  // the product needs 41 bits
  EXPECT_NE(validate_error(c), "");
}

TEST(TrainConfig, RefusesPathsThatCannotBeRecordedOrWritten) {
  TempDir dir;
  TrainConfig c = valid_config(dir);
  for (const std::string bad : {"run\xff.h5", "run\xc0\xaf.h5", "run\xed\xa0\x80.h5", "q\"uote.h5", "back\\slash.h5",
                                "tab\t.h5", "cut\xe2\x82"}) {
    c.out = (dir.path / bad).string();
    EXPECT_NE(validate_error(c), "") << bad;
  }
  c.out = (dir.path / "caf\xc3\xa9-\xf0\x9f\x98\x80.h5").string();  // UTF-8 is fine
  EXPECT_EQ(validate_error(c), "");
  c.out = (dir.path / "missing" / "run.h5").string();
  EXPECT_NE(validate_error(c).find("not a writable folder"), std::string::npos);
  c.out = dir.path.string();
  EXPECT_NE(validate_error(c), "");
  std::ofstream(dir.path / "run.ckpt") << "x";  // the checkpoint folder's name is a file
  c.out = (dir.path / "run.h5").string();
  EXPECT_NE(validate_error(c).find("checkpoint folder"), std::string::npos);
  c = valid_config(dir);
  c.relay = "relay\x80";
  EXPECT_NE(validate_error(c), "");
}

TEST(TrainConfig, NewRunRefusesUsedRelay) {
  TempDir dir;
  TrainConfig c = valid_config(dir);
  c.inference_ranks = 1;
  c.relay = (dir.path / "relay").string();
  EXPECT_EQ(validate_error(c, 2), "");  // absent: fine
  fs::create_directory(c.relay);
  EXPECT_EQ(validate_error(c, 2), "");  // empty: fine
  std::ofstream(fs::path(c.relay) / "HEAD") << "version 3 00\n";
  EXPECT_NE(validate_error(c, 2).find("not an empty folder"), std::string::npos);
  c.resume = true;
  EXPECT_EQ(validate_error(c, 2), "");
}

TEST(TrainConfig, DifferingKeys) {
  TrainConfig a, b;
  EXPECT_TRUE(differing_keys(to_toml(a), to_toml(b)).empty());
  b.lr = 5e-4, b.seed = 7, b.steps = 1000;
  EXPECT_EQ(differing_keys(to_toml(a), to_toml(b)), (std::vector<std::string>{"lr", "seed", "steps"}));
  // A key on one side only (a checkpoint of another program version) counts as different.
  EXPECT_EQ(differing_keys("lr = 1\nextra = 2\n", "lr = 1\n"), std::vector<std::string>{"extra"});
  EXPECT_EQ(toml_values(to_toml(b)).at("steps"), "1000");
}

TEST(TrainConfig, ResumeChangesAllowOnlyKeysThatKeepResults) {
  TrainConfig a, b;
  EXPECT_EQ(resume_changes(to_toml(a), b), "");
  b.steps = 500, b.checkpoint_every = 7;
  EXPECT_EQ(resume_changes(to_toml(a), b), "checkpoint-every 50 -> 7, steps 100 -> 500");
  b.lr = 5e-4, b.seed = 7;
  try {
    resume_changes(to_toml(a), b);
    FAIL() << "accepted a changed lr and seed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("differ from the checkpoint's in lr, seed (only out, checkpoint-every, steps may change)"),
              std::string::npos)
        << e.what();
  }
}

// ---- The option table (train_options()): one row per setting feeds the parser, to_toml(), the
// resume check and the docs ----

namespace {

// A value other than the default for every recorded option, as TOML.
const std::map<std::string, std::string> kChanged = {
    {"out", "\"runs/other.h5\""},   {"checkpoint-every", "7"},    {"model", "\"small\""},
    {"init", "\"w.safetensors\""},  {"sft-steps", "3"},           {"seed", "18446744073709551615"},
    {"digits", "3"},                {"steps", "11"},              {"lr", "0.00025000000000000001"},
    {"warmup-steps", "4"},          {"precision", "\"bf16\""},    {"weight-decay", "0.10000000000000001"},
    {"grad-clip", "0.5"},           {"prompts-per-step", "6"},    {"group-size", "5"},
    {"temperature", "0.69999999999999996"}, {"clip-low", "0.10000000000000001"}, {"clip-high", "0.5"},
    {"num-iterations", "2"},        {"async-lag", "1"},           {"inference-ranks", "2"},
    {"relay", "\"relay dir\""},     {"anchor-every", "5"},        {"keep-anchors", "3"},
    {"eval-every", "9"},            {"eval-problems", "17"},      {"absorption-every", "6"},
    {"trainer-sync", "\"pulseloco\""}, {"inner-steps", "2"},      {"outer-lr", "0.5"},
    {"outer-momentum", "0.80000000000000004"}, {"sparse-exchange", "\"sparse-allreduce\""},
    {"dense-threshold", "0.125"},
};

std::set<std::string> recorded_option_names() {
  std::set<std::string> names;
  for (const TrainOption& o : train_options())
    if (o.recorded) names.insert(o.name);
  return names;
}

}  // namespace

TEST(TrainOptions, EveryRecordedOptionRoundTripsThroughToTomlAndParse) {
  std::set<std::string> changed_names;
  for (const auto& [name, value] : kChanged) changed_names.insert(name);
  ASSERT_EQ(changed_names, recorded_option_names()) << "kChanged must give a value for every recorded option";
  std::string toml;
  for (const auto& [name, value] : kChanged) toml += name + " = " + value + "\n";
  const TrainConfig c = parse_toml(toml);
  const std::map<std::string, std::string> recorded = toml_values(to_toml(c));
  const std::map<std::string, std::string> defaults = toml_values(to_toml(TrainConfig{}));
  EXPECT_EQ(recorded, kChanged);  // each key parsed into its field and written back under its name
  for (const auto& [name, value] : kChanged) EXPECT_NE(defaults.at(name), value) << name << ": not a change";
}

TEST(TrainOptions, OptionNamesAreUniqueAndEachIsAFlagOfTheParser) {
  std::set<std::string> names;
  TrainConfig c;
  CLI::App app;
  add_train_options(app, c);
  for (const TrainOption& o : train_options()) {
    EXPECT_TRUE(names.insert(o.name).second) << o.name << " twice";
    EXPECT_NE(app.get_option_no_throw("--" + o.name), nullptr) << o.name;
    EXPECT_EQ(find_train_option(o.name), &o);
    EXPECT_TRUE(o.in_range(c)) << o.name << ": the default is outside its range";
  }
  EXPECT_EQ(find_train_option("learning-rate"), nullptr);
}

// The recorded text of a default run, as runs before the option table wrote it: resumed runs and
// pulse-measure compare it key by key, so the format must not move.
TEST(TrainOptions, ToTomlWritesTheRecordedFormat) {
  EXPECT_EQ(to_toml(TrainConfig{}),
            "out = \"runs/train.h5\"\ncheckpoint-every = 50\nmodel = \"tiny\"\ninit = \"\"\nsft-steps = 0\nseed = 1\n"
            "digits = 2\nsteps = 100\nlr = 3.0000000000000001e-06\nwarmup-steps = 20\nprecision = \"mixed\"\n"
            "weight-decay = 0\ngrad-clip = 1\nprompts-per-step = 8\ngroup-size = 8\ntemperature = 1\n"
            "clip-low = 0.20000000000000001\nclip-high = 0.28000000000000003\nnum-iterations = 1\nasync-lag = 0\n"
            "inference-ranks = 0\nrelay = \"\"\nanchor-every = 10\nkeep-anchors = 2\neval-every = 10\n"
            "eval-problems = 128\nabsorption-every = 10\ntrainer-sync = \"ddp\"\ninner-steps = 8\nouter-lr = 0.69999999999999996\n"
            "outer-momentum = 0.90000000000000002\nsparse-exchange = \"allgather\"\ndense-threshold = 0.25\n");
}

TEST(TrainOptions, ResumeRefusesAChangeOfEachOptionTheTableDoesNotLetChange) {
  const std::string recorded = to_toml(TrainConfig{});
  for (const auto& [name, value] : kChanged) {
    const TrainConfig now = parse_toml(name + " = " + value + "\n");
    if (find_train_option(name)->resume_may_change) {
      EXPECT_NE(resume_changes(recorded, now).find(name + " "), std::string::npos) << name;
    } else {
      EXPECT_THROW(resume_changes(recorded, now), Error) << name;
    }
  }
}

TEST(TrainOptions, TheRepositorysConfigFilesLoad) {
  int files = 0;
  for (const auto& entry : fs::directory_iterator(PULSE_SOURCE_DIR "/jobs/configs")) {
    if (entry.path().extension() != ".toml") continue;
    TrainConfig c;
    CLI::App app;
    add_train_options(app, c);
    const std::string file = entry.path().string();
    const char* argv[] = {"pulse-train", "--config", file.c_str()};
    EXPECT_NO_THROW(app.parse(3, argv)) << file;
    EXPECT_EQ(parse_toml(to_toml(c)).steps, c.steps) << file;
    ++files;
  }
  EXPECT_GE(files, 2);
}

TEST(TrainOptions, MarkdownHasOneRowPerOptionWithItsDefaultAndRange) {
  const std::string table = train_options_markdown();
  for (const TrainOption& o : train_options()) {
    const std::size_t at = table.find("| `--" + o.name + "` |");
    ASSERT_NE(at, std::string::npos) << o.name;
    const std::string row = table.substr(at, table.find('\n', at) - at);
    EXPECT_NE(row.find(o.range), std::string::npos) << row;
    EXPECT_NE(row.find(o.help), std::string::npos) << row;
  }
  EXPECT_NE(table.find("| `--lr` | `3e-06` | > 0 | must match |"), std::string::npos) << table;
  EXPECT_NE(table.find("| `--precision` | `mixed` | mixed, bf16 | must match |"), std::string::npos) << table;
  EXPECT_NE(table.find("| `--steps` | `100` | >= 1 | may change |"), std::string::npos) << table;
}
