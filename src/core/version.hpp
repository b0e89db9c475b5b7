#pragma once
#include <string>

namespace pulse {
// "0.1.0 (git abc1234)": recorded in every output file.
std::string version_string();
}  // namespace pulse
