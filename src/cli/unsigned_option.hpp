#pragma once
// A 64-bit unsigned option in plain decimal digits, at least `min`: CLI11 alone would wrap "-1"
// to 2^64-1 and saturate 2^64 and beyond.
#include <CLI/CLI.hpp>

#include <charconv>
#include <cstdint>
#include <string>

namespace pulse::cli {

inline CLI::Validator unsigned_decimal(std::uint64_t min = 0) {
  return CLI::Validator(
      [min](std::string& text) {
        std::uint64_t value = 0;
        const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
        const bool ok = !text.empty() && text[0] != '-' && error == std::errc() &&
                        end == text.data() + text.size() && value >= min;
        return ok ? std::string() : "'" + text + "' is not an integer from " + std::to_string(min) + " to 2^64-1";
      },
      "UINT");
}

}  // namespace pulse::cli
