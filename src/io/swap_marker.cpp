#include "io/swap_marker.hpp"

namespace pulse::io {

namespace {
constexpr const char* kTitle = "PULSESync folder swap 1\n";
}

bool plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find_first_of(std::string("/\n\0", 3)) == std::string::npos;
}

std::string format_swap_marker(const SwapMarker& marker) {
  return kTitle + std::string("new ") + marker.fresh + "\nold " + marker.old + "\n";
}

std::optional<SwapMarker> parse_swap_marker(const std::string& text) {
  const std::string title = kTitle;
  if (text.compare(0, title.size(), title) != 0 || text.empty() || text.back() != '\n') return std::nullopt;
  const std::size_t new_at = title.size(), new_end = text.find('\n', new_at);
  if (new_end == std::string::npos || text.compare(new_at, 4, "new ") != 0) return std::nullopt;
  const std::size_t old_at = new_end + 1, old_end = text.find('\n', old_at);
  if (old_end != text.size() - 1 || text.compare(old_at, 4, "old ") != 0) return std::nullopt;
  SwapMarker m{text.substr(new_at + 4, new_end - new_at - 4), text.substr(old_at + 4, old_end - old_at - 4)};
  if (!plain_file_name(m.fresh) || !plain_file_name(m.old)) return std::nullopt;
  return m;
}

}  // namespace pulse::io
