#include "loco/sparse_payload.hpp"

#include "core/error.hpp"
#include "kernels/bf16.hpp"
#include "coding/compress.hpp"
#include "coding/index_coding.hpp"
#include "coding/varint.hpp"

namespace pulse::loco {

namespace {

constexpr std::uint8_t kRaw = 0;
constexpr std::uint8_t kZstd = 1;
constexpr std::uint64_t kMaxVarintBytes = 10;

}  // namespace

std::vector<std::uint8_t> encode_sparse_payload(const index_t* sorted_indices, const float* values,
                                                std::size_t count, std::uint64_t base) {
  std::vector<std::uint8_t> body;
  body.reserve(count * 6);
  sync::encode_gaps(sync::IndexCoding::gap_varint, 0, sorted_indices, count, base, body);
  for (std::size_t k = 0; k < count; ++k) {
    const std::uint32_t bits = float_to_bits(values[k]);
    for (int b = 0; b < 4; ++b) body.push_back(static_cast<std::uint8_t>(bits >> (8 * b)));
  }
  std::vector<std::uint8_t> out{kRaw};
  sync::put_varint(out, count);
  std::vector<std::uint8_t> coded = sync::compress(sync::Compressor::zstd, kPayloadZstdLevel, body);
  std::vector<std::uint8_t> zstd_header{kZstd};
  sync::put_varint(zstd_header, count);
  sync::put_varint(zstd_header, body.size());
  if (zstd_header.size() + coded.size() < out.size() + body.size()) {
    zstd_header.insert(zstd_header.end(), coded.begin(), coded.end());
    return zstd_header;
  }
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

void decode_sparse_payload(const std::uint8_t* data, std::size_t size, std::uint64_t base, std::uint64_t end,
                           SparsePairs& out) {
  PULSE_CHECK(size >= 1, "PULSELoCo payload is empty");
  PULSE_CHECK(base <= end, "PULSELoCo payload slice [" + std::to_string(base) + ", " + std::to_string(end) + ") is empty");
  const std::uint8_t compressor = data[0];
  PULSE_CHECK(compressor == kRaw || compressor == kZstd,
              "PULSELoCo payload names unknown compressor " + std::to_string(compressor));
  std::size_t pos = 1;
  const std::uint64_t count = sync::get_varint(data, size, pos);
  PULSE_CHECK(count <= end - base, "PULSELoCo payload holds " + std::to_string(count) + " pairs for a slice of " +
                                       std::to_string(end - base) + " elements");
  const std::uint64_t max_body = count * (kMaxVarintBytes + 4);
  std::vector<std::uint8_t> inflated;
  const std::uint8_t* body = data + pos;
  std::size_t body_size = size - pos;
  if (compressor == kZstd) {
    const std::uint64_t raw_size = sync::get_varint(data, size, pos);
    PULSE_CHECK(raw_size <= max_body, "PULSELoCo payload declares " + std::to_string(raw_size) +
                                          " body bytes for " + std::to_string(count) + " pairs");
    inflated = sync::decompress(sync::Compressor::zstd, data + pos, size - pos, raw_size);
    body = inflated.data();
    body_size = inflated.size();
  }
  out.indices.resize(count);
  out.values.resize(count);
  std::size_t body_pos = 0;
  sync::decode_gaps(sync::IndexCoding::gap_varint, 0, body, body_size, body_pos, count, base, end,
                    out.indices.data(), "PULSELoCo payload", "");
  PULSE_CHECK(body_size - body_pos == 4 * count, "PULSELoCo payload holds " + std::to_string(body_size - body_pos) +
                                                     " value bytes for " + std::to_string(count) + " pairs");
  for (std::uint64_t k = 0; k < count; ++k) {
    std::uint32_t bits = 0;
    for (int b = 0; b < 4; ++b) bits |= std::uint32_t(body[body_pos++]) << (8 * b);
    out.values[k] = bits_to_float(bits);
  }
}

}  // namespace pulse::loco
