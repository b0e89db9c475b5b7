#include "train/latest_record.hpp"

#include <charconv>

#include "core/error.hpp"

namespace pulse {

namespace {

// A canonical decimal (digits, no sign, no leading zero but "0") at text[pos..], up to `end`.
bool parse_decimal(const std::string& text, std::size_t pos, std::size_t end, std::int64_t& value) {
  if (pos >= end || end > text.size() || (text[pos] == '0' && end - pos > 1) || text[pos] < '0' || text[pos] > '9')
    return false;
  const auto [stop, error] = std::from_chars(text.data() + pos, text.data() + end, value);
  return error == std::errc() && stop == text.data() + end;
}

}  // namespace

std::string format_latest(const LatestRecord& record) {
  return std::to_string(record.step) + " " + std::to_string(record.ranks) + "\n";
}

LatestRecord parse_latest(const std::string& text, const std::string& source) {
  LatestRecord r;
  const std::size_t space = text.find(' ');
  const bool ok = space != std::string::npos && !text.empty() && text.back() == '\n' &&
                  parse_decimal(text, 0, space, r.step) && parse_decimal(text, space + 1, text.size() - 1, r.ranks) &&
                  r.ranks >= 1;
  PULSE_CHECK(ok, "checkpoint record '" + source + "' is unreadable");
  return r;
}

}  // namespace pulse
