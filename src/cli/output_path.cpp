#include "cli/output_path.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

#include "core/error.hpp"

namespace pulse::cli {

namespace fs = std::filesystem;

namespace {

// True when `inner` is `outer` or lies below it (both canonical).
bool within(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i)
    if (i == inner.end() || *i != *o) return false;
  return true;
}

}  // namespace

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

void refuse_output_over_inputs(const std::string& out, const std::string& option, const std::vector<std::string>& inputs) {
  std::error_code ec;
  const fs::path out_path = fs::weakly_canonical(out, ec);
  if (ec) return;  // not resolvable: the write itself reports it
  const bool out_is_folder = fs::is_directory(out_path, ec);
  for (const std::string& input : inputs) {
    if (input.empty()) continue;
    const fs::path in_path = fs::canonical(input, ec);
    if (ec) continue;
    const bool same = same_file(out, input) || out_path == in_path;
    PULSE_CHECK(!same, option + " " + out + " is the input " + input + "; write elsewhere");
    PULSE_CHECK(!within(out_path, in_path), option + " " + out + " lies inside the input " + input + "; write elsewhere");
    PULSE_CHECK(!(out_is_folder && within(in_path, out_path)),
                option + " " + out + " is a folder that holds the input " + input + "; write elsewhere");
  }
}

}  // namespace pulse::cli
