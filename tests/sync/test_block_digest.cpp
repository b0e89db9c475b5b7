// The block digest's evaluations against its definition: every whole-block sum, by each
// evaluation this build has (one block at a time; eight in AVX-512 lanes), equals the sum of
// the xxHash library's XXH3_128bits_withSeed per block, for random blocks, seeds near 0, 2^63
// and 2^64 (where they wrap), block counts around the lane width, unaligned data, listed
// (scattered) blocks, and pieces with a short last block at block offsets.
#include <gtest/gtest.h>

#include <xxhash.h>

#include <cstring>
#include <random>
#include <vector>

#include "coding/digest.hpp"

using namespace pulse::sync;

namespace {

// The sum modulo 2^128 of XXH3_128bits_withSeed(block i, seed + i) over the blocks of bytes
// (the last may be shorter), as a digest.
Digest library_sum(const std::uint8_t* data, std::size_t bytes, std::uint64_t seed) {
  unsigned __int128 sum = 0;
  for (std::size_t i = 0; kDigestBlockBytes * i < bytes; ++i) {
    const std::size_t n = std::min(kDigestBlockBytes, bytes - kDigestBlockBytes * i);
    const XXH128_hash_t h = XXH3_128bits_withSeed(data + kDigestBlockBytes * i, n, seed + i);
    sum += (unsigned __int128)(h.high64) << 64 | h.low64;
  }
  Digest d;
  for (int i = 0; i < 16; ++i) d[i] = std::uint8_t(sum >> (120 - 8 * i));
  return d;
}

std::vector<BlockLanes> evaluations() {
  std::vector<BlockLanes> all{BlockLanes::scalar};
  if (block_lanes() == BlockLanes::avx512) all.push_back(BlockLanes::avx512);
  return all;
}

std::vector<std::uint8_t> random_bytes(std::mt19937_64& rng, std::size_t n) {
  std::vector<std::uint8_t> bytes(n);
  for (auto& b : bytes) b = std::uint8_t(rng());
  return bytes;
}

TEST(BlockDigest, WholeBlocksMatchTheLibraryAtEverySeed) {
  std::mt19937_64 rng(30);
  const std::uint64_t half = std::uint64_t(1) << 63;
  const std::vector<std::uint64_t> seeds{0, 1, 7, 1000, half - 3, half, half + 5, ~std::uint64_t(0) - 9, rng()};
  for (std::size_t blocks : {0, 1, 7, 8, 9, 16, 23, 64, 101}) {
    // One byte more than the blocks, so that data + 1 is an unaligned start.
    const std::vector<std::uint8_t> bytes = random_bytes(rng, kDigestBlockBytes * blocks + 1);
    for (std::size_t shift : {0, 1}) {
      const std::uint8_t* data = bytes.data() + shift;
      for (std::uint64_t seed : seeds) {
        const Digest want = library_sum(data, kDigestBlockBytes * blocks, seed);
        for (BlockLanes lanes : evaluations())
          EXPECT_EQ(to_hex(sum_whole_blocks(data, blocks, seed, lanes).digest()), to_hex(want))
              << blocks << " blocks at seed " << seed << ", shift " << shift << ", lanes " << int(lanes);
      }
    }
  }
}

TEST(BlockDigest, SpecialBlocksMatchTheLibrary) {
  // Words of all zeros and all ones, and words equal to the secret's (products of zero).
  std::vector<std::uint8_t> bytes(kDigestBlockBytes * 24, 0);
  std::memset(bytes.data() + kDigestBlockBytes * 8, 0xFF, kDigestBlockBytes * 8);
  for (std::size_t i = 0; i < kDigestBlockBytes * 8; ++i) bytes[kDigestBlockBytes * 16 + i] = std::uint8_t(i * 37 + 11);
  for (std::uint64_t seed : {std::uint64_t(0), std::uint64_t(1) << 63}) {
    const Digest want = library_sum(bytes.data(), bytes.size(), seed);
    for (BlockLanes lanes : evaluations())
      EXPECT_EQ(to_hex(sum_whole_blocks(bytes.data(), 24, seed, lanes).digest()), to_hex(want)) << int(lanes);
  }
}

TEST(BlockDigest, ListedBlocksMatchTheLibrary) {
  std::mt19937_64 rng(32);
  for (std::size_t bytes : {std::size_t(128), std::size_t(1000), std::size_t(128 * 40), std::size_t(128 * 300 + 77)}) {
    const std::vector<std::uint8_t> data = random_bytes(rng, bytes);
    const std::uint64_t blocks = (bytes + kDigestBlockBytes - 1) / kDigestBlockBytes;
    for (int density : {1, 3, 8}) {  // in eighths of the blocks; the last block listed or not
      std::vector<std::uint64_t> numbers;
      unsigned __int128 want = 0;
      for (std::uint64_t b = 0; b < blocks; ++b) {
        if (int(rng() % 8) >= density) continue;
        numbers.push_back(b);
        const std::size_t n = std::min<std::size_t>(kDigestBlockBytes, bytes - kDigestBlockBytes * b);
        const XXH128_hash_t h = XXH3_128bits_withSeed(data.data() + kDigestBlockBytes * b, n, b);
        want += (unsigned __int128)(h.high64) << 64 | h.low64;
      }
      BlockDigest sum;
      sum.add_blocks(data.data(), bytes, numbers.data(), numbers.size());
      BlockDigest expected;
      expected.add_hash(std::uint64_t(want >> 64), std::uint64_t(want));
      EXPECT_EQ(sum, expected) << bytes << " bytes, " << numbers.size() << " blocks";
      // Whole blocks only, by each evaluation.
      const bool short_last = bytes % kDigestBlockBytes != 0 && !numbers.empty() && numbers.back() == blocks - 1;
      BlockDigest whole;
      for (std::size_t k = 0; k + short_last < numbers.size(); ++k)
        whole += sum_whole_blocks(data.data() + kDigestBlockBytes * numbers[k], 1, numbers[k], BlockLanes::scalar);
      for (BlockLanes lanes : evaluations())
        EXPECT_EQ(sum_listed_blocks(data.data(), numbers.data(), numbers.size() - short_last, lanes), whole)
            << int(lanes);
    }
  }
}

TEST(BlockDigest, PiecesAtOffsetsAddUpToTheTensorDigest) {
  std::mt19937_64 rng(31);
  for (std::size_t bytes : {std::size_t(0), std::size_t(5), std::size_t(128), std::size_t(1000), std::size_t(4096),
                            std::size_t(70001)}) {
    const std::vector<std::uint8_t> data = random_bytes(rng, bytes);
    const Digest want = library_sum(data.data(), bytes, 0);
    const TensorRef t{"t", "U8", {std::int64_t(bytes)}, reinterpret_cast<const std::byte*>(data.data()), bytes};
    EXPECT_EQ(to_hex(tensor_digest(t, 1)), to_hex(want)) << bytes;
    // Pieces of random whole blocks, the last one ending the tensor, added in any order.
    BlockDigest sum;
    std::size_t at = bytes;
    while (at > 0) {
      const std::size_t blocks_before = (at - 1) / kDigestBlockBytes;
      const std::size_t begin = kDigestBlockBytes * (blocks_before - std::min<std::size_t>(blocks_before, rng() % 20));
      sum.add(data.data() + begin, at - begin, begin);
      at = begin;
    }
    EXPECT_EQ(to_hex(sum.digest()), to_hex(want)) << bytes;
    sum.subtract(data.data(), bytes, 0);
    EXPECT_EQ(sum, BlockDigest()) << bytes;
  }
}

}  // namespace
