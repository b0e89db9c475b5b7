#include "cli/json_summary.hpp"

#include <cstdio>
#include <filesystem>

#include "core/version.hpp"

namespace pulse::cli {

namespace {

// Bytes of a file, or of every regular file under a folder; -1 when there is none.
long long bytes_on_disk(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return static_cast<long long>(fs::file_size(path, ec));
  if (!fs::is_directory(path, ec)) return -1;
  long long total = 0;
  for (auto it = fs::recursive_directory_iterator(path, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
    if (it->is_regular_file(ec)) total += static_cast<long long>(it->file_size(ec));
  return total;
}

// "--in-place" -> "in_place"
std::string key_of(const std::string& option) {
  std::string key = option.substr(option.find_first_not_of('-'));
  for (char& c : key)
    if (c == '-') c = '_';
  return key;
}

}  // namespace

JsonSummary::JsonSummary(CLI::App& app, std::string program, std::vector<std::string> output_options)
    : app_(app), program_(std::move(program)), output_options_(std::move(output_options)) {
  const std::string help = "print the key results as one JSON object on the last line of stdout";
  const auto subcommands = app.get_subcommands([](const CLI::App*) { return true; });
  if (subcommands.empty()) app.add_flag("--json", requested_, help);
  for (CLI::App* sub : subcommands)
    if (!sub->get_option_no_throw("--json")) sub->add_flag("--json", requested_, help);
}

std::string JsonSummary::line(int exit_code) const {
  nlohmann::json out = {{"program", program_}, {"pulse_version", version_string()}};
  const CLI::App* level = &app_;
  if (!app_.get_subcommands().empty()) {
    level = app_.get_subcommands().front();
    out["command"] = level->get_name();
  }
  out["exit_code"] = exit_code;
  out["elapsed_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  for (const std::string& name : output_options_) {
    const CLI::Option* option = level->get_option_no_throw(name);
    if (!option || (option->count() == 0 && option->get_default_str().empty())) continue;
    const std::string path = option->as<std::string>();
    out[key_of(name)] = path;
    const long long bytes = bytes_on_disk(path);
    if (bytes >= 0) out[key_of(name) + "_bytes"] = bytes;
  }
  out.update(results_);
  return json_text(out);
}

std::string json_text(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

int JsonSummary::print(int exit_code, bool print) {
  if (requested_ && print) {
    std::fflush(stdout);  // after every line the app printed before
    std::printf("%s\n", line(exit_code).c_str());
    std::fflush(stdout);
  }
  return exit_code;
}

}  // namespace pulse::cli
