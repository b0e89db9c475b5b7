#pragma once
// The series pulse-measure reads: checkpoint paths (given, or matching --glob) and the step of
// each (--steps, the numbers in --glob's names, or 0, 1, 2, ...), in step order. Every mistake
// throws pulse::Error with one line.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pulse::measure {

// --steps: a comma-separated list of step numbers ("" is none).
std::vector<std::int64_t> parse_steps(const std::string& list);

// The checkpoints and their steps, ordered by step: at least two, no step twice; given paths
// keep their order and given steps must increase along them.
std::vector<std::pair<std::int64_t, std::string>> resolve_series(const std::vector<std::string>& checkpoints,
                                                                 const std::string& glob_pattern,
                                                                 const std::vector<std::int64_t>& given_steps);

}  // namespace pulse::measure
