#pragma once
// LEB128 varints and zig-zag, the index and value coding of PULSESync patches. Decoding is
// bounds-checked: a truncated varint, one of more than 10 bytes or one whose value needs more
// than 64 bits is an error, never an out-of-bounds read or a silently wrapped value. A
// non-minimal encoding (0x80 0x00 for 0) is accepted, as FORMAT.md "Accepted inputs" says.
#include <cstdint>
#include <vector>

#include "core/error.hpp"

namespace pulse::sync {

inline void put_varint(std::vector<std::uint8_t>& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<std::uint8_t>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<std::uint8_t>(v));
}

// Reads one varint at pos (advanced past it) from [data, data + size).
inline std::uint64_t get_varint(const std::uint8_t* data, std::size_t size, std::size_t& pos) {
  std::uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    PULSE_CHECK(pos < size, "patch stream ends inside a varint");
    const std::uint8_t b = data[pos++];
    // The 10th byte holds bit 63 only: any other payload bit would be dropped by the shift.
    PULSE_CHECK(shift < 63 || (b & 0x7E) == 0, "patch stream holds a varint beyond 64 bits");
    v |= std::uint64_t(b & 0x7F) << shift;
    if (!(b & 0x80)) return v;
  }
  throw_error(__FILE__, __LINE__, "patch stream holds a varint longer than 64 bits");
}

inline std::uint64_t zigzag(std::int64_t v) { return (std::uint64_t(v) << 1) ^ std::uint64_t(v >> 63); }
inline std::int64_t unzigzag(std::uint64_t v) { return std::int64_t(v >> 1) ^ -std::int64_t(v & 1); }

}  // namespace pulse::sync
