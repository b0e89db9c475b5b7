// PULSESync patches: bit-exact round trips for every coding, special values and shapes, and
// rejection of every corruption with the receiver's weights untouched; patches coded from a
// list of changes (encode_changes) are the bytes of encode_patch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "core/error.hpp"
#include "kernels/bf16.hpp"
#include "sync/change_history.hpp"
#include "sync/patch.hpp"
#include "support/owned_state.hpp"
#include "sync/sparse_format.hpp"
#include "coding/varint.hpp"

using namespace pulse;
using namespace pulse::sync;

namespace {

using test::OwnedTensor;
using test::State;
using test::refs;
using test::mutables;

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

// Every value coding with an index coding it can pair with (expclass codes both).
std::vector<EncodeOptions> every_coding() {
  std::vector<EncodeOptions> out;
  for (auto values : {ValueCoding::raw, ValueCoding::keydiff})
    for (auto indices : {IndexCoding::gap_fixed, IndexCoding::gap_varint}) {
      out.emplace_back();
      out.back().values = values;
      out.back().indices = indices;
    }
  out.emplace_back();
  out.back().values = ValueCoding::exponent_class;
  out.back().indices = IndexCoding::exponent_class;
  return out;
}

EncodeOptions expclass(Compressor compressor = Compressor::none) {
  EncodeOptions opt;
  opt.values = ValueCoding::exponent_class;
  opt.indices = IndexCoding::exponent_class;
  opt.compressor = compressor;
  return opt;
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
    for (EncodeOptions opt : every_coding())
      for (auto compressor : {Compressor::none, Compressor::zstd, Compressor::lz4}) {
        opt.compressor = compressor;
        SCOPED_TRACE(std::string(value_coding_name(opt.values)) + " " + index_coding_name(opt.indices) + " " +
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
  for (const EncodeOptions& opt : every_coding()) EXPECT_EQ(round_trip(base, target, opt), 8u);
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
  // Entries in name order: the F32 "scale" is sparse-coded (nothing changed), the I64 "step" same.
  ASSERT_EQ(p.entries.size(), 4u);
  EXPECT_EQ(p.entries[2].kind, EntryKind::sparse);
  EXPECT_EQ(p.entries[2].count, 0u);
  EXPECT_EQ(p.entries[3].kind, EntryKind::same);
  ASSERT_EQ(p.summary.size(), 3u);  // BF16, F32, I64
  EXPECT_EQ(p.summary[0].dtype, "BF16");
  EXPECT_EQ(p.summary[0].changed, changed);
  EXPECT_EQ(p.summary[0].elements, base[0].bytes.size() / 2 + base[1].bytes.size() / 2);
  EXPECT_FALSE(p.header.changes_layout || p.header.changes_metadata);
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

constexpr std::size_t kTableAt = pulse::sync::patch_fixed_header_bytes;  // the entry table follows it
static_assert(kTableAt == 136, "FORMAT.md: the entry table starts at byte 136");

// The patch with its entry table replaced (table size and checksum fixed up).
std::vector<std::uint8_t> with_table(const std::vector<std::uint8_t>& bytes, const std::vector<std::uint8_t>& table) {
  std::uint64_t old_size = 0;
  std::memcpy(&old_size, bytes.data() + 128, 8);
  std::vector<std::uint8_t> out(bytes.begin(), bytes.begin() + kTableAt);
  const std::uint64_t size = table.size();
  std::memcpy(out.data() + 128, &size, 8);
  out.insert(out.end(), table.begin(), table.end());
  out.insert(out.end(), bytes.begin() + kTableAt + std::ptrdiff_t(old_size), bytes.end());
  return rechecksummed(out);
}

void put_varint_to(std::vector<std::uint8_t>& out, std::uint64_t v) {
  for (; v >= 0x80; v >>= 7) out.push_back(std::uint8_t(v | 0x80));
  out.push_back(std::uint8_t(v));
}

// An entry table of one dtype summary and the given entries (kind, count, width) in name order.
std::vector<std::uint8_t> table_of(const DtypeSummary& s, const std::vector<std::vector<std::uint64_t>>& entries) {
  std::vector<std::uint8_t> t{1, std::uint8_t(s.dtype.size())};
  t.insert(t.end(), s.dtype.begin(), s.dtype.end());
  for (std::uint64_t v : {s.tensors, s.elements, s.changed, s.whole_bytes}) put_varint_to(t, v);
  put_varint_to(t, entries.size());
  for (const auto& e : entries) {
    t.push_back(std::uint8_t(e[0]));
    for (std::size_t i = 1; i < e.size(); ++i)
      if (i == 1) put_varint_to(t, e[i]); else t.push_back(std::uint8_t(e[i]));
  }
  return t;
}

// A part table (FORMAT.md "Part table"), to follow a crafted entry table.
std::vector<std::uint8_t> part_table_of(const std::vector<PatchPart>& parts) {
  std::vector<std::uint8_t> t;
  put_varint_to(t, parts.size());
  for (const PatchPart& p : parts) {
    put_varint_to(t, p.segments.size());
    for (const PatchSegment& s : p.segments) {  // (size, count) inside an entry, (0, 1) ending it
      put_varint_to(t, s.ends_entry ? 0 : s.elements);
      put_varint_to(t, s.ends_entry ? 1 : s.count);
    }
    for (std::uint64_t v : {p.index.coded, p.index.raw, p.value.coded, p.value.raw}) put_varint_to(t, v);
  }
  return t;
}

std::vector<std::uint8_t> part_table_of(const std::vector<std::uint8_t>& patch) {
  return part_table_of(parse_patch(patch.data(), patch.size()).parts);
}

}  // namespace

// Found by fuzz_patch_decoder_rechecksummed (format 1): a `whole` entry of 0 bytes for an empty
// tensor made apply call memcpy with the empty tensor's null pointer (UBSan). In format 2 such
// an entry is well-formed (it carries nothing) and must apply without touching memory.
TEST(Patch, EmptyTensorCarriedWholeAppliesWithoutCopying) {
  const State base{OwnedTensor{"empty", "I32", {0}, {}}, bf16_tensor("w", {0x3F80, 0x4000})};
  State target = base;
  target[1].bytes[0] ^= std::byte{1};
  const auto good = encode_patch(refs(base), refs(target), {});
  ASSERT_FALSE(rejected_and_untouched(good, base));
  // Both dtypes' summaries, then "empty" whole (was same), "w" sparse with one change.
  std::vector<std::uint8_t> table{2, 4, 'B', 'F', '1', '6', 1, 2, 1, 0, 3, 'I', '3', '2', 1, 0, 0, 0, 2, 2, 0, 1};
  const auto parts = part_table_of(good);
  table.insert(table.end(), parts.begin(), parts.end());
  const auto crafted = with_table(good, table);
  State receiver = base;
  auto m = mutables(receiver);
  apply_patch(parse_patch(crafted.data(), crafted.size()), m);
  expect_equal_state(receiver, target);
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
  // The receiver's layout gives the shape [4]; the entries claim 2^33 changes with 8-byte gaps,
  // and the header raw streams of 64 GiB and 16 GiB that they imply.
  const std::uint64_t n = std::uint64_t(1) << 33;
  const std::uint64_t index_raw = 8 * n, value_raw = 2 * n;
  PatchPart part = parse_patch(good.data(), good.size()).parts.at(0);
  part.segments = {{0, n, true}};  // the whole entry: its count is the entry's
  part.index.raw = index_raw;
  part.value.raw = value_raw;
  auto table = table_of({"BF16", 1, 4, n, 0}, {{0, n, 8}});
  const auto parts = part_table_of({part});
  table.insert(table.end(), parts.begin(), parts.end());
  auto bad = with_table(good, table);
  std::memcpy(bad.data() + 88, &index_raw, 8);
  std::memcpy(bad.data() + 104, &value_raw, 8);
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
  std::memcpy(sizes, good.data() + 80, sizeof sizes);
  ASSERT_EQ(sizes[2], 5u);
  const std::size_t value_at = kTableAt + sizes[6] + sizes[0];
  for (const std::uint64_t z : {std::uint64_t(0xFFFFFFFFFFFFFFFEull), std::uint64_t(0xFFFFFFFFFFFFFFFFull),
                                std::uint64_t(2 * 0x10000)}) {  // zig-zag of INT64_MAX, INT64_MIN, 65536
    std::vector<std::uint8_t> bad(good.begin(), good.begin() + value_at);
    std::uint64_t v = z;
    for (; v >= 0x80; v >>= 7) bad.push_back(std::uint8_t(v | 0x80));
    bad.push_back(std::uint8_t(v));
    bad.insert(bad.end(), good.begin() + value_at + 1, good.end());  // the other 4 values, checksum
    const std::uint64_t value_bytes = bad.size() - good.size() + 5;
    std::memcpy(bad.data() + 96, &value_bytes, 8);   // coded
    std::memcpy(bad.data() + 104, &value_bytes, 8);  // raw
    EXPECT_TRUE(rejected_and_untouched(rechecksummed(bad), base)) << z;
  }
}

TEST(Patch, EverySingleBitFlipAndTruncationIsRejected) {
  std::mt19937 rng(4);
  const State base = random_state(rng, 64);
  const State target = step(base, rng, 0.1);
  for (const EncodeOptions& opt : every_coding()) {
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

TEST(Patch, EncodeRejectsInconsistentStates) {
  std::mt19937 rng(8);
  const State base = random_state(rng, 10);
  State other = base;
  other.push_back(base[0]);  // a name twice
  EXPECT_THROW(encode_patch(refs(base), refs(other), {}), Error);
  other = base;
  other[0].shape = {5, 3};  // 15 elements in 20 bytes
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

namespace {

// Every dtype safetensors defines, with its bits per element.
const std::vector<std::pair<std::string, unsigned>> kEveryDtype{
    {"BOOL", 8},    {"F4", 4},           {"F6_E2M3", 6},      {"F6_E3M2", 6}, {"U8", 8},   {"I8", 8},
    {"F8_E5M2", 8}, {"F8_E4M3", 8},      {"F8_E8M0", 8},      {"F8_E4M3FNUZ", 8},         {"F8_E5M2FNUZ", 8},
    {"I16", 16},    {"U16", 16},         {"F16", 16},         {"BF16", 16},   {"I32", 32}, {"U32", 32},
    {"F32", 32},    {"C64", 64},         {"F64", 64},         {"I64", 64},    {"U64", 64}};

// A state with one tensor of every dtype (96 elements, random bytes) and a metadata.
State every_dtype_state(std::mt19937& rng) {
  State s;
  for (const auto& [dtype, bits] : kEveryDtype) {
    OwnedTensor t{"t." + dtype, dtype, {8, 12}, std::vector<std::byte>(96 * bits / 8)};
    for (auto& b : t.bytes) b = std::byte(rng());
    s.push_back(t);
  }
  return s;
}

// The receiver's state after applying bytes with apply_to-like commit of a StateChange.
void apply_whole(const std::vector<std::uint8_t>& bytes, State& receiver, Metadata& metadata) {
  const ParsedPatch p = parse_patch(bytes.data(), bytes.size());
  auto m = mutables(receiver);
  StateChange change;
  apply_patch(p, m, {}, nullptr, nullptr, metadata, &change);
  for (const auto& name : change.removed)
    receiver.erase(std::find_if(receiver.begin(), receiver.end(), [&](const OwnedTensor& t) { return t.name == name; }));
  for (std::size_t i = 0; i < change.added.size(); ++i)
    receiver.push_back({change.added[i].name, change.added[i].dtype, change.added[i].shape, change.added_bytes[i]});
  metadata = change.metadata;
}

std::map<std::string, const OwnedTensor*> named(const State& s) {
  std::map<std::string, const OwnedTensor*> out;
  for (const auto& t : s) out[t.name] = &t;
  return out;
}

void expect_same_tensors(const State& a, const State& b) {
  const auto x = named(a), y = named(b);
  ASSERT_EQ(x.size(), y.size());
  for (const auto& [name, t] : x) {
    ASSERT_TRUE(y.count(name)) << name;
    EXPECT_EQ(t->dtype, y.at(name)->dtype) << name;
    EXPECT_EQ(t->shape, y.at(name)->shape) << name;
    EXPECT_TRUE(t->bytes == y.at(name)->bytes) << name;
  }
}

}  // namespace

TEST(Patch, EveryDtypeRoundTripsSparseWhereItCanAndWholeOtherwise) {
  std::mt19937 rng(10);
  const State base = every_dtype_state(rng);
  State target = base;
  // ~10% of the bytes of every tensor change (one element of a float by one step of its key).
  for (auto& t : target)
    for (std::size_t i = 0; i < t.bytes.size(); i += 10) t.bytes[i] ^= std::byte{1};
  for (const EncodeOptions& opt : every_coding()) {
      const auto bytes = encode_patch(refs(base), refs(target), opt);
      const ParsedPatch p = parse_patch(bytes.data(), bytes.size());
      ASSERT_EQ(p.summary.size(), kEveryDtype.size());
      for (const auto& s : p.summary) {
        const unsigned bits = std::find_if(kEveryDtype.begin(), kEveryDtype.end(), [&](const auto& d) {
                                return d.first == s.dtype;
                              })->second;
        EXPECT_EQ(s.elements, 96u) << s.dtype;
        if (is_sparse_dtype(s.dtype)) {
          // Element i changed if a changed byte (every 10th) falls inside it.
          std::uint64_t changed = 0;
          for (std::size_t e = 0; e < 96; ++e)
            for (std::size_t b = e * bits / 8; b < (e + 1) * bits / 8; ++b) {
              if (b % 10 == 0) {
                ++changed;
                break;
              }
            }
          EXPECT_EQ(s.changed, changed) << s.dtype;
          EXPECT_EQ(s.whole_bytes, 0u) << s.dtype;
        } else {
          EXPECT_EQ(s.whole_bytes, 96u * bits / 8) << s.dtype;
        }
      }
      State receiver = base;
      Metadata metadata;
      apply_whole(bytes, receiver, metadata);
      expect_equal_state(receiver, target);
    }
  for (const char* sparse : {"BF16", "F16", "F32", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ"})
    EXPECT_TRUE(is_sparse_dtype(sparse)) << sparse;
  for (const char* whole : {"F64", "C64", "I64", "BOOL", "F4", "F6_E2M3"}) EXPECT_FALSE(is_sparse_dtype(whole)) << whole;
}

TEST(Patch, FloatKeysStepAcrossZeroAndSignsExactly) {
  // F16 and F32 special values, FP8 edge bytes: every transition survives keydiff exactly.
  const std::vector<std::uint32_t> f32_from{0x00000000, 0x80000000, 0x7F800000, 0x00000001, 0x3F800000, 0xFFFFFFFF};
  const std::vector<std::uint32_t> f32_to{0x80000000, 0x00000001, 0xFF800000, 0x80000001, 0x3F800001, 0x00000000};
  OwnedTensor a{"f32", "F32", {6}, std::vector<std::byte>(24)}, b = a;
  std::memcpy(a.bytes.data(), f32_from.data(), 24);
  std::memcpy(b.bytes.data(), f32_to.data(), 24);
  OwnedTensor c{"f16", "F16", {4}, std::vector<std::byte>(8)}, d = c;
  const std::uint16_t f16_from[4] = {0x0000, 0x7C00, 0x8001, 0x3C00}, f16_to[4] = {0x8000, 0xFC00, 0x0001, 0x3BFF};
  std::memcpy(c.bytes.data(), f16_from, 8);
  std::memcpy(d.bytes.data(), f16_to, 8);
  OwnedTensor e{"e8m0", "F8_E8M0", {4}, {std::byte{0}, std::byte{0xFF}, std::byte{0x7F}, std::byte{1}}}, f = e;
  f.bytes = {std::byte{0xFF}, std::byte{0}, std::byte{0x80}, std::byte{1}};
  OwnedTensor g{"e4m3", "F8_E4M3", {3}, {std::byte{0x00}, std::byte{0x80}, std::byte{0x7F}}}, h = g;
  h.bytes = {std::byte{0x80}, std::byte{0x01}, std::byte{0xFF}};
  for (const EncodeOptions& opt : every_coding()) EXPECT_EQ(round_trip({a, c, e, g}, {b, d, f, h}, opt), 6u + 4u + 3u + 3u);
}

TEST(Patch, KeysAreTheSignMagnitudeOrderOfEveryBf16AndF8Value) {
  // key() against FORMAT.md's definition, its branch on the sign written out (negative: NOT x
  // AND M, positive: x OR S), for every value; from_key undoes it.
  for (const char* dtype : {"BF16", "F16", "F8_E4M3", "F8_E5M2"}) {
    const SparseFormat f = *sparse_format(dtype);
    for (std::uint64_t bits = 0; bits <= f.mask(); ++bits) {
      const std::uint64_t defined = bits & f.sign() ? ~bits & f.mask() : bits | f.sign();
      ASSERT_EQ(f.key(bits), defined) << dtype << " " << bits;
      ASSERT_EQ(f.from_key(f.key(bits)), bits) << dtype << " " << bits;
    }
  }
  const SparseFormat f32 = *sparse_format("F32");
  for (const std::uint64_t bits : {0x0ull, 0x1ull, 0x7F7FFFFFull, 0x80000000ull, 0x80000001ull, 0xFFFFFFFFull, 0xBF800000ull})
    EXPECT_EQ(f32.key(bits), bits & 0x80000000u ? ~bits & 0xFFFFFFFFu : bits | 0x80000000u) << bits;
  EXPECT_EQ(sparse_format("F8_E8M0")->key(0xAB), 0xABu);  // no sign: the bits are the key
}

TEST(Patch, VarintsThroughAPointerAreTheVectorWritersBytes) {
  // Every length's edges and random values: the same bytes as put_varint into a vector, read
  // back by get_varint, and nothing written beyond kVarintSlack bytes past the last.
  std::vector<std::uint64_t> values{0, 1, 0x7F, 0x80, 0x3FFF, 0x4000, 0x1FFFFF, 0x200000, 0xFFFFFFF, 0x10000000,
                                    0xFFFFFFFFull, std::uint64_t(1) << 63, ~std::uint64_t(0)};
  std::mt19937_64 rng(5);
  for (int i = 0; i < 2000; ++i) values.push_back(rng() >> (rng() % 64));
  std::vector<std::uint8_t> expected;
  for (const std::uint64_t v : values) put_varint(expected, v);
  std::vector<std::uint8_t> written(expected.size() + kVarintSlack + 16, 0xEE);
  std::uint8_t* at = written.data();
  for (const std::uint64_t v : values) put_varint(at, v);
  ASSERT_EQ(std::size_t(at - written.data()), expected.size());
  EXPECT_TRUE(std::equal(expected.begin(), expected.end(), written.begin()));
  for (std::size_t i = expected.size() + kVarintSlack; i < written.size(); ++i) EXPECT_EQ(written[i], 0xEE) << i;
  std::size_t pos = 0;
  for (const std::uint64_t v : values) ASSERT_EQ(get_varint(written.data(), expected.size(), pos), v);
  for (const std::uint64_t v : values) {
    std::vector<std::uint8_t> one;
    put_varint(one, v);
    EXPECT_EQ(varint_bytes(v), one.size()) << v;
  }
}

TEST(Patch, LayoutChangesAndMetadataTravelAndVerify) {
  std::mt19937 rng(11);
  const State base = random_state(rng, 1000);
  State target = step(base, rng, 0.01);
  target.erase(target.begin() + 3);              // "step" removed
  target[2].shape = {1, 3};                      // "scale" re-shaped
  target.push_back({"new.bias", "F16", {2}, std::vector<std::byte>(4, std::byte{7})});  // added
  target.push_back({"blocks.0.ln.bias", "F32", {7}, std::vector<std::byte>(28, std::byte{1})});  // dtype change
  target.erase(target.begin() + 1);
  const Metadata base_meta{{"format", "pt"}}, target_meta{{"format", "pt"}, {"step", "2"}};
  StateDigests target_digests;
  const auto bytes = encode_patch(refs(base), refs(target), {}, nullptr, &target_digests, base_meta, target_meta);
  const ParsedPatch p = parse_patch(bytes.data(), bytes.size());
  EXPECT_TRUE(p.header.changes_layout && p.header.changes_metadata);
  EXPECT_EQ(p.removed, (std::vector<std::string>{"blocks.0.ln.bias", "scale", "step"}));
  ASSERT_EQ(p.added.size(), 3u);
  EXPECT_EQ(p.metadata, target_meta);
  EXPECT_EQ(p.header.target_state, state_digest(refs(target), target_meta));
  EXPECT_EQ(target_digests.state, p.header.target_state);

  State receiver = base;
  Metadata metadata = base_meta;
  apply_whole(bytes, receiver, metadata);
  expect_same_tensors(receiver, target);
  EXPECT_EQ(metadata, target_meta);

  // A receiver that cannot take a layout change, or holds another metadata, is refused untouched.
  EXPECT_TRUE(rejected_and_untouched(bytes, base));
  State other = base;
  auto m = mutables(other);
  StateChange change;
  EXPECT_THROW(apply_patch(p, m, {}, nullptr, nullptr, Metadata{{"format", "np"}}, &change), Error);
  expect_equal_state(other, base);
}

TEST(Patch, MetadataIsPartOfTheStateDigest) {
  std::mt19937 rng(12);
  const State s = random_state(rng, 10);
  EXPECT_EQ(state_digest(refs(s)), state_digest(refs(s), Metadata{}));  // empty: the digest of format 1
  EXPECT_NE(state_digest(refs(s)), state_digest(refs(s), Metadata{{"format", "pt"}}));
  EXPECT_NE(state_digest(refs(s), Metadata{{"a", "bc"}}), state_digest(refs(s), Metadata{{"ab", "c"}}));
  // A metadata-only change is a patch too, and a receiver without it is refused.
  const auto bytes = encode_patch(refs(s), refs(s), {}, nullptr, nullptr, {}, Metadata{{"step", "3"}});
  State receiver = s;
  Metadata metadata;
  apply_whole(bytes, receiver, metadata);
  EXPECT_EQ(metadata, (Metadata{{"step", "3"}}));
  EXPECT_TRUE(rejected_and_untouched(bytes, s));
}

TEST(Patch, FormatOnePatchIsRefusedWithOneLine) {
  std::vector<std::uint8_t> v1{'P', 'U', 'L', 'S', 'E', 'P', 'C', 'H', 1, 0};
  v1.resize(200, 0);
  try {
    parse_patch(v1.data(), v1.size());
    ADD_FAILURE() << "format 1 accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("format version 1 is no longer read"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos);
  }
}

TEST(Patch, EverySingleByteCorruptionOfAFormatTwoPatchIsRejected) {
  // A patch with sparse BF16, F16, F32 and FP8 entries, a whole I64, a layout change and new
  // metadata: every byte replaced by each of its 255 other values is rejected, weights untouched.
  std::mt19937 rng(13);
  State base;
  for (const char* dtype : {"BF16", "F16", "F32", "F8_E4M3", "I64"}) {
    const unsigned bytes = std::string(dtype) == "F32" ? 4 : std::string(dtype) == "I64" ? 8 : std::string(dtype)[0] == 'F' && dtype[1] == '8' ? 1 : 2;
    OwnedTensor t{std::string("w.") + dtype, dtype, {16}, std::vector<std::byte>(16 * bytes)};
    for (auto& b : t.bytes) b = std::byte(rng() & 0x3F);
    base.push_back(t);
  }
  State target = base;
  for (auto& t : target) t.bytes[3] ^= std::byte{1};
  target.push_back({"added", "U8", {2}, {std::byte{1}, std::byte{2}}});
  for (const EncodeOptions& opt : {EncodeOptions{}, expclass()}) {
    const auto good = encode_patch(refs(base), refs(target), opt, nullptr, nullptr, {}, Metadata{{"k", "v"}});
    State receiver = base;
    Metadata metadata;
    apply_whole(good, receiver, metadata);
    expect_same_tensors(receiver, target);
    std::size_t accepted = 0;
    for (std::size_t at = 0; at < good.size(); ++at)
      for (int delta = 1; delta < 256; ++delta) {
        auto bad = good;
        bad[at] = std::uint8_t(bad[at] + delta);
        State r = base;
        Metadata md;
        try {
          apply_whole(bad, r, md);
          ++accepted;
        } catch (const Error&) {
          expect_equal_state(r, base);
        }
      }
    EXPECT_EQ(accepted, 0u) << value_coding_name(opt.values) << ": of " << 255 * good.size() << " single-byte corruptions";
  }
}

TEST(Patch, ExpclassCorruptionsWithAValidChecksumAreRejectedOrExact) {
  // The checksum stops random corruption; this reaches the range decoder: every byte of an
  // expclass patch (BF16, F16, F32 and FP8 changes) replaced by each of its 255 other values,
  // checksum rewritten. Each is rejected with the weights untouched, or decodes to exactly the
  // target, never to anything else. Exact ones may only come from the version numbers (offsets
  // 16-31, not part of the state) and the range coder's flush (a stream's last bytes).
  std::mt19937 rng(14);
  State base;
  for (const char* dtype : {"BF16", "F16", "F32", "F8_E4M3"}) {
    const unsigned bytes = std::string(dtype) == "F32" ? 4 : std::string(dtype) == "F8_E4M3" ? 1 : 2;
    OwnedTensor t{std::string("w.") + dtype, dtype, {24}, std::vector<std::byte>(24 * bytes)};
    for (auto& b : t.bytes) b = std::byte(rng() & 0x3F);
    base.push_back(t);
  }
  State target = base;
  for (auto& t : target)
    for (std::size_t i = 1; i < t.bytes.size(); i += 7) t.bytes[i] ^= std::byte{1};
  const auto good = encode_patch(refs(base), refs(target), expclass());
  ASSERT_FALSE(rejected_and_untouched(good, base));
  std::size_t rejected = 0, exact = 0;
  std::set<std::size_t> exact_at;
  for (std::size_t at = 0; at + 16 < good.size(); ++at)
    for (int delta = 1; delta < 256; ++delta) {
      auto bad = good;
      bad[at] = std::uint8_t(bad[at] + delta);
      bad = rechecksummed(bad);
      State r = base;
      auto m = mutables(r);
      try {
        apply_patch(parse_patch(bad.data(), bad.size()), m);
        for (std::size_t i = 0; i < r.size(); ++i) ASSERT_TRUE(r[i].bytes == target[i].bytes) << "byte " << at;
        ++exact;
        if (at < 16 || at >= 32) exact_at.insert(at);
      } catch (const Error&) {
        expect_equal_state(r, base);
        ++rejected;
      }
    }
  EXPECT_EQ(rejected + exact, 255 * (good.size() - 16));
  // Such corruptions must lie in the last 4 bytes of the index or value stream (the flush).
  const ParsedPatch p = parse_patch(good.data(), good.size());
  const std::size_t index_end = std::size_t(p.value_stream - good.data()), value_end = std::size_t(p.whole_stream - good.data());
  for (std::size_t at : exact_at)
    EXPECT_TRUE((at < index_end && at + 4 >= index_end) || (at < value_end && at + 4 >= value_end)) << at;
}

TEST(Patch, ExpclassDecodesOnlyAgainstTheOldWeightsItWasMadeFor) {
  // The receiver's old weights are the coding's context: a receiver holding other weights is
  // turned away by the base digest before anything is decoded, and with the digest check passed
  // by a (forged) digest the located positions differ and the target digest restores it.
  std::mt19937 rng(15);
  const State base = random_state(rng, 4096);
  const State target = step(base, rng, 0.02);
  const auto good = encode_patch(refs(base), refs(target), expclass(Compressor::zstd));
  State other = step(base, rng, 0.5);
  auto m = mutables(other);
  const State before = other;
  EXPECT_THROW(apply_patch(parse_patch(good.data(), good.size()), m), Error);
  expect_equal_state(other, before);
  const StateDigests forged = compute_digests(refs(base));
  EXPECT_THROW(apply_patch(parse_patch(good.data(), good.size()), m, {}, &forged), Error);
  expect_equal_state(other, before);
  EXPECT_EQ(round_trip(base, target, expclass(Compressor::zstd)) > 0, true);
}

namespace {

// Two BF16 tensors of weights ~ N(0, 0.02), several pass chunks (2^16 elements) each.
State two_weight_tensors(std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 0.02f);
  State base;
  for (const char* name : {"a.weight", "b.weight"}) {
    std::vector<bf16_bits> w(300007);
    for (auto& x : w) x = float_to_bf16(normal(rng));
    base.push_back(bf16_tensor(name, w));
  }
  return base;
}

}  // namespace

TEST(Patch, ExpclassPatchRefusedAfterWritingInPlaceLeavesEveryByteAsBefore) {
  // apply_patch writes sparse changes in place as its pass decodes them and writes the old
  // values back when the patch is then refused. Two tensors of several pass chunks (2^16
  // elements each): a wrong target digest is found once both are written; a corruption of the
  // last bytes of either stream (the second tensor's part) fails while decoding the second
  // tensor or at a digest, after the first tensor was written.
  std::mt19937 rng(23);
  const State base = two_weight_tensors(rng);
  const State target = step(base, rng, 0.01);
  const auto good = encode_patch(refs(base), refs(target), expclass());
  ASSERT_FALSE(rejected_and_untouched(good, base));

  auto wrong_target = good;
  wrong_target[64] ^= 1;  // the target state digest (FORMAT.md)
  EXPECT_TRUE(rejected_and_untouched(rechecksummed(wrong_target), base));

  const ParsedPatch p = parse_patch(good.data(), good.size());
  const std::size_t index_end = std::size_t(p.value_stream - good.data()), value_end = std::size_t(p.whole_stream - good.data());
  std::size_t rejected = 0, tried = 0;
  for (std::size_t end : {index_end, value_end})
    for (std::size_t at = end - 64; at < end; ++at, ++tried) {
      auto bad = good;
      bad[at] ^= 0x5A;
      bad = rechecksummed(bad);
      State r = base;
      auto m = mutables(r);
      try {
        apply_patch(parse_patch(bad.data(), bad.size()), m);
        expect_equal_state(r, target);  // only the range coder's flush bytes may decode exactly
      } catch (const Error& e) {
        EXPECT_EQ(std::string(e.what()).find("a.weight"), std::string::npos) << e.what();
        expect_equal_state(r, base);
        ++rejected;
      }
    }
  EXPECT_GE(rejected, tried - 8);
}

TEST(Patch, KeydiffPatchRefusedInsideASegmentLeavesEveryByteAsBefore) {
  // apply_patch decodes a keydiff segment's values a window of touched blocks at a time and
  // swaps each window in before the next is decoded. Two tensors of about 2,200 touched blocks
  // each (several windows of 256) in one part: a varint left open at the value stream's end (its
  // last byte's continuation bit set) fails in the second tensor's last window, after the first
  // tensor and the second's earlier windows were written; other corruptions of the last bytes
  // fail there or at the target digest. Each leaves the weights exactly as they were.
  std::mt19937 rng(31);
  const State base = two_weight_tensors(rng);
  const State target = step(base, rng, 0.01);
  EncodeOptions opt;
  opt.compressor = Compressor::none;  // the value stream's bytes are the varints
  const auto good = encode_patch(refs(base), refs(target), opt);
  ASSERT_FALSE(rejected_and_untouched(good, base));
  const ParsedPatch p = parse_patch(good.data(), good.size());
  ASSERT_EQ(p.parts.size(), 1u);
  const std::size_t value_end = std::size_t(p.whole_stream - good.data());

  auto open_varint = good;
  open_varint[value_end - 1] |= 0x80;
  open_varint = rechecksummed(open_varint);
  State r = base;
  auto m = mutables(r);
  try {
    apply_patch(parse_patch(open_varint.data(), open_varint.size()), m);
    ADD_FAILURE() << "a value stream ending inside a varint was applied";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("inside a varint"), std::string::npos) << e.what();
  }
  expect_equal_state(r, base);

  for (std::size_t at = value_end - 64; at < value_end; ++at)
    for (std::uint8_t flip : {std::uint8_t(0x80), std::uint8_t(0x41)}) {
      auto bad = good;
      bad[at] ^= flip;
      EXPECT_TRUE(rejected_and_untouched(rechecksummed(bad), base)) << "byte " << at;
    }
}

namespace {

// The change from base to target as encode_changes takes it, listing besides every change the
// elements of `noop_every`-th index that keep their bits (the list may hold them).
std::vector<TensorChanges> listed_changes(const State& base, const State& target, std::size_t noop_every) {
  std::vector<TensorChanges> out;
  for (std::size_t t = 0; t < base.size(); ++t) {
    const auto format = sparse_format(base[t].dtype);
    if (!format) continue;
    TensorChanges c{base[t].name, {}, {}};
    for (std::size_t i = 0; i < base[t].bytes.size() / format->bytes; ++i) {
      const auto before = load_value(base[t].bytes.data(), i, format->bytes);
      const auto after = load_value(target[t].bytes.data(), i, format->bytes);
      if (before != after || (noop_every && i % noop_every == 0)) {
        c.indices.push_back(index_t(i));
        c.new_bits.push_back(std::uint32_t(after));
      }
    }
    if (!c.indices.empty()) out.push_back(std::move(c));
  }
  return out;
}

void expect_encode_changes_is_encode_patch(const State& base, const State& target, const EncodeOptions& opt,
                                           std::size_t noop_every, const Metadata& metadata = {}) {
  const StateDigests base_digests = compute_digests(refs(base), metadata);
  StateDigests from_patch, from_changes;
  const auto expected = encode_patch(refs(base), refs(target), opt, &base_digests, &from_patch, metadata, metadata);
  const auto bytes =
      encode_changes(refs(base), listed_changes(base, target, noop_every), opt, base_digests, &from_changes, metadata);
  EXPECT_EQ(bytes, expected);
  EXPECT_EQ(from_changes.state, from_patch.state);
  EXPECT_EQ(from_changes.tensors, from_patch.tensors);
}

}  // namespace

TEST(Patch, EncodeChangesWritesTheBytesOfEncodePatchForEveryCoding) {
  std::mt19937 rng(21);
  const State base = random_state(rng, 10007);
  const KeyPair key = generate_keypair();
  for (double density : {0.0, 0.001, 0.01, 0.5, 1.0}) {
    State target = step(base, rng, density);
    if (density == 0.5) reinterpret_cast<float*>(target[2].bytes.data())[1] = 7.0f;  // an F32 change
    for (EncodeOptions opt : every_coding())
      for (auto compressor : {Compressor::none, Compressor::zstd, Compressor::lz4})
        for (std::size_t noop_every : {std::size_t(0), std::size_t(97)}) {
          opt.compressor = compressor;
          opt.base_version = 4;
          opt.target_version = 5;
          opt.signing_key = density == 0.01 ? &key.secret_key : nullptr;
          SCOPED_TRACE(std::string(value_coding_name(opt.values)) + " " + index_coding_name(opt.indices) + " " +
                       compressor_name(compressor) + " density " + std::to_string(density) + " no-ops every " +
                       std::to_string(noop_every));
          expect_encode_changes_is_encode_patch(base, target, opt, noop_every);
        }
  }
  // A state with a metadata: the digests cover it.
  const State target = step(base, rng, 0.01);
  expect_encode_changes_is_encode_patch(base, target, expclass(), 0, {{"format", "pt"}});
}

TEST(Patch, EncodeChangesCodesEverySparseDtype) {
  std::mt19937 rng(22);
  const State base = every_dtype_state(rng);
  State target = base;
  for (auto& t : target)
    if (const auto format = sparse_format(t.dtype))
      for (std::size_t i = 0; i < t.bytes.size(); i += 5 * format->bytes) t.bytes[i] ^= std::byte(1 + (i & 3));
  for (EncodeOptions opt : every_coding()) expect_encode_changes_is_encode_patch(base, target, opt, 7);
  // And the patch applies to the base, reaching the target.
  const auto bytes = encode_changes(refs(base), listed_changes(base, target, 0), expclass(), compute_digests(refs(base)));
  State receiver = base;
  auto m = mutables(receiver);
  apply_patch(parse_patch(bytes.data(), bytes.size()), m);
  expect_equal_state(receiver, target);
}

TEST(Patch, EncodeChangesRejectsListsThatAreNotAChange) {
  std::mt19937 rng(23);
  const State base = random_state(rng, 100);
  const StateDigests digests = compute_digests(refs(base));
  auto refuses = [&](const std::vector<TensorChanges>& changes, const std::string& message) {
    try {
      encode_changes(refs(base), changes, {}, digests);
      ADD_FAILURE() << "accepted: " << message;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  };
  const std::string w = "blocks.0.attn.qkv.weight";
  refuses({{"nope", {0}, {1}}}, "which the base does not hold");
  refuses({{"step", {0}, {1}}}, "which is not coded sparsely");
  refuses({{w, {3, 2}, {1, 1}}}, "are not sorted distinct indices");
  refuses({{w, {2, 2}, {1, 1}}}, "are not sorted distinct indices");
  refuses({{w, {100}, {1}}}, "are not sorted distinct indices below 100");
  refuses({{w, {-1}, {1}}}, "are not sorted distinct indices");
  refuses({{w, {0}, {0x10000}}}, "hold a value wider than BF16");
  refuses({{w, {0, 1}, {1}}}, "have 2 indices and 1 values");
  refuses({{w, {0}, {1}}, {w, {1}, {1}}}, "twice");
  StateDigests partial = digests;
  partial.tensors.erase(w);
  EXPECT_THROW(encode_changes(refs(base), {}, {}, partial), Error);
}

namespace {

// Training-like versions whose changes keep their direction: each BF16 element drifts one way
// (its own), and a fraction of them move one key step per version: 97% that way.
std::vector<State> drifting_versions(std::mt19937& rng, std::size_t n, int versions, double density = 0.15) {
  std::vector<State> out{random_state(rng, n)};
  std::vector<int> way(n + 7);
  for (auto& w : way) w = rng() % 2 ? 1 : -1;
  std::uniform_real_distribution<double> u(0, 1);
  for (int v = 1; v < versions; ++v) {
    State t = out.back();
    std::size_t at = 0;
    for (auto& tensor : t) {
      if (tensor.dtype != "BF16") continue;
      auto bits = bits_of(tensor);
      for (std::size_t i = 0; i < bits.size(); ++i, ++at)
        if (u(rng) < density)
          bits[i] = bf16_from_key(static_cast<std::uint16_t>(bf16_key(bits[i]) + (u(rng) < 0.97 ? way[at] : -way[at])));
      std::memcpy(tensor.bytes.data(), bits.data(), tensor.bytes.size());
    }
    out.push_back(t);
  }
  return out;
}

std::vector<TensorChanges> changes_between(const State& a, const State& b) {
  std::vector<TensorChanges> out;
  for (std::size_t t = 0; t < a.size(); ++t) {
    if (a[t].dtype != "BF16") continue;
    const auto x = bits_of(a[t]), y = bits_of(b[t]);
    TensorChanges c{a[t].name, {}, {}};
    for (std::size_t i = 0; i < x.size(); ++i)
      if (x[i] != y[i]) {
        c.indices.push_back(index_t(i));
        c.new_bits.push_back(y[i]);
      }
    out.push_back(c);
  }
  return out;
}

// Three drifting versions, the sender's history after version 1, and the patch 1 -> 2 coded
// against it.
struct HistoryPatch {
  std::vector<State> versions;
  ChangeHistory sender;
  std::vector<std::uint8_t> patch;
};
HistoryPatch history_patch(unsigned seed, std::size_t n) {
  std::mt19937 rng(seed);
  std::vector<State> versions = drifting_versions(rng, n, 3);
  ChangeHistory sender(refs(versions[0]), compute_digests(refs(versions[0])).state);
  sender.advance(refs(versions[0]), refs(versions[1]), compute_digests(refs(versions[1])).state);
  auto patch = encode_patch(refs(versions[1]), refs(versions[2]), exponent_class_history_options(sender));
  return {std::move(versions), std::move(sender), std::move(patch)};
}

}  // namespace

TEST(Patch, ExpclassHistoryFollowsAChainBitExactlyAndCodesPersistentSignsSmaller) {
  // A sender and a receiver follow 12 versions from a common start, each with its history: the
  // sender advances from its change list (or by comparing versions), the receiver as apply_patch
  // writes. Every patch restores the target exactly, both histories stay equal, encode_changes
  // writes encode_patch's bytes, and signs that keep their direction cost less than at even odds.
  std::mt19937 rng(41);
  const auto versions = drifting_versions(rng, 20000, 12);
  const Digest origin = compute_digests(refs(versions[0])).state;
  ChangeHistory sender(refs(versions[0]), origin), by_comparing(refs(versions[0]), origin),
      receiver(refs(versions[0]), origin);
  State held = versions[0];
  std::size_t with_history = 0, without = 0;
  for (std::size_t v = 1; v < versions.size(); ++v) {
    const auto base = refs(versions[v - 1]), target = refs(versions[v]);
    EncodeOptions opt = exponent_class_history_options(sender);
    opt.base_version = v - 1;
    opt.target_version = v;
    const StateDigests base_digests = compute_digests(base);
    StateDigests target_digests;
    const auto patch = encode_patch(base, target, opt, &base_digests, &target_digests);
    EXPECT_EQ(encode_changes(base, changes_between(versions[v - 1], versions[v]), opt, base_digests), patch) << v;
    const ParsedPatch parsed = parse_patch(patch.data(), patch.size());
    EXPECT_EQ(parsed.header.values, ValueCoding::exponent_class_history);
    EXPECT_EQ(parsed.header.history, sender.digest());
    auto m = mutables(held);
    apply_patch(parsed, m, {}, nullptr, nullptr, {}, nullptr, &receiver);
    expect_equal_state(held, versions[v]);
    sender.advance(base, changes_between(versions[v - 1], versions[v]), target_digests.state);
    by_comparing.advance(base, target, target_digests.state);
    EXPECT_EQ(receiver.bytes(), sender.bytes()) << v;
    EXPECT_EQ(receiver.digest(), sender.digest()) << v;
    EXPECT_EQ(by_comparing.bytes(), sender.bytes()) << v;
    EXPECT_EQ(by_comparing.digest(), sender.digest()) << v;
    if (v > 3) {  // once most changes have a history
      with_history += patch.size();
      EncodeOptions plain = expclass();
      plain.base_version = v - 1;
      plain.target_version = v;
      without += encode_patch(base, target, plain).size();
    }
  }
  // 94% of the signs repeat the last one: about 0.35 bits instead of 1 once known.
  EXPECT_LT(double(with_history), 0.96 * double(without));
  // An expclass patch (coding 3) applied with a history advances it as well.
  const auto next = step(versions.back(), rng, 0.02);
  const auto plain = encode_patch(refs(versions.back()), refs(next), expclass());
  auto m = mutables(held);
  StateDigests after;
  apply_patch(parse_patch(plain.data(), plain.size()), m, {}, nullptr, &after, {}, nullptr, &receiver);
  sender.advance(refs(versions.back()), refs(next), after.state);
  EXPECT_EQ(receiver.bytes(), sender.bytes());
  EXPECT_EQ(receiver.digest(), sender.digest());
}

TEST(Patch, ExpclassHistoryDecodesOnlyAgainstTheHistoryItWasCodedFor) {
  const HistoryPatch c = history_patch(42, 3000);
  const auto& [versions, sender, patch] = c;
  const Digest origin = compute_digests(refs(versions[0])).state;
  const ParsedPatch parsed = parse_patch(patch.data(), patch.size());
  auto refused = [&](ChangeHistory* history, const std::string& says) {
    State held = versions[1];
    auto m = mutables(held);
    const std::vector<std::uint8_t> before = history ? history->bytes() : std::vector<std::uint8_t>{};
    const Digest digest_before = history ? history->digest() : Digest{};
    try {
      apply_patch(parsed, m, {}, nullptr, nullptr, {}, nullptr, history);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    }
    expect_equal_state(held, versions[1]);
    if (history) {
      EXPECT_EQ(history->bytes(), before);
      EXPECT_EQ(history->digest(), digest_before);
    }
  };
  refused(nullptr, "does not keep");
  // A receiver that started at the same state but followed another version 1.
  ChangeHistory fresh(refs(versions[0]), origin);
  refused(&fresh, "not the one");
  ChangeHistory other(refs(versions[0]), origin);
  other.advance(refs(versions[0]), refs(versions[0]), compute_digests(refs(versions[0])).state);
  refused(&other, "not the one");
  // A history with the right digest but other bytes (a forged or damaged one: every element
  // never changed): the signs decode differently and a check turns the patch away.
  ChangeHistory forged(refs(versions[0]), std::vector<std::uint8_t>(sender.bytes().size(), 0), sender.digest());
  refused(&forged, "");  // whichever check stops it first
  // The sender's history takes it.
  ChangeHistory receiver(refs(versions[0]), sender.bytes(), sender.digest());
  State held = versions[1];
  auto m = mutables(held);
  apply_patch(parsed, m, {}, nullptr, nullptr, {}, nullptr, &receiver);
  expect_equal_state(held, versions[2]);
  // Encoding needs the history for this coding and only for it.
  EncodeOptions no_history = exponent_class_history_options(sender);
  no_history.history = nullptr;
  EXPECT_THROW(encode_patch(refs(versions[1]), refs(versions[2]), no_history), Error);
  EncodeOptions stray = expclass();
  stray.history = &sender;
  EXPECT_THROW(encode_patch(refs(versions[1]), refs(versions[2]), stray), Error);
}

TEST(Patch, ExpclassHistoryCorruptionsWithAValidChecksumAreRejectedOrExact) {
  // As for expclass: every byte of a small expclass-history patch replaced by each of its other
  // values, checksum rewritten; rejected with weights and history untouched, or exact.
  const HistoryPatch c = history_patch(43, 40);
  const auto& [versions, sender, good] = c;
  std::size_t rejected = 0, exact = 0;
  for (std::size_t at = 0; at + 16 < good.size(); ++at)
    for (int delta = 1; delta < 256; delta += 3) {
      auto bad = good;
      bad[at] = std::uint8_t(bad[at] + delta);
      bad = rechecksummed(bad);
      State held = versions[1];
      auto m = mutables(held);
      ChangeHistory receiver(refs(versions[0]), sender.bytes(), sender.digest());
      try {
        apply_patch(parse_patch(bad.data(), bad.size()), m, {}, nullptr, nullptr, {}, nullptr, &receiver);
        expect_equal_state(held, versions[2]);
        ++exact;
      } catch (const Error&) {
        expect_equal_state(held, versions[1]);
        EXPECT_EQ(receiver.bytes(), sender.bytes());
        EXPECT_EQ(receiver.digest(), sender.digest());
        ++rejected;
      }
    }
  EXPECT_GT(rejected, 0u);
  EXPECT_GT(exact, 0u);  // the version numbers are not part of the state
}

// FORMAT.md "Accepted inputs": a non-minimal varint is read as its value; one of more than 10
// bytes, or whose 10th byte holds more than bit 63, is refused rather than wrapped.
TEST(Varint, NonMinimalAcceptedBeyond64BitsRefused) {
  auto read = [](std::vector<std::uint8_t> bytes) {
    std::size_t pos = 0;
    const std::uint64_t v = get_varint(bytes.data(), bytes.size(), pos);
    EXPECT_EQ(pos, bytes.size());
    return v;
  };
  EXPECT_EQ(read({0x00}), 0u);
  EXPECT_EQ(read({0x80, 0x00}), 0u);
  EXPECT_EQ(read({0xFF, 0x80, 0x80, 0x00}), 127u);
  std::vector<std::uint8_t> max(9, 0xFF);
  max.push_back(0x01);
  EXPECT_EQ(read(max), UINT64_MAX);
  std::vector<std::uint8_t> wide(9, 0x80);
  wide.push_back(0x02);  // 2^64: would wrap to 0
  EXPECT_THROW(read(wide), pulse::Error);
  std::vector<std::uint8_t> eleven(10, 0x80);
  eleven.push_back(0x00);
  EXPECT_THROW(read(eleven), pulse::Error);
  EXPECT_THROW(read({0x80}), pulse::Error);
}

// FORMAT.md "Compression": a zstd stream is exactly one frame; a second frame after it (which
// ZSTD_decompress alone would decode too) is refused.
TEST(Compression, ZstdStreamIsExactlyOneFrame) {
  const std::vector<std::uint8_t> raw(100, 7);
  std::vector<std::uint8_t> coded = compress(Compressor::zstd, 3, raw);
  EXPECT_EQ(decompress(Compressor::zstd, coded.data(), coded.size(), raw.size()), raw);
  const std::vector<std::uint8_t> half(raw.begin(), raw.begin() + 50);
  std::vector<std::uint8_t> two = compress(Compressor::zstd, 3, half);
  const std::vector<std::uint8_t> second = compress(Compressor::zstd, 3, half);
  two.insert(two.end(), second.begin(), second.end());
  EXPECT_THROW(decompress(Compressor::zstd, two.data(), two.size(), raw.size()), pulse::Error);
}
