// pulse.Sender(copy="compressed")'s copy (python/src/compressed_copy.hpp): every byte read back
// as it was, whole or in any range (chunk boundaries, partial chunks), for element widths 1 to 8
// and a tensor shorter than a chunk; replaced by a state of another layout; never more bytes
// than the state, and fewer when the top bytes are few values (as trained weights' exponents).
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "compressed_copy.hpp"

using namespace pulse;
using python::CompressedCopy;

namespace {

struct Owned {
  std::string name, dtype;
  std::vector<std::byte> bytes;
  sync::TensorRef ref() const {
    const std::int64_t n = std::int64_t(bytes.size() / (dtype == "F64" ? 8 : dtype == "F32" ? 4 : dtype == "BF16" ? 2 : 1));
    return {name, dtype, {n}, bytes.data(), bytes.size()};
  }
};

// Elements of `width` bytes: random low bytes, the top byte one of four values (few exponents).
Owned weights(const std::string& name, const std::string& dtype, unsigned width, std::size_t elements, std::mt19937_64& g) {
  Owned t{name, dtype, std::vector<std::byte>(elements * width)};
  for (std::size_t i = 0; i < t.bytes.size(); ++i)
    t.bytes[i] = std::byte(i % width == width - 1 ? 0x3c + g() % 4 : g());
  return t;
}

std::vector<sync::TensorRef> refs(const std::vector<Owned>& state) {
  std::vector<sync::TensorRef> out;
  for (const auto& t : state) out.push_back(t.ref());
  return out;
}

void expect_reads_back(const CompressedCopy& copy, const std::vector<Owned>& state, std::mt19937_64& g) {
  ASSERT_EQ(copy.layout().size(), state.size());
  const sync::TensorLoader load = copy.loader();
  for (std::size_t i = 0; i < state.size(); ++i) {
    const auto& want = state[i].bytes;
    EXPECT_EQ(copy.layout()[i].data, nullptr);
    EXPECT_EQ(copy.layout()[i].bytes, want.size());
    std::vector<std::byte> all(want.size());
    if (!want.empty()) load(i, 0, want.size(), all.data());
    EXPECT_EQ(all, want) << state[i].name;
    for (int k = 0; k < 300 && !want.empty(); ++k) {
      std::uint64_t offset = g() % want.size();
      if (k % 4 == 0) offset = offset / CompressedCopy::kChunkBytes * CompressedCopy::kChunkBytes;  // a boundary
      const std::size_t bytes = k % 2 ? g() % std::min<std::size_t>(want.size() - offset + 1, 5000)
                                      : g() % (want.size() - offset + 1);
      std::vector<std::byte> got(bytes);
      load(i, offset, bytes, got.data());
      ASSERT_EQ(0, std::memcmp(got.data(), want.data() + offset, bytes)) << state[i].name << " at " << offset;
    }
  }
}

}  // namespace

TEST(CompressedCopy, ReadsBackEveryRangeOfEveryWidth) {
  std::mt19937_64 g(7);
  const std::size_t chunk = CompressedCopy::kChunkBytes;
  std::vector<Owned> state = {weights("bf16", "BF16", 2, (2 * chunk + 1234) / 2, g), weights("f32", "F32", 4, chunk / 4 + 3, g),
                              weights("u8", "U8", 1, 999, g), weights("f64", "F64", 8, chunk / 8 * 3, g),
                              Owned{"empty", "BF16", {}}};
  CompressedCopy copy;
  copy.assign(refs(state), 2);
  expect_reads_back(copy, state, g);
  std::size_t raw = 0;
  for (const auto& t : state) raw += t.bytes.size();
  EXPECT_LT(copy.stored_bytes(), raw);
  // a BF16 tensor whose top bytes are four values (2 bits of 8): under 0.67 of its bytes (0.625 + the coder's own)
  CompressedCopy one;
  one.assign({state[0].ref()}, 1);
  EXPECT_LT(double(one.stored_bytes()), 0.67 * double(state[0].bytes.size()));
}

TEST(CompressedCopy, RandomBytesNeverTakeMore) {
  std::mt19937_64 g(8);
  Owned noise{"noise", "BF16", std::vector<std::byte>(3 * CompressedCopy::kChunkBytes / 2)};
  for (auto& b : noise.bytes) b = std::byte(g());
  CompressedCopy copy;
  copy.assign({noise.ref()}, 1);
  EXPECT_LE(copy.stored_bytes(), noise.bytes.size());
  expect_reads_back(copy, {noise}, g);
}

TEST(CompressedCopy, ReplacedByAnotherLayout) {
  std::mt19937_64 g(9);
  const std::vector<Owned> first = {weights("a", "BF16", 2, 700000, g), weights("b", "F32", 4, 10, g),
                                    weights("c", "U8", 1, 5, g)};
  const std::vector<Owned> second = {weights("b", "F32", 4, 400000, g), weights("d", "BF16", 2, 3, g)};
  CompressedCopy copy;
  copy.assign(refs(first), 2);
  expect_reads_back(copy, first, g);
  copy.assign(refs(second), 1);
  expect_reads_back(copy, second, g);
  EXPECT_EQ(copy.layout()[0].name, "b");
}
