#pragma once
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace pulse::cli {

// JSON text for the apps' output: bytes that are not UTF-8 (a path's, a tensor name's) become
// U+FFFD instead of throwing, so --json never ends a run that has done its work.
std::string json_text(const nlohmann::json& j, int indent = -1);

// --json: an app's key results as one JSON object on the last line of stdout, for the scripts
// that run it: {"program", "pulse_version", "command" (the subcommand, if any), "exit_code",
// "elapsed_s", each output the run wrote with its size ("out": path, "out_bytes": n), and what
// the app adds with set()}. Human-readable lines before it stay as they are.
class JsonSummary {
 public:
  // Adds --json to app, or to each subcommand of app that has no --json of its own (those print
  // their own JSON object). output_options: options that name a file or folder the run writes
  // ("--out", "--in-place"); the chosen one is reported with its size.
  JsonSummary(CLI::App& app, std::string program, std::vector<std::string> output_options = {"--out"});

  bool requested() const { return requested_; }
  void set(const std::string& key, nlohmann::json value) { results_[key] = std::move(value); }

  // Prints the line when --json was given (and print is true, e.g. on rank 0 only); returns
  // exit_code, so that `return summary.print(code);` ends main.
  int print(int exit_code, bool print = true);

  // The line print() writes, without the newline.
  std::string line(int exit_code) const;

 private:
  const CLI::App& app_;
  std::string program_;
  std::vector<std::string> output_options_;
  bool requested_ = false;
  nlohmann::json results_ = nlohmann::json::object();
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace pulse::cli
