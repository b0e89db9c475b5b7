#include "cli/conventions.hpp"

#include <iostream>

#include "cli/closest_name.hpp"
#include "core/version.hpp"

namespace pulse::cli {

void set_conventions(CLI::App& app, const std::string& program) {
  app.set_version_flag("--version", program + " " + version_string(), "print the program's and pulse's version and exit");
  app.option_defaults()->always_capture_default();
}

namespace {

std::vector<std::string> option_names(const CLI::App& level) {
  std::vector<std::string> names;
  for (const CLI::Option* option : level.get_options()) {
    for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
    for (const std::string& name : option->get_snames()) names.push_back("-" + name);
  }
  return names;
}

std::vector<std::string> subcommand_names(const CLI::App& level) {
  std::vector<std::string> names;
  for (const CLI::App* sub : level.get_subcommands([](const CLI::App*) { return true; })) names.push_back(sub->get_name());
  return names;
}

std::string unknown_option(const std::string& token, const CLI::App& level) {
  const std::string name = token.substr(0, token.find('='));
  const std::string near = closest_name(name, option_names(level));
  return name + ": unknown option" + (near.empty() ? "" : "; did you mean " + near + "?");
}

}  // namespace

std::string parse_error_message(const CLI::App& app, const CLI::ParseError& e) {
  // The level (app or chosen subcommand) whose arguments were not understood: CLI11 keeps them
  // and reports a missing requirement first, which hides the typo that caused it.
  for (const CLI::App* level = &app; level;) {
    const std::vector<std::string> subcommands = subcommand_names(*level);
    const bool expects_subcommand = !subcommands.empty() && level->get_subcommands().empty();
    for (const std::string& token : level->remaining(false)) {  // the first not understood
      if (token.size() > 1 && token[0] == '-') return unknown_option(token, *level);
      if (expects_subcommand) {
        const std::string near = closest_name(token, subcommands);
        return "unknown subcommand '" + token + "'" + (near.empty() ? "" : "; did you mean '" + near + "'?");
      }
    }
    const auto parsed = level->get_subcommands();
    level = parsed.empty() ? nullptr : parsed.front();
  }
  return e.what();
}

int exit_on_parse_error(const CLI::App& app, const CLI::ParseError& e, const std::string& program, bool print) {
  if (e.get_exit_code() == 0) return print ? app.exit(e) : 0;  // --help, --version
  if (print) std::cerr << program << ": " << parse_error_message(app, e) << "\n";
  return 2;
}

}  // namespace pulse::cli
