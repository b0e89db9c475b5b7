// libFuzzer entry: the input is a folder swap's marker (src/io/swap_marker.hpp), which steers
// removals after a crash. parse_swap_marker must accept it or return nullopt; an accepted
// marker names two plain names and is exactly what format_swap_marker writes for them.
#include <cstddef>
#include <cstdint>
#include <string>

#include "io/swap_marker.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const auto marker = pulse::io::parse_swap_marker(text);
  if (marker && (!pulse::io::plain_file_name(marker->fresh) || !pulse::io::plain_file_name(marker->old) ||
                 pulse::io::format_swap_marker(*marker) != text))
    __builtin_trap();
  return 0;
}
