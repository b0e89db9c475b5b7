#include "measure/checkpoint_series.hpp"

#include <glob.h>

#include <algorithm>
#include <cctype>

#include "core/error.hpp"

namespace pulse::measure {

namespace {

// The last run of digits in the part of each path that differs between them ("ckpt/step_12" -> 12).
std::vector<std::int64_t> steps_from_names(const std::vector<std::string>& paths) {
  std::size_t prefix = paths[0].size(), suffix = paths[0].size();
  for (const std::string& p : paths) {
    std::size_t i = 0;
    while (i < prefix && i < p.size() && p[i] == paths[0][i]) ++i;
    prefix = i;
    std::size_t j = 0;
    while (j < suffix && j < p.size() && p[p.size() - 1 - j] == paths[0][paths[0].size() - 1 - j]) ++j;
    suffix = j;
  }
  while (prefix > 0 && std::isdigit(static_cast<unsigned char>(paths[0][prefix - 1]))) --prefix;
  std::vector<std::int64_t> steps;
  for (const std::string& p : paths) {
    std::size_t end = p.size() - std::min(suffix, p.size() - prefix);
    while (end < p.size() && std::isdigit(static_cast<unsigned char>(p[end]))) ++end;
    std::size_t e = end;
    while (e > prefix && !std::isdigit(static_cast<unsigned char>(p[e - 1]))) --e;
    std::size_t b = e;
    while (b > prefix && std::isdigit(static_cast<unsigned char>(p[b - 1]))) --b;
    if (b == e || e - b > 18) throw Error(p + ": --glob finds no step number in the name (give --steps)");
    steps.push_back(std::stoll(p.substr(b, e - b)));
  }
  return steps;
}

}  // namespace

std::vector<std::int64_t> parse_steps(const std::string& list) {
  std::vector<std::int64_t> steps;
  std::size_t begin = 0;
  while (!list.empty() && begin <= list.size()) {
    const std::size_t end = std::min(list.find(',', begin), list.size());
    const std::string item = list.substr(begin, end - begin);
    std::size_t used = 0;
    try {
      steps.push_back(std::stoll(item, &used));
    } catch (const std::exception&) {
      used = std::string::npos;
    }
    if (used != item.size()) throw Error("--steps: \"" + item + "\" is not a step number");
    begin = end + 1;
  }
  return steps;
}

std::vector<std::pair<std::int64_t, std::string>> resolve_series(const std::vector<std::string>& checkpoints,
                                                                 const std::string& glob_pattern,
                                                                 const std::vector<std::int64_t>& given_steps) {
  std::vector<std::string> paths = checkpoints;
  std::vector<std::int64_t> steps = given_steps;
  if (!glob_pattern.empty()) {
    glob_t g{};
    const int rc = ::glob(glob_pattern.c_str(), 0, nullptr, &g);
    for (std::size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) paths.emplace_back(g.gl_pathv[i]);
    globfree(&g);
    if (paths.empty()) throw Error("--glob " + glob_pattern + ": matches nothing");
    if (steps.empty()) steps = steps_from_names(paths);
  }
  if (paths.size() < 2) throw Error("need at least two checkpoints (got " + std::to_string(paths.size()) + ")");
  if (steps.empty())
    for (std::size_t i = 0; i < paths.size(); ++i) steps.push_back(std::int64_t(i));
  if (steps.size() != paths.size())
    throw Error("--steps gives " + std::to_string(steps.size()) + " steps for " + std::to_string(paths.size()) +
                " checkpoints");
  std::vector<std::pair<std::int64_t, std::string>> series;
  for (std::size_t i = 0; i < paths.size(); ++i) series.emplace_back(steps[i], paths[i]);
  std::stable_sort(series.begin(), series.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (std::size_t i = 1; i < series.size(); ++i)
    if (series[i].first == series[i - 1].first)
      throw Error(series[i].second + ": step " + std::to_string(series[i].first) + " is also " + series[i - 1].second +
                  "'s");
  if (glob_pattern.empty() && !std::is_sorted(steps.begin(), steps.end()))
    throw Error("--steps must increase in the order the checkpoints are given");
  return series;
}

}  // namespace pulse::measure
