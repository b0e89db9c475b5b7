#pragma once
// The one dispatch from an element width in bytes to an unsigned word of that width, for code
// that handles elements by their bits (comparisons, change logs, patch values).
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.hpp"

namespace pulse {

// Runs f with a zero Word of element_bytes (1, 2, 4 or 8 bytes: std::uint8_t ... std::uint64_t);
// other widths are an error naming what asked.
template <class F>
auto with_element_word(std::size_t element_bytes, const char* what, F&& f) {
  switch (element_bytes) {
    case 1: return f(std::uint8_t{});
    case 2: return f(std::uint16_t{});
    case 4: return f(std::uint32_t{});
    case 8: return f(std::uint64_t{});
  }
  throw_error(__FILE__, __LINE__,
              std::string(what) + ": elements of 1, 2, 4 or 8 bytes, not " + std::to_string(element_bytes));
}

}  // namespace pulse
