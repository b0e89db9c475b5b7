// libFuzzer entry: the input is a file name found in a relay folder. parse_relay_name and
// parse_canonical_version must never crash, and must keep the one-name-per-file rule the relay's
// retention relies on: a name parsed as an anchor, anchor record or patch is exactly the name
// the relay writes for its versions, and an accepted version prints back as the same digits.
#include <cstddef>
#include <cstdint>
#include <string>

#include "sync/relay_names.hpp"

using namespace pulse::sync;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string name(reinterpret_cast<const char*>(data), size);
  if (const auto v = parse_canonical_version(name))
    if (std::to_string(*v) != name) __builtin_trap();
  const auto n = parse_relay_name(name);
  if (!n) return 0;
  std::string expected;
  switch (n->kind) {
    case RelayFile::head: expected = kRelayHeadName; break;
    case RelayFile::lock: expected = kRelayLockName; break;
    case RelayFile::anchor: expected = anchor_file_name(n->version, false); break;
    case RelayFile::anchor_zst: expected = anchor_file_name(n->version, true); break;
    case RelayFile::anchor_record: expected = anchor_record_name(n->version); break;
    case RelayFile::patch:
      if (n->version >= n->to) __builtin_trap();
      expected = patch_file_name(n->version, n->to);
      break;
    case RelayFile::temporary:
      if (name.find(".tmp.") == std::string::npos && name.find(".uncompressed") == std::string::npos) __builtin_trap();
      return 0;
  }
  if (expected != name) __builtin_trap();
  return 0;
}
