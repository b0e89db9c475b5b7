#pragma once
// The exact grammar of relay file names. Versions are canonical unsigned decimals (no sign,
// no leading zero, no overflow), so every version has exactly one name. A name outside this
// grammar is not the relay's: readers ignore it and retention never deletes it.
//   HEAD                          the newest version (src/sync/FORMAT.md, "Relay")
//   anchor-<v>.safetensors        full weights of version v (or .safetensors.zst, zstd)
//   anchor-<v>.record             version and state digest of that anchor, signed in signed relays
//   patch-<a>-<b>.pulse           the patch from version a to version b (a < b)
//   publish.lock                  held by the one publisher at work
//   <any of these>.tmp.<6 letters or digits>, anchor-<v>.safetensors.uncompressed[.tmp.<6>]
//                                 temporary files of a writer (removed by the next publisher)
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace pulse::sync {

enum class RelayFile { head, anchor, anchor_zst, anchor_record, patch, lock, temporary };

struct RelayName {
  RelayFile kind;
  std::uint64_t version = 0;  // anchor, anchor record: v; patch: a
  std::uint64_t to = 0;       // patch: b
};

// A canonical unsigned decimal that fits in 64 bits, or nothing.
std::optional<std::uint64_t> parse_canonical_version(std::string_view text);

std::optional<RelayName> parse_relay_name(std::string_view name);

std::string anchor_file_name(std::uint64_t version, bool compressed);
std::string anchor_record_name(std::uint64_t version);
std::string patch_file_name(std::uint64_t from, std::uint64_t to);
inline constexpr const char* kRelayHeadName = "HEAD";
inline constexpr const char* kRelayLockName = "publish.lock";

}  // namespace pulse::sync
