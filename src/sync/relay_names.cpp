#include "sync/relay_names.hpp"

namespace pulse::sync {

namespace {

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }
bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The name without a writer's temporary suffix ".tmp.XXXXXX" (mkstemp's six letters or digits).
std::optional<std::string_view> strip_temporary_suffix(std::string_view name) {
  constexpr std::string_view tag = ".tmp.";
  constexpr std::size_t random_chars = 6;
  if (name.size() < tag.size() + random_chars) return std::nullopt;
  const std::size_t at = name.size() - random_chars - tag.size();
  if (name.substr(at, tag.size()) != tag) return std::nullopt;
  for (char c : name.substr(at + tag.size()))
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))) return std::nullopt;
  return name.substr(0, at);
}

// Names the publisher itself writes: HEAD, anchors, records, patches (not the lock).
std::optional<RelayName> parse_published_name(std::string_view name) {
  if (name == kRelayHeadName) return RelayName{RelayFile::head};
  if (starts_with(name, "anchor-")) {
    const std::string_view rest = name.substr(7);
    const std::size_t dot = rest.find('.');
    if (dot == std::string_view::npos) return std::nullopt;
    const auto v = parse_canonical_version(rest.substr(0, dot));
    const std::string_view ext = rest.substr(dot);
    if (!v) return std::nullopt;
    if (ext == ".safetensors") return RelayName{RelayFile::anchor, *v};
    if (ext == ".safetensors.zst") return RelayName{RelayFile::anchor_zst, *v};
    if (ext == ".record") return RelayName{RelayFile::anchor_record, *v};
    return std::nullopt;
  }
  if (starts_with(name, "patch-") && ends_with(name, ".pulse")) {
    const std::string_view versions = name.substr(6, name.size() - 6 - 6);
    const std::size_t dash = versions.find('-');
    if (dash == std::string_view::npos) return std::nullopt;
    const auto from = parse_canonical_version(versions.substr(0, dash));
    const auto to = parse_canonical_version(versions.substr(dash + 1));
    if (!from || !to || *from >= *to) return std::nullopt;
    return RelayName{RelayFile::patch, *from, *to};
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::uint64_t> parse_canonical_version(std::string_view text) {
  if (text.empty() || text.size() > 20 || (text.size() > 1 && text[0] == '0')) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    const std::uint64_t digit = static_cast<std::uint64_t>(c - '0');
    if (v > (UINT64_MAX - digit) / 10) return std::nullopt;
    v = v * 10 + digit;
  }
  return v;
}

std::optional<RelayName> parse_relay_name(std::string_view name) {
  if (name == kRelayLockName) return RelayName{RelayFile::lock};
  if (const auto base = strip_temporary_suffix(name)) {
    std::string_view target = *base;
    if (target == kRelayLockName) return RelayName{RelayFile::temporary};
    constexpr std::string_view staging = ".uncompressed";  // save_checkpoint's plain file before zstd
    if (ends_with(target, staging)) {
      target.remove_suffix(staging.size());
      const auto n = parse_published_name(target);
      return n && n->kind == RelayFile::anchor ? std::optional<RelayName>(RelayName{RelayFile::temporary, n->version})
                                               : std::nullopt;
    }
    const auto n = parse_published_name(target);
    return n ? std::optional<RelayName>(RelayName{RelayFile::temporary, n->version, n->to}) : std::nullopt;
  }
  if (ends_with(name, ".uncompressed")) {
    const auto n = parse_published_name(name.substr(0, name.size() - 13));
    return n && n->kind == RelayFile::anchor ? std::optional<RelayName>(RelayName{RelayFile::temporary, n->version})
                                             : std::nullopt;
  }
  return parse_published_name(name);
}

std::string anchor_file_name(std::uint64_t version, bool compressed) {
  return "anchor-" + std::to_string(version) + (compressed ? ".safetensors.zst" : ".safetensors");
}
std::string anchor_record_name(std::uint64_t version) { return "anchor-" + std::to_string(version) + ".record"; }
std::string patch_file_name(std::uint64_t from, std::uint64_t to) {
  return "patch-" + std::to_string(from) + "-" + std::to_string(to) + ".pulse";
}

}  // namespace pulse::sync
