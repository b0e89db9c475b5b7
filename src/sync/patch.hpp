#pragma once
// PULSESync patches: the lossless change from one version of a model's weights to the next.
// BF16 tensors carry sorted changed indices and their new bit patterns; other tensors are
// marked unchanged or carried whole. The byte format is documented in src/sync/FORMAT.md.
//
// Receiving is transactional: parse_patch checks the structure, sizes, checksum and signature;
// apply_patch checks the receiver's tensors and base digests, decodes everything, and only
// then writes; it verifies the target digests and restores every touched byte on failure.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "sync/compress.hpp"
#include "sync/digest.hpp"
#include "sync/index_coding.hpp"
#include "sync/signing.hpp"

namespace pulse::sync {

enum class ValueCoding : std::uint8_t {
  raw = 0,      // new BF16 bit patterns, split into a low-byte plane and a high-byte plane
  keydiff = 1,  // zig-zag varint of key(new) - key(old): exact, usually one byte
};
enum class EntryKind : std::uint8_t {
  sparse = 0,  // BF16: changed indices + values
  same = 1,    // non-BF16, bytes unchanged
  whole = 2,   // non-BF16, new bytes carried whole
};

const char* value_coding_name(ValueCoding v);
ValueCoding parse_value_coding(const std::string& name);  // "raw", "keydiff"
const char* index_coding_name(IndexCoding i);
IndexCoding parse_index_coding(const std::string& name);  // "gap-fixed", "gap-varint"

struct EncodeOptions {
  ValueCoding values = ValueCoding::keydiff;
  IndexCoding indices = IndexCoding::gap_varint;
  Compressor compressor = Compressor::zstd;
  int level = 3;
  std::uint64_t base_version = 0;
  std::uint64_t target_version = 1;
  const SecretKey* signing_key = nullptr;  // sign when set
};

// Every size a patch declares is checked against these before anything is allocated.
struct PatchLimits {
  std::uint64_t max_patch_bytes = std::uint64_t(1) << 40;
  std::uint64_t max_tensors = std::uint64_t(1) << 20;
  std::uint64_t max_entry_table_bytes = std::uint64_t(1) << 28;
  std::uint64_t max_stream_bytes = std::uint64_t(1) << 36;
};

struct PatchEntry {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  EntryKind kind = EntryKind::sparse;
  std::uint8_t index_width = 0;  // gap_fixed: bytes per gap (1, 2, 4, 8); 0 otherwise
  std::uint64_t count = 0;       // sparse: changed elements; whole: bytes; same: 0
  Digest base_digest{};
  Digest target_digest{};
};

struct StreamSize {
  std::uint64_t coded = 0;
  std::uint64_t raw = 0;
};

struct PatchHeader {
  std::uint16_t format_version = 1;
  bool is_signed = false;
  ValueCoding values = ValueCoding::keydiff;
  IndexCoding indices = IndexCoding::gap_varint;
  Compressor compressor = Compressor::zstd;
  std::uint64_t base_version = 0;
  std::uint64_t target_version = 0;
  Digest base_state{};
  Digest target_state{};
  std::uint64_t total_changed = 0;
  StreamSize index_stream, value_stream, whole_stream;
};

// A patch whose structure, sizes, checksum and (when a key was given) signature are valid.
// It refers to the bytes it was parsed from, which must outlive it.
struct ParsedPatch {
  PatchHeader header;
  std::vector<PatchEntry> entries;
  const std::uint8_t* index_stream = nullptr;
  const std::uint8_t* value_stream = nullptr;
  const std::uint8_t* whole_stream = nullptr;
  std::uint64_t patch_bytes = 0;
};

// A receiver's tensor, writable in place.
struct MutableTensor {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::byte* data = nullptr;
  std::size_t bytes = 0;
  TensorRef view() const { return {name, dtype, shape, data, bytes}; }
};

// Digests of a state that a sender or receiver keeps from one version to the next, so the next
// encode or apply need not hash the base again: pass the digests the previous call returned
// for exactly the bytes it now holds.
struct StateDigests {
  std::map<std::string, Digest> tensors;
  Digest state{};
};
StateDigests compute_digests(const std::vector<TensorRef>& state);

// Base and target must hold the same tensor names with equal dtypes and shapes. With
// base_digests the base is not hashed again; target_digests, when given, receives the target's.
std::vector<std::uint8_t> encode_patch(const std::vector<TensorRef>& base, const std::vector<TensorRef>& target,
                                       const EncodeOptions& options, const StateDigests* base_digests = nullptr,
                                       StateDigests* target_digests = nullptr);

// Throws pulse::Error with a one-line reason. With a public key, an unsigned patch or a bad
// signature is rejected.
ParsedPatch parse_patch(const std::uint8_t* bytes, std::size_t size, const PatchLimits& limits = {},
                        const PublicKey* public_key = nullptr);

// Applies a parsed patch to the receiver's state in place. On any failure the state is left
// exactly as it was and pulse::Error says why. Returns the number of elements written. With
// base_digests (what the previous apply returned) the base is not hashed again; only the
// tensors the patch touches are hashed after writing. target_digests receives the new digests.
std::uint64_t apply_patch(const ParsedPatch& patch, std::vector<MutableTensor>& state, const PatchLimits& limits = {},
                          const StateDigests* base_digests = nullptr, StateDigests* target_digests = nullptr);

}  // namespace pulse::sync
