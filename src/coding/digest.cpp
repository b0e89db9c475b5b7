#include "coding/digest.hpp"

// The header implementation, compiled for this CPU (AVX2 where -march=native has it), is
// several times faster than the generic build in the shared library.
#define XXH_INLINE_ALL
// GCC 12 warns inside xxhash.h's AVX-512 intrinsics wherever they are inlined into this file.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/error.hpp"
#include "coding/parallel.hpp"

namespace pulse::sync {

namespace {

Digest canonical_digest(XXH128_hash_t h) {
  XXH128_canonical_t canonical;  // big-endian bytes, the same on every machine
  XXH128_canonicalFromHash(&canonical, h);
  Digest d;
  std::memcpy(d.data(), canonical.digest, d.size());
  return d;
}

}  // namespace

Digest digest_bytes(const void* data, std::size_t bytes) { return canonical_digest(XXH3_128bits(data, bytes)); }

DigestStream::DigestStream() : state_(XXH3_createState()) {
  PULSE_CHECK(state_ != nullptr, "out of memory for a digest state");
  XXH3_128bits_reset(static_cast<XXH3_state_t*>(state_));
}

DigestStream::~DigestStream() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void DigestStream::update(const void* data, std::size_t bytes) {
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), data, bytes);
}

Digest DigestStream::finish() const {
  return canonical_digest(XXH3_128bits_digest(static_cast<const XXH3_state_t*>(state_)));
}

BlockDigest BlockDigest::of(const Digest& d) {
  BlockDigest b;
  for (int i = 0; i < 8; ++i) {
    b.high_ = b.high_ << 8 | d[i];
    b.low_ = b.low_ << 8 | d[8 + i];
  }
  return b;
}

Digest BlockDigest::digest() const {
  Digest d;
  for (int i = 0; i < 8; ++i) {
    d[i] = std::uint8_t(high_ >> (56 - 8 * i));
    d[8 + i] = std::uint8_t(low_ >> (56 - 8 * i));
  }
  return d;
}

BlockDigest& BlockDigest::operator+=(const BlockDigest& o) {
  const std::uint64_t low = low_ + o.low_;
  high_ += o.high_ + (low < low_);
  low_ = low;
  return *this;
}

BlockDigest& BlockDigest::operator-=(const BlockDigest& o) {
  const std::uint64_t low = low_ - o.low_;
  high_ -= o.high_ + (low > low_);
  low_ = low;
  return *this;
}

void BlockDigest::add(const void* data, std::size_t bytes, std::uint64_t offset) {
  if (bytes == 0) return;
  PULSE_CHECK(offset % kDigestBlockBytes == 0, "internal: a tensor digest piece that does not start a block");
  const auto* p = static_cast<const std::uint8_t*>(data);
  std::uint64_t b = offset / kDigestBlockBytes;
  // Whole blocks: XXH3_128bits_withSeed's own path for 17-128 bytes, called with the length
  // known, so that no branch on it is left and consecutive blocks overlap (1.5-2x faster).
  static_assert(kDigestBlockBytes == 128, "the whole-block path is xxh3's for 17-128 bytes");
  for (; bytes >= kDigestBlockBytes; ++b, p += kDigestBlockBytes, bytes -= kDigestBlockBytes) {
    const XXH128_hash_t h = XXH3_len_17to128_128b(p, kDigestBlockBytes, XXH3_kSecret, sizeof(XXH3_kSecret), b);
    const std::uint64_t low = low_ + h.low64;
    high_ += h.high64 + (low < low_);
    low_ = low;
  }
  for (; bytes > 0; ++b) {
    const std::size_t n = std::min(bytes, kDigestBlockBytes);
    const XXH128_hash_t h = XXH3_128bits_withSeed(p, n, b);
    const std::uint64_t low = low_ + h.low64;
    high_ += h.high64 + (low < low_);
    low_ = low;
    p += n;
    bytes -= n;
  }
}

void BlockDigest::subtract(const void* data, std::size_t bytes, std::uint64_t offset) {
  BlockDigest piece;
  piece.add(data, bytes, offset);
  *this -= piece;
}

Digest tensor_digest(const TensorRef& t, unsigned threads) {
  // Ranges of 1 MiB: enough work per task, and a whole number of blocks.
  constexpr std::size_t kRange = std::size_t(1) << 20;
  const std::size_t ranges = (t.bytes + kRange - 1) / kRange;
  std::vector<BlockDigest> sums(ranges);
  parallel_for(ranges > 1 ? threads : 1, ranges, [&](std::size_t r) {
    const std::size_t begin = r * kRange;
    sums[r].add(t.data + begin, std::min(kRange, t.bytes - begin), begin);
  });
  BlockDigest total;
  for (const auto& s : sums) total += s;
  return total.digest();
}

std::string to_hex(const Digest& d) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (std::uint8_t b : d) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

Digest digest_from_hex(const std::string& hex) {
  PULSE_CHECK(hex.size() == 32, "a digest is 32 hex digits, got '" + hex + "'");
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    throw_error(__FILE__, __LINE__, "not a hex digest: '" + hex + "'");
  };
  Digest d;
  for (std::size_t i = 0; i < d.size(); ++i) d[i] = static_cast<std::uint8_t>(nibble(hex[2 * i]) * 16 + nibble(hex[2 * i + 1]));
  return d;
}

namespace {

Digest finish(XXH3_state_t* state) {
  const XXH128_hash_t h = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  return canonical_digest(h);
}

// Hashes names, dtypes and shapes in order of name, and each tensor's digest when given.
XXH3_state_t* hash_layout(const std::vector<TensorRef>& tensors, const std::vector<Digest>* tensor_digests) {
  std::vector<std::size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return tensors[a].name < tensors[b].name; });
  XXH3_state_t* state = XXH3_createState();
  PULSE_CHECK(state != nullptr, "out of memory for a digest state");
  XXH3_128bits_reset(state);
  for (std::size_t i : order) {
    const TensorRef& t = tensors[i];
    XXH3_128bits_update(state, t.name.c_str(), t.name.size() + 1);  // with its terminating 0
    XXH3_128bits_update(state, t.dtype.c_str(), t.dtype.size() + 1);
    const std::uint64_t rank = t.shape.size();
    XXH3_128bits_update(state, &rank, sizeof rank);
    for (std::int64_t d : t.shape) XXH3_128bits_update(state, &d, sizeof d);
    if (tensor_digests) XXH3_128bits_update(state, (*tensor_digests)[i].data(), (*tensor_digests)[i].size());
  }
  return state;
}

}  // namespace

Digest state_digest(const std::vector<TensorRef>& tensors, const std::vector<Digest>& tensor_digests,
                    const std::map<std::string, std::string>& metadata) {
  PULSE_CHECK(tensors.size() == tensor_digests.size(), "state_digest: one digest per tensor");
  XXH3_state_t* state = hash_layout(tensors, &tensor_digests);
  if (!metadata.empty()) {
    // A 0xFF byte cannot start a tensor's name (safetensors names are UTF-8), so the metadata
    // part cannot be mistaken for another tensor.
    const std::uint8_t marker = 0xFF;
    const std::uint64_t count = metadata.size();
    XXH3_128bits_update(state, &marker, 1);
    XXH3_128bits_update(state, &count, sizeof count);
    for (const auto& [key, value] : metadata) {
      for (const std::string* s : {&key, &value}) {
        const std::uint64_t length = s->size();
        XXH3_128bits_update(state, &length, sizeof length);
        XXH3_128bits_update(state, s->data(), s->size());
      }
    }
  }
  return finish(state);
}

Digest state_digest(const std::vector<TensorRef>& tensors, const std::map<std::string, std::string>& metadata) {
  std::vector<Digest> digests;
  digests.reserve(tensors.size());
  for (const auto& t : tensors) digests.push_back(tensor_digest(t));
  return state_digest(tensors, digests, metadata);
}

Digest layout_digest(const std::vector<TensorRef>& tensors) { return finish(hash_layout(tensors, nullptr)); }

}  // namespace pulse::sync
