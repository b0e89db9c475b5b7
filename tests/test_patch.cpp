// PULSESync patches: bit-exact round trips for every coding, special values and shapes, and
// rejection of every corruption with the receiver's weights untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "core/error.hpp"
#include "kernels/bf16.hpp"
#include "sync/patch.hpp"

using namespace pulse;
using namespace pulse::sync;

namespace {

struct OwnedTensor {
  std::string name, dtype;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> bytes;
};
using State = std::vector<OwnedTensor>;

std::vector<TensorRef> refs(const State& s) {
  std::vector<TensorRef> out;
  for (const auto& t : s) out.push_back({t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
  return out;
}

std::vector<MutableTensor> mutables(State& s) {
  std::vector<MutableTensor> out;
  for (auto& t : s) out.push_back({t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
  return out;
}

OwnedTensor bf16_tensor(const std::string& name, const std::vector<bf16_bits>& bits) {
  OwnedTensor t{name, "BF16", {std::int64_t(bits.size())}, std::vector<std::byte>(2 * bits.size())};
  std::memcpy(t.bytes.data(), bits.data(), t.bytes.size());
  return t;
}

std::vector<bf16_bits> bits_of(const OwnedTensor& t) {
  std::vector<bf16_bits> out(t.bytes.size() / 2);
  std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
  return out;
}

// A state of BF16 weights ~ N(0, 0.02), an F32 tensor and an I64 tensor.
State random_state(std::mt19937& rng, std::size_t n) {
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<bf16_bits> w(n), b(7);
  for (auto& x : w) x = float_to_bf16(normal(rng));
  for (auto& x : b) x = float_to_bf16(normal(rng));
  State s{bf16_tensor("blocks.0.attn.qkv.weight", w), bf16_tensor("blocks.0.ln.bias", b)};
  OwnedTensor f{"scale", "F32", {3}, std::vector<std::byte>(12)};
  const float fv[3] = {1.0f, -2.0f, 0.5f};
  std::memcpy(f.bytes.data(), fv, 12);
  OwnedTensor i{"step", "I64", {}, std::vector<std::byte>(8)};
  s.push_back(f);
  s.push_back(i);
  return s;
}

// Changes a fraction of the BF16 elements by a few ulps (and sometimes far), like training.
State step(const State& base, std::mt19937& rng, double density) {
  State t = base;
  std::uniform_real_distribution<double> u(0, 1);
  for (auto& tensor : t) {
    if (tensor.dtype != "BF16") continue;
    auto bits = bits_of(tensor);
    for (auto& b : bits)
      if (u(rng) < density) b = bf16_from_key(static_cast<std::uint16_t>(bf16_key(b) + (u(rng) < 0.5 ? 1 : -2)));
    std::memcpy(tensor.bytes.data(), bits.data(), tensor.bytes.size());
  }
  return t;
}

void expect_equal_state(const State& a, const State& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_TRUE(a[i].bytes == b[i].bytes) << "tensor " << a[i].name << " differs";
  }
}

std::uint64_t round_trip(const State& base, const State& target, const EncodeOptions& opt) {
  const auto patch = encode_patch(refs(base), refs(target), opt);
  const ParsedPatch parsed = parse_patch(patch.data(), patch.size());
  State receiver = base;
  auto m = mutables(receiver);
  const std::uint64_t written = apply_patch(parsed, m);
  expect_equal_state(receiver, target);
  return written;
}

}  // namespace

TEST(Patch, RoundTripEveryCodingAndSparsity) {
  std::mt19937 rng(1);
  const State base = random_state(rng, 10007);
  for (double density : {0.0, 0.001, 0.01, 0.5, 1.0}) {
    State target = step(base, rng, density);
    // carry the F32 tensor whole at one density
    if (density == 0.5) reinterpret_cast<float*>(target[2].bytes.data())[1] = 7.0f;
    for (auto values : {ValueCoding::raw, ValueCoding::keydiff})
      for (auto indices : {IndexCoding::gap_fixed, IndexCoding::gap_varint})
        for (auto compressor : {Compressor::none, Compressor::zstd, Compressor::lz4}) {
          EncodeOptions opt;
          opt.values = values;
          opt.indices = indices;
          opt.compressor = compressor;
          SCOPED_TRACE(std::string(value_coding_name(values)) + " " + index_coding_name(indices) + " " +
                       compressor_name(compressor) + " density " + std::to_string(density));
          round_trip(base, target, opt);
        }
  }
}

TEST(Patch, SpecialValuesSurviveBitExactly) {
  // NaN payloads, +-0 flips, subnormals, infinities, and jumps across the whole key range.
  const std::vector<bf16_bits> from{0x7FC1, 0x0000, 0x8000, 0x0001, 0x7F80, 0xFF80, 0x3F80, 0xFFFF, 0x0000};
  const std::vector<bf16_bits> to{0x7FC0, 0x8000, 0x0000, 0x8001, 0xFF80, 0x7F80, 0x7FFF, 0x0000, 0x0000};
  const State base{bf16_tensor("w", from)}, target{bf16_tensor("w", to)};
  for (auto values : {ValueCoding::raw, ValueCoding::keydiff}) {
    EncodeOptions opt;
    opt.values = values;
    EXPECT_EQ(round_trip(base, target, opt), 8u);
  }
}

TEST(Patch, EmptyOneElementAndManyTensors) {
  State base, target;
  base.push_back(bf16_tensor("empty", {}));
  target.push_back(bf16_tensor("empty", {}));
  base.push_back(bf16_tensor("one", {0x3F80}));
  target.push_back(bf16_tensor("one", {0x3F81}));
  for (int i = 0; i < 300; ++i) {
    const auto name = "t" + std::to_string(i);
    base.push_back(bf16_tensor(name, std::vector<bf16_bits>(i % 5 + 1, 0x4000)));
    target.push_back(bf16_tensor(name, std::vector<bf16_bits>(i % 5 + 1, i % 3 ? 0x4000 : 0x4001)));
  }
  EncodeOptions opt;
  round_trip(base, target, opt);
  opt.indices = IndexCoding::gap_fixed;
  opt.compressor = Compressor::lz4;
  round_trip(base, target, opt);
}

TEST(Patch, HeaderRecordsVersionsDigestsAndCounts) {
  std::mt19937 rng(2);
  const State base = random_state(rng, 5000);
  const State target = step(base, rng, 0.01);
  EncodeOptions opt;
  opt.base_version = 41;
  opt.target_version = 42;
  const auto bytes = encode_patch(refs(base), refs(target), opt);
  const ParsedPatch p = parse_patch(bytes.data(), bytes.size());
  EXPECT_EQ(p.header.base_version, 41u);
  EXPECT_EQ(p.header.target_version, 42u);
  EXPECT_EQ(p.header.base_state, state_digest(refs(base)));
  EXPECT_EQ(p.header.target_state, state_digest(refs(target)));
  std::uint64_t changed = 0;
  for (std::size_t i = 0; i < base[0].bytes.size(); i += 2) changed += std::memcmp(&base[0].bytes[i], &target[0].bytes[i], 2) != 0;
  for (std::size_t i = 0; i < base[1].bytes.size(); i += 2) changed += std::memcmp(&base[1].bytes[i], &target[1].bytes[i], 2) != 0;
  EXPECT_EQ(p.header.total_changed, changed);
  EXPECT_EQ(p.entries[2].kind, EntryKind::same);
}

TEST(Patch, StateDigestIgnoresTensorOrder) {
  std::mt19937 rng(3);
  State s = random_state(rng, 100);
  const Digest d = state_digest(refs(s));
  std::reverse(s.begin(), s.end());
  EXPECT_EQ(state_digest(refs(s)), d);
  s[0].bytes[0] ^= std::byte{1};
  EXPECT_NE(state_digest(refs(s)), d);
}

namespace {

// Applies bytes to a copy of base; returns true if it was rejected, and checks the copy is
// then still exactly base.
bool rejected_and_untouched(const std::vector<std::uint8_t>& bytes, const State& base, const PublicKey* key = nullptr) {
  State receiver = base;
  auto m = mutables(receiver);
  try {
    const ParsedPatch p = parse_patch(bytes.data(), bytes.size(), {}, key);
    apply_patch(p, m);
  } catch (const Error&) {
    for (std::size_t i = 0; i < base.size(); ++i)
      if (receiver[i].bytes != base[i].bytes) ADD_FAILURE() << "weights changed by a rejected patch";
    return true;
  }
  return false;
}

}  // namespace

namespace {

// A crafted patch gets past the checksum: rewrite it (unsigned patches: the last 16 bytes).
std::vector<std::uint8_t> rechecksummed(std::vector<std::uint8_t> bytes) {
  const Digest d = digest_bytes(bytes.data(), bytes.size() - 16);
  std::memcpy(bytes.data() + bytes.size() - 16, d.data(), 16);
  return bytes;
}

// Offset of the entry table's record for a tensor name (its u16 name length).
std::size_t entry_offset(const std::vector<std::uint8_t>& bytes, const std::string& name) {
  std::vector<std::uint8_t> key{std::uint8_t(name.size()), std::uint8_t(name.size() >> 8)};
  key.insert(key.end(), name.begin(), name.end());
  const auto it = std::search(bytes.begin() + 132, bytes.end(), key.begin(), key.end());
  EXPECT_NE(it, bytes.end()) << name;
  return std::size_t(it - bytes.begin());
}

}  // namespace

// Found by fuzz_patch_decoder_rechecksummed: a `whole` entry of 0 bytes for an empty tensor
// was accepted, and apply then called memcpy with the empty tensor's null pointer (UBSan).
TEST(Patch, EmptyTensorCarriedWholeIsRejected) {
  const State base{bf16_tensor("w", {0x3F80, 0x4000}), OwnedTensor{"empty", "F32", {0}, {}}};
  State target = base;
  target[0].bytes[0] ^= std::byte{1};
  const auto good = encode_patch(refs(base), refs(target), {});
  ASSERT_FALSE(rejected_and_untouched(good, base));
  auto bad = good;
  const std::size_t kind = entry_offset(bad, "empty") + 2 + 5 + 1 + 3 + 1 + 8;  // name, dtype, rank, dims
  ASSERT_EQ(bad[kind], std::uint8_t(EntryKind::same));
  bad[kind] = std::uint8_t(EntryKind::whole);  // count stays 0
  EXPECT_TRUE(rejected_and_untouched(rechecksummed(bad), base));
}

// A patch whose entries declare a tensor far larger than the receiver's (consistent sizes,
// valid checksum) made apply allocate the declared raw streams (here 64 GiB) before it
// compared the entries with the receiver's tensors. Receiver checks now come first.
TEST(Patch, DeclaredStreamsAreBoundedByTheReceiverBeforeDecompression) {
  const State base{bf16_tensor("w", {0x3F80, 0x4000, 0xC000, 0x0000})};
  State target = base;
  target[0].bytes[2] ^= std::byte{1};
  EncodeOptions opt;
  opt.values = ValueCoding::raw;
  opt.indices = IndexCoding::gap_fixed;
  opt.compressor = Compressor::zstd;
  const auto good = encode_patch(refs(base), refs(target), opt);
  ASSERT_FALSE(rejected_and_untouched(good, base));
  auto bad = good;
  const std::size_t dim = entry_offset(bad, "w") + 2 + 1 + 1 + 4 + 1;  // name, dtype, rank
  const std::uint64_t n = std::uint64_t(1) << 33;
  std::memcpy(bad.data() + dim, &n, 8);                 // shape [2^33]
  bad[dim + 9] = 8;                                     // 8-byte gaps
  std::memcpy(bad.data() + dim + 10, &n, 8);            // all 2^33 elements change
  std::memcpy(bad.data() + 64, &n, 8);                  // total changed
  const std::uint64_t index_raw = 8 * n, value_raw = 2 * n;  // 64 GiB, 16 GiB
  std::memcpy(bad.data() + 84, &index_raw, 8);
  std::memcpy(bad.data() + 100, &value_raw, 8);
  const auto crafted = rechecksummed(bad);
  ASSERT_NO_THROW(parse_patch(crafted.data(), crafted.size()));  // consistent in itself
  EXPECT_TRUE(rejected_and_untouched(crafted, base));
}

// A keydiff value decoding to a 64-bit difference overflowed key(old) + d (signed overflow,
// undefined; UBSan in fuzz_patch_decoder_rechecksummed) before the range check.
TEST(Patch, KeydiffDifferenceBeyond16BitsIsRejected) {
  // Five changes of one step each: five 1-byte gaps, five 1-byte values; the value stream may
  // hold up to 3 bytes per change, room for one 10-byte varint.
  const State base{bf16_tensor("w", {0x3F80, 0x4000, 0xC000, 0x0000, 0x3C00})};
  State target = base;
  for (std::size_t i = 0; i < 5; ++i) target[0].bytes[2 * i] ^= std::byte{1};
  EncodeOptions opt;
  opt.values = ValueCoding::keydiff;
  opt.indices = IndexCoding::gap_varint;
  opt.compressor = Compressor::none;
  const auto good = encode_patch(refs(base), refs(target), opt);
  ASSERT_FALSE(rejected_and_untouched(good, base));
  std::uint64_t sizes[7];  // index, value, whole stream (coded, raw), entry table
  std::memcpy(sizes, good.data() + 76, sizeof sizes);
  ASSERT_EQ(sizes[2], 5u);
  const std::size_t value_at = 132 + sizes[6] + sizes[0];
  for (const std::uint64_t z : {std::uint64_t(0xFFFFFFFFFFFFFFFEull), std::uint64_t(0xFFFFFFFFFFFFFFFFull),
                                std::uint64_t(2 * 0x10000)}) {  // zig-zag of INT64_MAX, INT64_MIN, 65536
    std::vector<std::uint8_t> bad(good.begin(), good.begin() + value_at);
    std::uint64_t v = z;
    for (; v >= 0x80; v >>= 7) bad.push_back(std::uint8_t(v | 0x80));
    bad.push_back(std::uint8_t(v));
    bad.insert(bad.end(), good.begin() + value_at + 1, good.end());  // the other 4 values, checksum
    const std::uint64_t value_bytes = bad.size() - good.size() + 5;
    std::memcpy(bad.data() + 92, &value_bytes, 8);   // coded
    std::memcpy(bad.data() + 100, &value_bytes, 8);  // raw
    EXPECT_TRUE(rejected_and_untouched(rechecksummed(bad), base)) << z;
  }
}

TEST(Patch, EverySingleBitFlipAndTruncationIsRejected) {
  std::mt19937 rng(4);
  const State base = random_state(rng, 64);
  const State target = step(base, rng, 0.1);
  for (auto values : {ValueCoding::raw, ValueCoding::keydiff}) {
    EncodeOptions opt;
    opt.values = values;
    const auto good = encode_patch(refs(base), refs(target), opt);
    ASSERT_FALSE(rejected_and_untouched(good, base));
    int accepted = 0;
    for (std::size_t bit = 0; bit < 8 * good.size(); ++bit) {
      auto bad = good;
      bad[bit / 8] ^= std::uint8_t(1u << (bit % 8));
      accepted += !rejected_and_untouched(bad, base);
    }
    EXPECT_EQ(accepted, 0) << "of " << 8 * good.size() << " single-bit flips";
    for (std::size_t len = 0; len < good.size(); ++len)
      EXPECT_TRUE(rejected_and_untouched(std::vector<std::uint8_t>(good.begin(), good.begin() + len), base)) << len;
  }
}

TEST(Patch, WrongBaseIsRejected) {
  std::mt19937 rng(5);
  const State base = random_state(rng, 1000);
  const State target = step(base, rng, 0.05);
  const auto bytes = encode_patch(refs(base), refs(target), {});
  EXPECT_TRUE(rejected_and_untouched(bytes, target));  // already at the target version
  State other = base;
  other[0].bytes[10] ^= std::byte{4};
  EXPECT_TRUE(rejected_and_untouched(bytes, other));
  State renamed = base;
  renamed[1].name = "other.bias";
  EXPECT_TRUE(rejected_and_untouched(bytes, renamed));
}

TEST(Patch, SignaturesBindThePatchToTheKey) {
  std::mt19937 rng(6);
  const State base = random_state(rng, 500);
  const State target = step(base, rng, 0.05);
  const KeyPair trainer = generate_keypair(), stranger = generate_keypair();
  EncodeOptions opt;
  opt.signing_key = &trainer.secret_key;
  const auto signed_patch = encode_patch(refs(base), refs(target), opt);
  EXPECT_FALSE(rejected_and_untouched(signed_patch, base, &trainer.public_key));
  EXPECT_TRUE(rejected_and_untouched(signed_patch, base, &stranger.public_key));
  const auto unsigned_patch = encode_patch(refs(base), refs(target), {});
  EXPECT_TRUE(rejected_and_untouched(unsigned_patch, base, &trainer.public_key));
  // Any flipped bit, signature included, fails verification.
  for (std::size_t bit = 0; bit < 8 * signed_patch.size(); bit += 7) {
    auto bad = signed_patch;
    bad[bit / 8] ^= std::uint8_t(1u << (bit % 8));
    EXPECT_TRUE(rejected_and_untouched(bad, base, &trainer.public_key)) << bit;
  }
}

TEST(Patch, DeclaredSizesBeyondLimitsAreRejectedBeforeAllocation) {
  std::mt19937 rng(7);
  const State base = random_state(rng, 100);
  const auto bytes = encode_patch(refs(base), refs(step(base, rng, 0.1)), {});
  PatchLimits tight;
  tight.max_stream_bytes = 4;
  EXPECT_THROW(parse_patch(bytes.data(), bytes.size(), tight), Error);
  tight = {};
  tight.max_tensors = 2;
  EXPECT_THROW(parse_patch(bytes.data(), bytes.size(), tight), Error);
  tight = {};
  tight.max_patch_bytes = bytes.size() - 1;
  EXPECT_THROW(parse_patch(bytes.data(), bytes.size(), tight), Error);
}

TEST(Patch, EncodeRejectsMismatchedStates) {
  std::mt19937 rng(8);
  const State base = random_state(rng, 10);
  State other = base;
  other.pop_back();
  EXPECT_THROW(encode_patch(refs(base), refs(other), {}), Error);
  other = base;
  other[0].shape = {5, 2};
  EXPECT_THROW(encode_patch(refs(base), refs(other), {}), Error);
}

TEST(Patch, CachedDigestsGiveTheSamePatchesAlongAChain) {
  // A trainer and a receiver keep the digests each call returns; every patch must be byte-
  // identical to one encoded from scratch, and every apply must reach the target.
  std::mt19937 rng(9);
  State trainer = random_state(rng, 3000), receiver = trainer;
  StateDigests sender_digests = compute_digests(refs(trainer)), receiver_digests = sender_digests;
  for (int version = 1; version <= 5; ++version) {
    const State next = step(trainer, rng, 0.02);
    StateDigests next_digests;
    const auto cached = encode_patch(refs(trainer), refs(next), {}, &sender_digests, &next_digests);
    EXPECT_EQ(cached, encode_patch(refs(trainer), refs(next), {}));
    EXPECT_EQ(next_digests.state, state_digest(refs(next)));
    const ParsedPatch p = parse_patch(cached.data(), cached.size());
    auto m = mutables(receiver);
    StateDigests received;
    apply_patch(p, m, {}, &receiver_digests, &received);
    expect_equal_state(receiver, next);
    EXPECT_EQ(received.state, next_digests.state);
    trainer = next;
    sender_digests = next_digests;
    receiver_digests = received;
  }
  // Digests of another version are caught by the state check before anything is written.
  const State next = step(trainer, rng, 0.02);
  const auto bytes = encode_patch(refs(trainer), refs(next), {});
  StateDigests stale = compute_digests(refs(next));
  auto m = mutables(receiver);
  const State before = receiver;
  EXPECT_THROW(apply_patch(parse_patch(bytes.data(), bytes.size()), m, {}, &stale), Error);
  expect_equal_state(receiver, before);
}
