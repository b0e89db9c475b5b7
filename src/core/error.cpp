#include "core/error.hpp"

#include <cstring>

namespace pulse {

void throw_error(const char* file, int line, const std::string& message) {
  const char* base = std::strrchr(file, '/');
  throw Error(message + " (" + (base ? base + 1 : file) + ":" + std::to_string(line) + ")");
}

}  // namespace pulse
