#include "coding/digest.hpp"

// The header implementation, compiled for this CPU (AVX2 where -march=native has it), is
// several times faster than the generic build in the shared library.
#define XXH_INLINE_ALL
// GCC 12 warns inside xxhash.h's AVX-512 intrinsics wherever they are inlined into this file.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <xxhash.h>

#include <immintrin.h>

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
  add_hash(o.high_, o.low_);
  return *this;
}

BlockDigest& BlockDigest::operator-=(const BlockDigest& o) {
  const std::uint64_t low = low_ - o.low_;
  high_ -= o.high_ + (low > low_);
  low_ = low;
  return *this;
}

void BlockDigest::add_hash(std::uint64_t high, std::uint64_t low) {
  low_ += low;
  high_ += high + (low_ < low);
}

namespace {

// Whether this build hashes whole blocks eight at a time in AVX-512 lanes (F and DQ).
#if defined(__AVX512F__) && defined(__AVX512DQ__)
#define PULSE_BLOCK_LANES 1
#else
#define PULSE_BLOCK_LANES 0
#endif

BlockDigest sum_blocks_scalar(const std::uint8_t* p, std::size_t blocks, std::uint64_t seed) {
  // XXH3_128bits_withSeed's own path for 17-128 bytes, called with the length known, so that no
  // branch on it is left and consecutive blocks overlap (1.5-2x faster).
  static_assert(kDigestBlockBytes == 128, "the whole-block path is xxh3's for 17-128 bytes");
  BlockDigest sum;
  for (std::size_t i = 0; i < blocks; ++i, ++seed, p += kDigestBlockBytes) {
    const XXH128_hash_t h = XXH3_len_17to128_128b(p, kDigestBlockBytes, XXH3_kSecret, sizeof(XXH3_kSecret), seed);
    sum.add_hash(h.high64, h.low64);
  }
  return sum;
}

// Listed blocks are scattered, out of the hardware's prefetch: each is asked for this many
// blocks before it is hashed (from the block at numbers[0] on, of `left`).
constexpr std::size_t kListedAhead = 16;
void prefetch_blocks(const std::uint8_t* tensor, const std::uint64_t* numbers, std::size_t left) {
  for (std::size_t k = kListedAhead; k < std::min(left, kListedAhead + 8); ++k) {
    const char* block = reinterpret_cast<const char*>(tensor + numbers[k] * kDigestBlockBytes);
    _mm_prefetch(block, _MM_HINT_T0);
    _mm_prefetch(block + 64, _MM_HINT_T0);
  }
}

BlockDigest sum_listed_blocks_scalar(const std::uint8_t* tensor, const std::uint64_t* numbers, std::size_t count) {
  BlockDigest sum;
  for (std::size_t i = 0; i < count; ++i) {
    if (i % 8 == 0) prefetch_blocks(tensor, numbers + i, count - i);
    sum += sum_blocks_scalar(tensor + numbers[i] * kDigestBlockBytes, 1, numbers[i]);
  }
  return sum;
}

#if PULSE_BLOCK_LANES
// XXH3_len_17to128_128b for 128 bytes (the xxHash specification's 128-bit XXH3 of 17-128 bytes),
// evaluated for eight blocks at once: lane i of every vector belongs to block i.

std::uint64_t secret_word(std::size_t byte) {
  std::uint64_t w;
  std::memcpy(&w, XXH3_kSecret + byte, 8);  // little-endian, as x86 reads it
  return w;
}

// The 64x64->128-bit product of each lane's a and b, its two halves xor-ed, from four 32x32->64
// products (AVX-512 has no wider one).
[[gnu::always_inline]] inline __m512i mul128_fold64(__m512i a, __m512i b) {
  const __m512i low32 = _mm512_set1_epi64(0xFFFFFFFF);
  const __m512i a_high = _mm512_srli_epi64(a, 32), b_high = _mm512_srli_epi64(b, 32);
  const __m512i ll = _mm512_mul_epu32(a, b), lh = _mm512_mul_epu32(a, b_high);
  const __m512i hl = _mm512_mul_epu32(a_high, b), hh = _mm512_mul_epu32(a_high, b_high);
  // The middle 64 bits in two steps, neither of which can overflow.
  const __m512i cross = _mm512_add_epi64(lh, _mm512_srli_epi64(ll, 32));
  const __m512i cross2 = _mm512_add_epi64(hl, _mm512_and_si512(cross, low32));
  const __m512i high = _mm512_add_epi64(_mm512_add_epi64(hh, _mm512_srli_epi64(cross, 32)), _mm512_srli_epi64(cross2, 32));
  const __m512i low = _mm512_or_si512(_mm512_slli_epi64(cross2, 32), _mm512_and_si512(ll, low32));
  return _mm512_xor_si512(low, high);
}

[[gnu::always_inline]] inline __m512i avalanche(__m512i h) {
  h = _mm512_xor_si512(h, _mm512_srli_epi64(h, 37));
  h = _mm512_mullo_epi64(h, _mm512_set1_epi64(std::int64_t(0x165667919E3779F9ULL)));
  return _mm512_xor_si512(h, _mm512_srli_epi64(h, 32));
}

// Rows r[i] (8 words of block i) to columns c[j] (word j of blocks 0-7).
[[gnu::always_inline]] inline void transpose(const __m512i r[8], __m512i c[8]) {
  __m512i t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm512_unpacklo_epi64(r[i], r[i + 1]);      // words 0, 2, 4, 6 of blocks i, i + 1
    t[i + 1] = _mm512_unpackhi_epi64(r[i], r[i + 1]);  // words 1, 3, 5, 7
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm512_shuffle_i64x2(t[i], t[i + 2], 0x88);      // words 0, 4 of blocks i to i + 3
    u[i + 1] = _mm512_shuffle_i64x2(t[i], t[i + 2], 0xDD);  // words 2, 6
    u[i + 2] = _mm512_shuffle_i64x2(t[i + 1], t[i + 3], 0x88);  // words 1, 5
    u[i + 3] = _mm512_shuffle_i64x2(t[i + 1], t[i + 3], 0xDD);  // words 3, 7
  }
  c[0] = _mm512_shuffle_i64x2(u[0], u[4], 0x88);
  c[4] = _mm512_shuffle_i64x2(u[0], u[4], 0xDD);
  c[2] = _mm512_shuffle_i64x2(u[1], u[5], 0x88);
  c[6] = _mm512_shuffle_i64x2(u[1], u[5], 0xDD);
  c[1] = _mm512_shuffle_i64x2(u[2], u[6], 0x88);
  c[5] = _mm512_shuffle_i64x2(u[2], u[6], 0xDD);
  c[3] = _mm512_shuffle_i64x2(u[3], u[7], 0x88);
  c[7] = _mm512_shuffle_i64x2(u[3], u[7], 0xDD);
}

struct Lanes128 {
  __m512i low, high;
};

// XXH3_mix16B of words w[j], w[j + 1] with the secret's 16 bytes from `secret`.
[[gnu::always_inline]] inline __m512i mix16(const __m512i w[16], int j, std::size_t secret, __m512i seed) {
  const __m512i a = _mm512_xor_si512(w[j], _mm512_add_epi64(_mm512_set1_epi64(std::int64_t(secret_word(secret))), seed));
  const __m512i b = _mm512_xor_si512(w[j + 1], _mm512_sub_epi64(_mm512_set1_epi64(std::int64_t(secret_word(secret + 8))), seed));
  return mul128_fold64(a, b);
}

// XXH128_mix32B of words w[j1], w[j1 + 1] (input_1) and w[j2], w[j2 + 1] (input_2).
[[gnu::always_inline]] inline void mix32(Lanes128& acc, const __m512i w[16], int j1, int j2, std::size_t secret, __m512i seed) {
  acc.low = _mm512_add_epi64(acc.low, mix16(w, j1, secret, seed));
  acc.low = _mm512_xor_si512(acc.low, _mm512_add_epi64(w[j2], w[j2 + 1]));
  acc.high = _mm512_add_epi64(acc.high, mix16(w, j2, secret + 16, seed));
  acc.high = _mm512_xor_si512(acc.high, _mm512_add_epi64(w[j1], w[j1 + 1]));
}

// The xxh3-128 hashes of eight blocks, block[i]'s in lane i, seeds in `seed`.
[[gnu::always_inline]] inline Lanes128 hash8(const std::uint8_t* const block[8], __m512i seed) {
  constexpr std::uint64_t kPrime1 = 0x9E3779B185EBCA87ULL, kPrime2 = 0xC2B2AE3D27D4EB4FULL, kPrime4 = 0x85EBCA77C2B2AE63ULL;
  __m512i rows[8], w[16];
  for (int half = 0; half < 2; ++half) {
    for (int i = 0; i < 8; ++i) rows[i] = _mm512_loadu_si512(block[i] + 64 * half);
    transpose(rows, w + 8 * half);
  }
  Lanes128 acc{_mm512_set1_epi64(std::int64_t(kDigestBlockBytes * kPrime1)), _mm512_setzero_si512()};
  mix32(acc, w, 6, 8, 96, seed);
  mix32(acc, w, 4, 10, 64, seed);
  mix32(acc, w, 2, 12, 32, seed);
  mix32(acc, w, 0, 14, 0, seed);
  const __m512i low = avalanche(_mm512_add_epi64(acc.low, acc.high));
  __m512i high = _mm512_add_epi64(_mm512_mullo_epi64(acc.low, _mm512_set1_epi64(std::int64_t(kPrime1))),
                                  _mm512_mullo_epi64(acc.high, _mm512_set1_epi64(std::int64_t(kPrime4))));
  const __m512i length_less_seed = _mm512_sub_epi64(_mm512_set1_epi64(kDigestBlockBytes), seed);
  high = _mm512_add_epi64(high, _mm512_mullo_epi64(length_less_seed, _mm512_set1_epi64(std::int64_t(kPrime2))));
  return {low, _mm512_sub_epi64(_mm512_setzero_si512(), avalanche(high))};
}

// Each lane's running sum modulo 2^128: a carry where the low half wrapped.
[[gnu::always_inline]] inline void accumulate(Lanes128& sum, const Lanes128& h) {
  sum.low = _mm512_add_epi64(sum.low, h.low);
  const __mmask8 carry = _mm512_cmplt_epu64_mask(sum.low, h.low);
  sum.high = _mm512_add_epi64(sum.high, h.high);
  sum.high = _mm512_mask_sub_epi64(sum.high, carry, sum.high, _mm512_set1_epi64(-1));  // + 1 where carried
}

BlockDigest lanes_total(const Lanes128& sum) {
  std::uint64_t low[8], high[8];
  _mm512_storeu_si512(low, sum.low);
  _mm512_storeu_si512(high, sum.high);
  BlockDigest total;
  for (int i = 0; i < 8; ++i) total.add_hash(high[i], low[i]);
  return total;
}

BlockDigest sum_blocks_avx512(const std::uint8_t* p, std::size_t blocks, std::uint64_t first_seed) {
  // The hardware's prefetch alone leaves the loads waiting on memory (7 GB/s against 10 with
  // this, on one core of a Xeon with AVX-512); a prefetch beyond the data never faults.
  constexpr std::size_t kPrefetchAhead = 4096;
  __m512i seed = _mm512_add_epi64(_mm512_set1_epi64(std::int64_t(first_seed)), _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0));
  Lanes128 sum{_mm512_setzero_si512(), _mm512_setzero_si512()};
  std::size_t i = 0;
  for (; i + 8 <= blocks; i += 8, p += 8 * kDigestBlockBytes) {
    for (std::size_t line = 0; line < 8 * kDigestBlockBytes; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchAhead + line, _MM_HINT_T0);
    const std::uint8_t* block[8];
    for (int l = 0; l < 8; ++l) block[l] = p + l * kDigestBlockBytes;
    accumulate(sum, hash8(block, seed));
    seed = _mm512_add_epi64(seed, _mm512_set1_epi64(8));
  }
  BlockDigest total = lanes_total(sum);
  total += sum_blocks_scalar(p, blocks - i, first_seed + i);
  return total;
}

BlockDigest sum_listed_blocks_avx512(const std::uint8_t* tensor, const std::uint64_t* numbers, std::size_t count) {
  Lanes128 sum{_mm512_setzero_si512(), _mm512_setzero_si512()};
  std::size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    prefetch_blocks(tensor, numbers + i, count - i);
    const std::uint8_t* block[8];
    for (int l = 0; l < 8; ++l) block[l] = tensor + numbers[i + l] * kDigestBlockBytes;
    accumulate(sum, hash8(block, _mm512_loadu_si512(numbers + i)));
  }
  BlockDigest total = lanes_total(sum);
  total += sum_listed_blocks_scalar(tensor, numbers + i, count - i);
  return total;
}
#endif

}  // namespace

BlockLanes block_lanes() { return PULSE_BLOCK_LANES ? BlockLanes::avx512 : BlockLanes::scalar; }

BlockDigest sum_whole_blocks(const void* data, std::size_t blocks, std::uint64_t first_seed, BlockLanes lanes) {
  const auto* p = static_cast<const std::uint8_t*>(data);
#if PULSE_BLOCK_LANES
  if (lanes == BlockLanes::avx512) return sum_blocks_avx512(p, blocks, first_seed);
#endif
  PULSE_CHECK(lanes == BlockLanes::scalar, "internal: this build has no AVX-512 block digest");
  return sum_blocks_scalar(p, blocks, first_seed);
}

BlockDigest sum_listed_blocks(const void* tensor, const std::uint64_t* numbers, std::size_t count, BlockLanes lanes) {
  const auto* p = static_cast<const std::uint8_t*>(tensor);
#if PULSE_BLOCK_LANES
  if (lanes == BlockLanes::avx512) return sum_listed_blocks_avx512(p, numbers, count);
#endif
  PULSE_CHECK(lanes == BlockLanes::scalar, "internal: this build has no AVX-512 block digest");
  return sum_listed_blocks_scalar(p, numbers, count);
}

void BlockDigest::add(const void* data, std::size_t bytes, std::uint64_t offset) {
  if (bytes == 0) return;
  PULSE_CHECK(offset % kDigestBlockBytes == 0, "internal: a tensor digest piece that does not start a block");
  const auto* p = static_cast<const std::uint8_t*>(data);
  const std::uint64_t b = offset / kDigestBlockBytes;
  const std::size_t whole = bytes / kDigestBlockBytes;
  *this += sum_whole_blocks(p, whole, b, block_lanes());
  if (bytes % kDigestBlockBytes != 0) {  // the tensor's last block, shorter
    const XXH128_hash_t h = XXH3_128bits_withSeed(p + whole * kDigestBlockBytes, bytes % kDigestBlockBytes, b + whole);
    add_hash(h.high64, h.low64);
  }
}

void BlockDigest::add_blocks(const void* tensor, std::uint64_t bytes, const std::uint64_t* numbers, std::size_t count) {
  if (count == 0) return;
  // The tensor's last block, when shorter, by xxh3 of its length; the whole ones in lanes.
  const std::uint64_t last = numbers[count - 1];
  const bool short_last = (last + 1) * kDigestBlockBytes > bytes;
  *this += sum_listed_blocks(tensor, numbers, count - short_last, block_lanes());
  if (short_last) {
    const std::uint64_t offset = last * kDigestBlockBytes;
    const XXH128_hash_t h = XXH3_128bits_withSeed(static_cast<const std::uint8_t*>(tensor) + offset, bytes - offset, last);
    add_hash(h.high64, h.low64);
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
