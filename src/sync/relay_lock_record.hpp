#pragma once
// publish.lock's text (sync/relay.cpp, FORMAT.md "Relay"): "host H\npid P\ntoken T\n", naming
// the publisher that holds the relay. A lock is whatever is on disk (a foreign or damaged one
// still holds the relay), so parsing never fails: fields it cannot read are left empty.
#include <cstdint>
#include <optional>
#include <string>

namespace pulse::sync {

struct LockHolder {
  std::string host;
  std::optional<std::uint64_t> pid;  // a canonical decimal, else none
  std::string token;
};

std::string format_lock(const LockHolder& holder);
// The first "host ", "pid " and "token " lines; "holder unknown" lacks host or pid.
LockHolder parse_lock(const std::string& text);

}  // namespace pulse::sync
