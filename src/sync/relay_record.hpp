#pragma once
// The relay's small text records: HEAD (the relay's id, the newest version, its state and layout
// digests and the version it follows) and anchor-<v>.record (the relay's id, an anchor's version,
// state digest and sizes), each optionally signed with the publisher's Ed25519 key, so a
// signature binds the version to its relay and model. The byte format is in src/sync/FORMAT.md
// ("Relay"). Parsing is strict (one spelling per record) and, given a public key, accepts only a
// valid signature. Records of formats 1 and 2 (state digests of whole-tensor xxh3-128) are
// refused with one line: publish the relay again.
#include <cstdint>
#include <optional>
#include <string>

#include "coding/digest.hpp"
#include "coding/signing.hpp"

namespace pulse::sync {

inline constexpr std::size_t kMaxRelayRecordBytes = 4096;

inline constexpr int kRelayRecordFormat = 3;  // what format_head and format_anchor_record write

// A relay's identity: 32 lowercase hex digits drawn at its first publish, kept by every later one.
using RelayId = std::string;
RelayId new_relay_id();

struct RelayHead {
  RelayId relay;  // "" in format 1
  std::uint64_t version = 0;
  Digest state{};
  Digest layout{};  // layout_digest of the state (format 2)
  std::optional<std::uint64_t> follows;  // the head version it replaced; none for the first
  bool is_signed = false;
  int format = kRelayRecordFormat;
};

struct AnchorRecord {
  RelayId relay;  // "" in format 1
  std::uint64_t version = 0;
  Digest state{};
  std::uint64_t file_bytes = 0;   // the anchor file's size (format 2)
  std::uint64_t state_bytes = 0;  // its safetensors bytes once decompressed (format 2)
  bool is_signed = false;
  int format = kRelayRecordFormat;
};

// In the record's format (format 1 only to re-spell what was parsed). With a key the record is
// signed; is_signed is ignored.
std::string format_head(const RelayHead& head, const SecretKey* key);
std::string format_anchor_record(const AnchorRecord& record, const SecretKey* key);

// Throw pulse::Error with one line naming `source`. With a public key an unsigned record or a
// bad signature is rejected; without one a signature is checked for form only.
RelayHead parse_head(const std::uint8_t* data, std::size_t size, const PublicKey* key, const std::string& source);
AnchorRecord parse_anchor_record(const std::uint8_t* data, std::size_t size, const PublicKey* key,
                                 const std::string& source);

}  // namespace pulse::sync
