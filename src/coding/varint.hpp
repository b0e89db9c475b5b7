#pragma once
// LEB128 varints and zig-zag, the index and value coding of PULSESync patches. Decoding is
// bounds-checked: a truncated varint, one of more than 10 bytes or one whose value needs more
// than 64 bits is an error, never an out-of-bounds read or a silently wrapped value. A
// non-minimal encoding (0x80 0x00 for 0) is accepted, as FORMAT.md "Accepted inputs" says.
#include <cstddef>
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

// The same bytes written at `at` (advanced past them), for loops over many values: the caller
// grows the buffer once by a bound (varint_bytes of the largest value, times the count, plus
// kVarintSlack) and shrinks it after, instead of a capacity check per byte. Values below 2^28
// (the deltas and gaps of patches) are written as one 4-byte word without a branch on their
// length, which random deltas would mispredict; up to 3 bytes past the varint may be written.
constexpr std::size_t kVarintSlack = 4;

inline void put_varint(std::uint8_t*& at, std::uint64_t v) {
  if (v < (std::uint64_t(1) << 28)) {
    const unsigned n = 1 + unsigned(v >= 0x80) + unsigned(v >= 0x4000) + unsigned(v >= 0x200000);
    std::uint32_t word = std::uint32_t((v & 0x7F) | (v << 1 & 0x7F00) | (v << 2 & 0x7F0000) | (v << 3 & 0x7F000000));
    word |= 0x808080u & ((std::uint32_t(1) << (8 * (n - 1))) - 1);  // continuation bits of all but the last byte
    for (unsigned b = 0; b < 4; ++b) at[b] = std::uint8_t(word >> (8 * b));  // one store, any host order
    at += n;
    return;
  }
  while (v >= 0x80) {
    *at++ = static_cast<std::uint8_t>(v | 0x80);
    v >>= 7;
  }
  *at++ = static_cast<std::uint8_t>(v);
}

// Bytes of v's varint.
inline unsigned varint_bytes(std::uint64_t v) {
  unsigned n = 1;
  for (; v >= 0x80; v >>= 7) ++n;
  return n;
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
