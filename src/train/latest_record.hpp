#pragma once
// A checkpoint folder's LATEST record: "<step> <ranks>\n", the step every rank has written and
// how many ranks wrote it, in canonical decimals (one spelling).
#include <cstdint>
#include <string>

namespace pulse {

struct LatestRecord {
  std::int64_t step = 0;
  std::int64_t ranks = 0;
};

std::string format_latest(const LatestRecord& record);
// Throws pulse::Error "checkpoint record '<source>' is unreadable" for anything but what
// format_latest writes (a step >= 0, ranks >= 1).
LatestRecord parse_latest(const std::string& text, const std::string& source);

}  // namespace pulse
