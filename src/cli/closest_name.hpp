#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace pulse::cli {

// Edits (insert, delete, substitute, swap of two neighbours) that turn a into b.
std::size_t edit_distance(const std::string& a, const std::string& b);

// The candidate nearest to typed, or "" when none is near enough to be what was meant
// (at most 2 edits, or a third of the candidate's length for long names).
std::string closest_name(const std::string& typed, const std::vector<std::string>& candidates);

}  // namespace pulse::cli
