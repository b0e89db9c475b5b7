// libFuzzer entry: the input is a relay's publish.lock (src/sync/relay_lock_record.hpp), which
// any process that can write the folder may have put there. parse_lock never fails; what it
// reads must read back the same from format_lock's text when its fields are single lines.
#include <cstddef>
#include <cstdint>
#include <string>

#include "sync/relay_lock_record.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pulse::sync;
  const LockHolder h = parse_lock(std::string(reinterpret_cast<const char*>(data), size));
  if (h.host.find('\n') != std::string::npos || h.token.find('\n') != std::string::npos) __builtin_trap();
  const LockHolder back = parse_lock(format_lock(h));
  if (back.host != h.host || back.pid != h.pid || back.token != h.token) __builtin_trap();
  return 0;
}
