#pragma once
// The bytes of a patch (FORMAT.md), shared by its writer (patch_encode.cpp), its reader
// (patch_parse.cpp) and its decoder (patch_decode.cpp): bounded little-endian reading, the entry
// and part tables, and the whole file's writing. Internal to the patch code.
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.hpp"
#include "sync/patch.hpp"
#include "coding/varint.hpp"

namespace pulse::sync::patch_bytes {

inline constexpr char kMagic[8] = {'P', 'U', 'L', 'S', 'E', 'P', 'C', 'H'};
inline constexpr std::uint16_t kFormatVersion = 3;

struct Writer {
  std::vector<std::uint8_t> out;
  template <class T>
  void put(T v) {
    static_assert(std::is_integral_v<T>);
    for (std::size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<std::uint8_t>(std::uint64_t(v) >> (8 * i)));
  }
  void put_bytes(const void* data, std::size_t n) {
    const auto* p = static_cast<const std::uint8_t*>(data);
    out.insert(out.end(), p, p + n);
  }
};

struct Reader {
  const std::uint8_t* data;
  std::size_t size;
  std::size_t pos = 0;
  const char* what;
  void need(std::size_t n) const {
    PULSE_CHECK(n <= size - pos, std::string("patch is truncated inside the ") + what);
  }
  template <class T>
  T get() {
    need(sizeof(T));
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) v |= std::uint64_t(data[pos + i]) << (8 * i);
    pos += sizeof(T);
    return static_cast<T>(v);
  }
  void get_bytes(void* dst, std::size_t n) {
    need(n);
    std::memcpy(dst, data + pos, n);
    pos += n;
  }
};

// Bounded reading of the tables' varints and strings.
struct TableReader {
  Reader r;
  std::uint64_t varint() { return get_varint(r.data, r.size, r.pos); }
  // A count of items that each take at least one byte: bounded by the bytes left.
  std::uint64_t count(std::uint64_t limit, const char* what) {
    const std::uint64_t n = varint();
    PULSE_CHECK(n <= limit && n <= r.size - r.pos, std::string("patch declares too many ") + what);
    return n;
  }
  std::string string() {
    const std::uint64_t n = varint();
    r.need(n);
    std::string s(reinterpret_cast<const char*>(r.data + r.pos), n);
    r.pos += n;
    return s;
  }
};

std::uint64_t numel_of(const std::vector<std::int64_t>& shape);
// Bytes a tensor of this dtype and shape holds; throws for an unknown dtype or a sub-byte
// tensor that does not fill whole bytes.
std::uint64_t layout_bytes(const std::string& name, const std::string& dtype, const std::vector<std::int64_t>& shape);

// The caller's digest of a tensor it holds; throws when the caller's record lacks it.
const Digest& known_digest(const StateDigests& known, const std::string& name);

// The per-dtype totals of a target layout and its entries (in the same order).
std::vector<DtypeSummary> summarize(const std::vector<TensorLayout>& layout, const std::vector<std::uint64_t>& bytes,
                                    const std::vector<PatchEntry>& entries);

// Everything a patch states, before it is written.
struct PatchContent {
  std::vector<std::string> removed;
  std::vector<TensorLayout> added;
  const Metadata* target_metadata = nullptr;  // when the metadata changes
  std::vector<TensorLayout> target_layout;    // in name order, one per entry
  std::vector<std::uint64_t> target_bytes;
  std::vector<PatchEntry> entries;
  Digest base_layout{}, base_state{}, target_state{};
  std::vector<EncodedPart> parts;
  std::vector<std::uint8_t> whole_stream;
};

// The entry table then the part table (FORMAT.md).
std::vector<std::uint8_t> tables(const EncodeOptions& options, const PatchContent& c);

// The patch's bytes: header, tables, the parts' streams, whole stream, checksum, signature.
std::vector<std::uint8_t> write_patch(const EncodeOptions& options, const PatchContent& c);

// The segments of a sparse tensor of n elements, `width` bytes each: runs of at most
// part_elements elements, rounded down to whole 128-byte blocks (at least one block).
std::uint64_t segment_elements(std::uint64_t part_elements, unsigned width);

}  // namespace pulse::sync::patch_bytes
