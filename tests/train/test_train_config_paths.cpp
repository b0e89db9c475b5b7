// Relative paths in a pulse-train --config file are relative to the file's folder, so a config
// works from any working folder; paths on the command line stay relative to the working folder.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "train/train_config.hpp"

namespace fs = std::filesystem;
using pulse::TrainConfig;

namespace {

// A fresh folder for one test, left as the working folder is restored at the end.
class ConfigPaths : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("pulse_config_paths_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ / "project" / "configs" / "results");
    fs::create_directories(root_ / "elsewhere");
    cwd_ = fs::current_path();
  }
  void TearDown() override {
    fs::current_path(cwd_);
    fs::remove_all(root_);
  }
  fs::path write_config(const std::string& text) const {
    const fs::path path = root_ / "project" / "configs" / "run.toml";
    std::ofstream(path) << text;
    return path;
  }
  static TrainConfig parse(std::vector<std::string> args) {
    TrainConfig config;
    CLI::App app;
    pulse::add_train_options(app, config);
    args.insert(args.begin(), "pulse-train");
    std::vector<const char*> argv;
    for (const std::string& a : args) argv.push_back(a.c_str());
    app.parse(int(argv.size()), argv.data());
    return config;
  }
  fs::path root_, cwd_;
};

const std::string kConfig = "out = \"results/run.h5\"\ninit = \"../sft/model.safetensors\"\nrelay = \"relay\"\n";

TEST_F(ConfigPaths, RelativePathsInTheFileAreRelativeToItsFolder) {
  const fs::path config_file = write_config(kConfig);
  fs::current_path(root_ / "elsewhere");
  const TrainConfig c = parse({"--config", config_file.string()});
  EXPECT_EQ(c.out, (root_ / "project" / "configs" / "results" / "run.h5").string());
  EXPECT_EQ(c.init, (root_ / "project" / "sft" / "model.safetensors").string());
  EXPECT_EQ(c.relay, (root_ / "project" / "configs" / "relay").string());
  // The run's output folder exists beside the config, not in the working folder: validate accepts it.
  EXPECT_NO_THROW(pulse::validate(c, 1));
}

TEST_F(ConfigPaths, ConfigNamedRelativelyGivesPathsRelativeToTheWorkingFolder) {
  write_config(kConfig);
  fs::current_path(root_ / "project");
  const TrainConfig c = parse({"--config", "configs/run.toml"});
  EXPECT_EQ(c.out, "configs/results/run.h5");
  EXPECT_EQ(c.init, "sft/model.safetensors");  // configs/../sft, lexically normal
  EXPECT_NO_THROW(pulse::validate(c, 1));
}

TEST_F(ConfigPaths, CommandLinePathsStayRelativeToTheWorkingFolder) {
  const fs::path config_file = write_config(kConfig);
  fs::current_path(root_ / "elsewhere");
  const TrainConfig c = parse({"--config", config_file.string(), "--out", "mine.h5", "--init", "w.safetensors"});
  EXPECT_EQ(c.out, "mine.h5");
  EXPECT_EQ(c.init, "w.safetensors");
  EXPECT_EQ(c.relay, (root_ / "project" / "configs" / "relay").string());
}

TEST_F(ConfigPaths, AbsoluteAndEmptyPathsAreKept) {
  const fs::path config_file = write_config("out = \"" + (root_ / "elsewhere" / "a.h5").string() + "\"\ninit = \"\"\n");
  const TrainConfig c = parse({"--config", config_file.string()});
  EXPECT_EQ(c.out, (root_ / "elsewhere" / "a.h5").string());
  EXPECT_EQ(c.init, "");
}

TEST_F(ConfigPaths, OtherKeysAndRecordedSettingsAreUnchanged) {
  // Recorded settings (a checkpoint's TOML, read back on --resume) hold resolved paths already.
  const TrainConfig c = pulse::parse_toml("out = \"./results/../run.h5\"\nmodel = \"small\"\n");
  EXPECT_EQ(c.out, "./results/../run.h5");
  const fs::path config_file = write_config("model = \"small\"\nsteps = 7\n");
  const TrainConfig d = parse({"--config", config_file.string()});
  EXPECT_EQ(d.model, "small");
  EXPECT_EQ(d.steps, 7);
  EXPECT_EQ(d.out, TrainConfig{}.out);
}

TEST(ResolveConfigPath, JoinsWithTheFilesFolder) {
  EXPECT_EQ(pulse::resolve_config_path("a/b/c.toml", "x/y.h5"), "a/b/x/y.h5");
  EXPECT_EQ(pulse::resolve_config_path("a/b/c.toml", "../../runs/w"), "runs/w");
  EXPECT_EQ(pulse::resolve_config_path("c.toml", "x.h5"), "x.h5");
  EXPECT_EQ(pulse::resolve_config_path("/etc/c.toml", "x.h5"), "/etc/x.h5");
  EXPECT_EQ(pulse::resolve_config_path("a/c.toml", "/abs/x.h5"), "/abs/x.h5");
  EXPECT_EQ(pulse::resolve_config_path("a/c.toml", ""), "");
}

}  // namespace
