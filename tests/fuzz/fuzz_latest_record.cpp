// libFuzzer entry: the input is a checkpoint folder's LATEST record ("<step> <ranks>\n").
// parse_latest must accept it or throw pulse::Error, and an accepted record must be exactly what
// format_latest writes for it (one spelling).
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "train/latest_record.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const pulse::LatestRecord r = pulse::parse_latest(text, "fuzz");
    if (r.step < 0 || r.ranks < 1 || pulse::format_latest(r) != text) __builtin_trap();
  } catch (const pulse::Error&) {
  }
  return 0;
}
