#pragma once
// How pulse-measure describes the run it measured, since checkpoints cannot tell: the settings a
// researcher gives (--set lr=3e-6 --set precision=bf16 --set seed=2) and a --label, as the
// root attribute "config" in the TOML that pulse-train writes there, so the report groups and
// labels measured runs by them as it does pulse-train's (runs differing only in seed are seeds
// of one variant; runs with nothing said about them are never grouped).
#include <map>
#include <string>
#include <vector>

namespace pulse::measure {

struct RunConfig {
  std::map<std::string, std::string> values;  // key -> TOML value (a number, true/false or a quoted string)

  // The value given for key as written (quotes removed), or "" when not given.
  std::string text(const std::string& key) const;
  // The TOML document, one "key = value" line per setting, in key order.
  std::string toml() const;
};

// Parses "key=value" settings (key: letters, digits, '-' and '_'; each key once; "label" is
// --label's) and the label. A value written as a TOML number (3, 3e-6, 0.9) or true/false is
// stored as such, anything else as a string. Throws pulse::Error naming the bad setting.
RunConfig parse_run_config(const std::vector<std::string>& settings, const std::string& label);

}  // namespace pulse::measure
