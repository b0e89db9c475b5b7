#pragma once
// The relay's small text records: HEAD (the newest version, its state digest and the version it
// follows) and anchor-<v>.record (an anchor's version and state digest), each optionally signed
// with the publisher's Ed25519 key. The byte format is in src/sync/FORMAT.md ("Relay"). Parsing
// is strict (one spelling per record) and, given a public key, accepts only a valid signature.
#include <cstdint>
#include <optional>
#include <string>

#include "sync/digest.hpp"
#include "sync/signing.hpp"

namespace pulse::sync {

inline constexpr std::size_t kMaxRelayRecordBytes = 4096;

struct RelayHead {
  std::uint64_t version = 0;
  Digest state{};
  std::optional<std::uint64_t> follows;  // the head version it replaced; none for the first
  bool is_signed = false;
};

struct AnchorRecord {
  std::uint64_t version = 0;
  Digest state{};
  bool is_signed = false;
};

// With a key the record is signed; is_signed is ignored.
std::string format_head(const RelayHead& head, const SecretKey* key);
std::string format_anchor_record(const AnchorRecord& record, const SecretKey* key);

// Throw pulse::Error with one line naming `source`. With a public key an unsigned record or a
// bad signature is rejected; without one a signature is checked for form only.
RelayHead parse_head(const std::uint8_t* data, std::size_t size, const PublicKey* key, const std::string& source);
AnchorRecord parse_anchor_record(const std::uint8_t* data, std::size_t size, const PublicKey* key,
                                 const std::string& source);

}  // namespace pulse::sync
