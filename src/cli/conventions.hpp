#pragma once
#include <CLI/CLI.hpp>

#include <string>

// What every pulse app's command line does alike: --version, defaults in --help, and one-line
// parse errors that name the closest valid subcommand or option to a mistyped one.
namespace pulse::cli {

// Call on a new app before adding options: adds --version ("<program> <pulse version>") and
// shows each option's default in --help.
void set_conventions(CLI::App& app, const std::string& program);

// The line a parse error prints: for an unknown subcommand or option, the closest valid name.
std::string parse_error_message(const CLI::App& app, const CLI::ParseError& e);

// The exit code of a parse error: 0 for --help and --version (printed when print is true),
// otherwise 2 after "program: <parse_error_message>" on stderr (when print is true).
int exit_on_parse_error(const CLI::App& app, const CLI::ParseError& e, const std::string& program, bool print = true);

}  // namespace pulse::cli
