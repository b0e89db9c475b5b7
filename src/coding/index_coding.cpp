#include "coding/index_coding.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "coding/varint.hpp"

namespace pulse::sync {

int gap_width(std::uint64_t max_gap) {
  if (max_gap <= 0xFF) return 1;
  if (max_gap <= 0xFFFF) return 2;
  if (max_gap <= 0xFFFFFFFFull) return 4;
  return 8;
}

int fixed_gap_width(const index_t* sorted, std::size_t count, std::uint64_t base) {
  std::uint64_t max_gap = 0;
  for (std::size_t k = 0; k < count; ++k)
    max_gap = std::max<std::uint64_t>(max_gap, std::uint64_t(sorted[k]) - (k ? std::uint64_t(sorted[k - 1]) + 1 : base));
  return gap_width(max_gap);
}

void encode_gaps(IndexCoding coding, int width, const index_t* sorted, std::size_t count, std::uint64_t base,
                 std::vector<std::uint8_t>& out) {
  PULSE_CHECK(coding != IndexCoding::exponent_class, "encode_gaps does not code the exponent-class coding");
  if (count == 0) return;
  // The widest gap bounds every gap's bytes (one pass that vectorises).
  std::uint64_t max_gap = 0;
  if (coding == IndexCoding::gap_varint)
    for (std::size_t k = 0; k < count; ++k)
      max_gap = std::max<std::uint64_t>(max_gap, std::uint64_t(sorted[k]) - (k ? std::uint64_t(sorted[k - 1]) + 1 : base));
  const std::size_t most = coding == IndexCoding::gap_varint ? varint_bytes(max_gap) : std::size_t(width);
  const std::size_t first = out.size();
  out.resize(first + most * count + kVarintSlack);
  std::uint8_t* at = out.data() + first;
  for (std::size_t k = 0; k < count; ++k) {
    const std::uint64_t gap = std::uint64_t(sorted[k]) - (k ? std::uint64_t(sorted[k - 1]) + 1 : base);
    if (coding == IndexCoding::gap_varint) {
      put_varint(at, gap);
    } else {
      for (int byte = 0; byte < width; ++byte) *at++ = static_cast<std::uint8_t>(gap >> (8 * byte));
    }
  }
  out.resize(std::size_t(at - out.data()));
}

template <class Index>
void decode_gaps(IndexCoding coding, int width, const std::uint8_t* data, std::size_t size, std::size_t& pos,
                 std::uint64_t count, std::uint64_t base, std::uint64_t end, Index* out, const char* stream,
                 const std::string& context) {
  PULSE_CHECK(coding != IndexCoding::exponent_class, "decode_gaps does not read the exponent-class coding");
  std::uint64_t next = base;  // smallest index the next entry may take
  for (std::uint64_t k = 0; k < count; ++k) {
    std::uint64_t gap;
    if (coding == IndexCoding::gap_varint) {
      gap = get_varint(data, size, pos);
    } else {
      PULSE_CHECK(size - pos >= std::size_t(width), std::string(stream) + " index stream is truncated");
      gap = 0;
      for (int b = 0; b < width; ++b) gap |= std::uint64_t(data[pos++]) << (8 * b);
    }
    PULSE_CHECK(next < end && gap < end - next, std::string(stream) + " index out of range" + context);
    out[k] = static_cast<Index>(next + gap);
    next = next + gap + 1;
  }
}

template void decode_gaps<std::uint64_t>(IndexCoding, int, const std::uint8_t*, std::size_t, std::size_t&,
                                         std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t*, const char*,
                                         const std::string&);
template void decode_gaps<index_t>(IndexCoding, int, const std::uint8_t*, std::size_t, std::size_t&, std::uint64_t,
                                   std::uint64_t, std::uint64_t, index_t*, const char*, const std::string&);

}  // namespace pulse::sync
