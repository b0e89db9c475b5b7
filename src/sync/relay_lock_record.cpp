#include "sync/relay_lock_record.hpp"

#include "sync/relay_names.hpp"

namespace pulse::sync {

namespace {

// The rest of the first line that starts with "key ", or nullopt.
std::optional<std::string> field(const std::string& text, const std::string& key) {
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t end = text.find('\n', at);
    const std::string line = text.substr(at, end == std::string::npos ? std::string::npos : end - at);
    if (line.compare(0, key.size() + 1, key + " ") == 0) return line.substr(key.size() + 1);
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return std::nullopt;
}

}  // namespace

std::string format_lock(const LockHolder& holder) {
  return "host " + holder.host + "\npid " + (holder.pid ? std::to_string(*holder.pid) : std::string()) + "\ntoken " +
         holder.token + "\n";
}

LockHolder parse_lock(const std::string& text) {
  LockHolder h;
  h.host = field(text, "host").value_or("");
  h.token = field(text, "token").value_or("");
  if (const auto pid = field(text, "pid")) h.pid = parse_canonical_version(*pid);
  return h;
}

}  // namespace pulse::sync
