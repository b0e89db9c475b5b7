#pragma once
// Digests of tensors and of a whole model state (FORMAT.md). A tensor's digest is additive over
// its 128-byte blocks (BlockDigest), so pieces of a tensor hashed apart (threads, parts of a
// patch, shards) add up, and a change updates it in the blocks it touches. The state digest is
// canonical: it covers every tensor's name, dtype, shape and digest, in order of name, so two
// files with the same tensors in another layout have the same digest.
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace pulse::sync {

using Digest = std::array<std::uint8_t, 16>;

// xxh3-128 of bytes (checksums of files and patches; not a tensor's digest).
Digest digest_bytes(const void* data, std::size_t bytes);

// digest_bytes of bytes that arrive in pieces: the pieces' concatenation.
class DigestStream {
 public:
  DigestStream();
  ~DigestStream();
  DigestStream(const DigestStream&) = delete;
  DigestStream& operator=(const DigestStream&) = delete;
  void update(const void* data, std::size_t bytes);
  Digest finish() const;

 private:
  void* state_;  // an XXH3_state_t
};
std::string to_hex(const Digest& d);
// Parses 32 hex digits; throws pulse::Error otherwise.
Digest digest_from_hex(const std::string& hex);

// One tensor of a model state, as its bytes (any safetensors dtype).
struct TensorRef {
  std::string name;
  std::string dtype;  // safetensors dtype name: "BF16", "F32", ...
  std::vector<std::int64_t> shape;
  const std::byte* data = nullptr;
  std::size_t bytes = 0;
};

// The digest of a tensor's bytes: the sum, modulo 2^128, of XXH3_128bits_withSeed(block, b)
// over its blocks b of kDigestBlockBytes (the last may be shorter). Pieces that start at block
// boundaries are hashed apart and added; a piece is added at its byte offset in the tensor.
inline constexpr std::size_t kDigestBlockBytes = 128;
class BlockDigest {
 public:
  BlockDigest() = default;
  static BlockDigest of(const Digest& d);  // the sum a tensor digest states
  // Adds (subtracts) the blocks of bytes [offset, offset + bytes) of the tensor; offset is a
  // multiple of kDigestBlockBytes, and bytes too unless the piece ends the tensor.
  void add(const void* data, std::size_t bytes, std::uint64_t offset);
  void subtract(const void* data, std::size_t bytes, std::uint64_t offset);
  // Adds the blocks numbered numbers[0, count) (ascending) of the tensor at `tensor` of `bytes`.
  void add_blocks(const void* tensor, std::uint64_t bytes, const std::uint64_t* numbers, std::size_t count);
  void add_hash(std::uint64_t high, std::uint64_t low);  // one block's xxh3-128 hash
  BlockDigest& operator+=(const BlockDigest& o);
  BlockDigest& operator-=(const BlockDigest& o);
  bool operator==(const BlockDigest& o) const { return high_ == o.high_ && low_ == o.low_; }
  Digest digest() const;

 private:
  std::uint64_t high_ = 0, low_ = 0;
};

// How BlockDigest::add hashes whole blocks: one at a time, or eight at once in the lanes of
// AVX-512 vectors (where this build's CPU has AVX-512 F and DQ). Both give the same sums.
enum class BlockLanes { scalar, avx512 };
BlockLanes block_lanes();  // this build's
// The sum over `blocks` whole blocks at data of XXH3_128bits_withSeed(block i, first_seed + i)
// (seeds modulo 2^64), by `lanes` (avx512 only where block_lanes() is); public for the tests.
BlockDigest sum_whole_blocks(const void* data, std::size_t blocks, std::uint64_t first_seed, BlockLanes lanes);
// The sum over the whole blocks numbered numbers[0, count) of a tensor of XXH3_128bits_withSeed
// (block, its number), by `lanes`.
BlockDigest sum_listed_blocks(const void* tensor, const std::uint64_t* numbers, std::size_t count, BlockLanes lanes);

// The tensor's digest, hashed by `threads` threads (0: the machine's cores) in block ranges.
Digest tensor_digest(const TensorRef& t, unsigned threads = 1);

// Canonical digest of a state from its tensors' names, dtypes, shapes and per-tensor digests,
// and its `__metadata__` (key, value pairs); an empty metadata adds nothing.
Digest state_digest(const std::vector<TensorRef>& tensors, const std::vector<Digest>& tensor_digests,
                    const std::map<std::string, std::string>& metadata = {});
Digest state_digest(const std::vector<TensorRef>& tensors, const std::map<std::string, std::string>& metadata = {});

// Digest of a layout: the tensors' names, dtypes and shapes in order of name, no contents.
Digest layout_digest(const std::vector<TensorRef>& tensors);

}  // namespace pulse::sync
