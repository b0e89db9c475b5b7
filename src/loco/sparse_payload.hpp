#pragma once
// One trainer's PULSELoCo contribution on the wire: sorted indices in the PULSESync gap-varint
// coding, then the FP32 values raw (little-endian), zstd-compressed when that is smaller.
//   byte 0      compressor (0 none, 1 zstd)
//   varint      count of (index, value) pairs
//   varint      raw body size (zstd only)
//   body        gaps, then 4 * count value bytes
// Indices are coded relative to a base (the start of the slice the payload covers), so the
// same codec serves the whole vector and per-owner chunks.
#include <cstdint>
#include <vector>

#include "kernels/types.hpp"

namespace pulse::loco {

inline constexpr int kPayloadZstdLevel = 3;

std::vector<std::uint8_t> encode_sparse_payload(const index_t* sorted_indices, const float* values,
                                                std::size_t count, std::uint64_t base);

// Decodes a payload whose indices must lie in [base, end); throws pulse::Error on anything
// malformed (truncated, out of range, unsorted, trailing bytes).
struct SparsePairs {
  std::vector<index_t> indices;
  std::vector<float> values;
};
void decode_sparse_payload(const std::uint8_t* data, std::size_t size, std::uint64_t base, std::uint64_t end,
                           SparsePairs& out);

}  // namespace pulse::loco
