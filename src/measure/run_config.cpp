#include "measure/run_config.hpp"

#include <cctype>
#include <cstdio>
#include <regex>

#include "core/error.hpp"

namespace pulse::measure {

namespace {

std::string quoted(const std::string& v) {
  std::string out = "\"";
  for (const char c : v) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\u%04X", unsigned(static_cast<unsigned char>(c)));
      out += hex;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// A TOML integer or float as people write them (3, -2, 3e-6, 0.9, 1.5E+3), true or false: as
// such; anything else (1., 007, inf, 0x10) as a string.
std::string toml_value(const std::string& v) {
  static const std::regex number("-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?");
  return v == "true" || v == "false" || std::regex_match(v, number) ? v : quoted(v);
}

}  // namespace

std::string RunConfig::text(const std::string& key) const {
  const auto it = values.find(key);
  if (it == values.end()) return "";
  const std::string& v = it->second;
  if (v.size() >= 2 && v.front() == '"') {
    std::string out;
    for (std::size_t i = 1; i + 1 < v.size(); ++i) {
      if (v[i] == '\\' && i + 2 < v.size()) ++i;  // \" and \\ (control characters stay escaped)
      out += v[i];
    }
    return out;
  }
  return v;
}

std::string RunConfig::toml() const {
  std::string out;
  for (const auto& [key, value] : values) out += key + " = " + value + "\n";
  return out;
}

RunConfig parse_run_config(const std::vector<std::string>& settings, const std::string& label) {
  RunConfig c;
  auto add = [&](const std::string& key, const std::string& value, const std::string& what) {
    if (key.empty()) throw Error(what + ": no key before '='");
    for (const char ch : key)
      if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_')
        throw Error(what + ": key \"" + key + "\" may hold letters, digits, '-' and '_' only");
    if (!c.values.emplace(key, toml_value(value)).second) throw Error(what + ": " + key + " is set twice");
  };
  for (const std::string& s : settings) {
    const std::size_t eq = s.find('=');
    if (eq == std::string::npos) throw Error("--set " + s + ": not key=value");
    const std::string key = s.substr(0, eq);
    if (key == "label") throw Error("--set " + s + ": the label is --label's");
    add(key, s.substr(eq + 1), "--set " + s);
  }
  if (!label.empty()) add("label", label, "--label " + label);
  return c;
}

}  // namespace pulse::measure
