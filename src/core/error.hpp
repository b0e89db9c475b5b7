#pragma once
// Errors: PULSE_CHECK(cond, message) throws pulse::Error naming file, line and the message,
// so every failure reaches the user as one line.
#include <stdexcept>
#include <string>

namespace pulse {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void throw_error(const char* file, int line, const std::string& message);

}  // namespace pulse

#define PULSE_CHECK(cond, message)                                 \
  do {                                                             \
    if (!(cond)) ::pulse::throw_error(__FILE__, __LINE__, message); \
  } while (0)
