// The exponent-class coding of PULSESync patches: its range coder (round trips, exact stream
// ends, cost near the entropy of a skewed source), the entropy estimator the benchmarks compare
// against (a hand-derived case), and the coding's size against the entropy and keydiff.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "core/error.hpp"
#include "kernels/bf16.hpp"
#include "sync/change_entropy.hpp"
#include "sync/codec_choice.hpp"
#include "sync/exponent_class_coding.hpp"
#include "sync/patch.hpp"
#include "coding/range_coder.hpp"
#include "sync/sparse_format.hpp"

using namespace pulse;
using namespace pulse::sync;

namespace {

std::vector<TensorRef> one_tensor(const std::vector<bf16_bits>& bits) {
  return {{"w", "BF16", {std::int64_t(bits.size())}, reinterpret_cast<const std::byte*>(bits.data()), 2 * bits.size()}};
}

}  // namespace

TEST(RangeCoder, BitsAndIntegersRoundTripWithExactStreamEnds) {
  std::mt19937_64 rng(1);
  for (int trial = 0; trial < 200; ++trial) {
    const int count = int(rng() % 300);
    std::vector<int> bits(count);
    std::vector<std::uint64_t> values(count);
    std::vector<int> widths(count);
    RangeEncoder enc;
    BitModel bit_models[3];
    IntegerModel int_model;
    for (int i = 0; i < count; ++i) {
      bits[i] = (rng() % 100) < std::uint64_t(trial % 100);  // skews from 0% to 99% ones
      widths[i] = int(rng() % 63);
      values[i] = widths[i] ? rng() >> (64 - widths[i]) : 0;
      enc.encode(bit_models[i % 3], bits[i]);
      enc.encode_integer(int_model, values[i]);
      enc.encode_even(values[i], widths[i]);
    }
    const auto stream = enc.finish();
    RangeDecoder dec(stream.data(), stream.size(), "test");
    BitModel dec_models[3];
    IntegerModel dec_int;
    for (int i = 0; i < count; ++i) {
      ASSERT_EQ(dec.decode(dec_models[i % 3]), bits[i]) << trial << " " << i;
      ASSERT_EQ(dec.decode_integer(dec_int, UINT64_MAX >> 1), values[i]) << trial << " " << i;
      ASSERT_EQ(dec.decode_even(widths[i]), values[i]) << trial << " " << i;
    }
    EXPECT_TRUE(dec.at_end()) << "trial " << trial << ": " << stream.size() << " bytes";
  }
}

TEST(RangeCoder, DecoderRejectsValuesAboveTheirBoundAndStreamsThatEnd) {
  RangeEncoder enc;
  IntegerModel m;
  enc.encode_integer(m, 1000);
  const auto stream = enc.finish();
  {
    RangeDecoder dec(stream.data(), stream.size(), "test");
    IntegerModel d;
    EXPECT_THROW(dec.decode_integer(d, 999), Error);
  }
  {
    RangeDecoder dec(stream.data(), stream.size(), "test");
    IntegerModel d;
    EXPECT_EQ(dec.decode_integer(d, 1000), 1000u);
  }
  EXPECT_THROW(RangeDecoder(stream.data(), 3, "test"), Error);
  const std::uint8_t not_a_code[5] = {1, 0, 0, 0, 0};
  EXPECT_THROW(RangeDecoder(not_a_code, 5, "test"), Error);
}

TEST(RangeCoder, SkewedBitsCostCloseToTheirEntropy) {
  // 200,000 bits with P(1) = 0.05: entropy 0.2864 bits each; the adaptive model pays a little
  // for its estimate's noise.
  std::mt19937_64 rng(2);
  RangeEncoder enc;
  BitModel model;
  const int n = 200000;
  for (int i = 0; i < n; ++i) enc.encode(model, rng() % 100 < 5);
  const double bits = 8.0 * double(enc.finish().size());
  const double entropy = n * -(0.05 * std::log2(0.05) + 0.95 * std::log2(0.95));
  EXPECT_LT(bits, 1.08 * entropy);
  EXPECT_GT(bits, 0.97 * entropy);
}

TEST(ChangeEntropy, HandDerivedCase) {
  // Four elements of exponent class 127 (1.0 = 0x3F80), four of class 120 (0x3C00).
  // Class 127: two of four change, each by +1 key step: positions 4 H(1/2) = 4 bits, values 0.
  // Class 120: one of four changes, by -1: positions 4 H(1/4) = 3.2451 bits, values 0.
  // Without context: positions 8 H(3/8) = 7.6355 bits; values {+1, +1, -1}: 3 H(1/3) = 2.7549 bits.
  const std::vector<bf16_bits> base{0x3F80, 0x3F81, 0x3F82, 0x3F83, 0x3C00, 0x3C01, 0x3C02, 0x3C03};
  std::vector<bf16_bits> target = base;
  target[1] = 0x3F82;  // key + 1 (positive: key = bits | 0x8000)
  target[3] = 0x3F84;
  target[6] = 0x3C01;  // key - 1
  const ChangeEntropy e = change_entropy(one_tensor(base), one_tensor(target));
  const double h14 = -(0.25 * std::log2(0.25) + 0.75 * std::log2(0.75));
  const double h38 = -(0.375 * std::log2(0.375) + 0.625 * std::log2(0.625));
  const double h13 = -(std::log2(1.0 / 3) / 3 + 2 * std::log2(2.0 / 3) / 3);
  EXPECT_EQ(e.changes, 3u);
  EXPECT_NEAR(e.position_bits, 4.0 + 4 * h14, 1e-9);
  EXPECT_NEAR(e.value_bits, 0.0, 1e-12);
  EXPECT_NEAR(e.position_bits_no_context, 8 * h38, 1e-9);
  EXPECT_NEAR(e.value_bits_no_context, 3 * h13, 1e-9);
  EXPECT_NEAR(4 * h14, 3.2451, 1e-4);  // the hand-derived numbers above
  EXPECT_NEAR(8 * h38, 7.6355, 1e-4);
  EXPECT_NEAR(3 * h13, 2.7549, 1e-4);
}

TEST(ExponentClassCoding, CodesATrainingStepNearItsEntropyAndBelowKeydiff) {
  // Weights ~ N(0, 0.02), each moved by an update ~ N(0, 1e-4) and rounded to BF16 (about 2%
  // of the elements change, mostly the small ones): the coding's patch must come within 1.3x
  // of the conditioned entropy and be smaller than keydiff + zstd.
  std::mt19937 rng(3);
  std::normal_distribution<float> weight(0.0f, 0.02f), update(0.0f, 1e-4f);
  const std::size_t n = 1 << 18;
  std::vector<bf16_bits> base(n), target(n);
  for (std::size_t i = 0; i < n; ++i) {
    const float w = weight(rng);
    base[i] = float_to_bf16(w);
    target[i] = float_to_bf16(w + update(rng));
  }
  const ChangeEntropy e = change_entropy(one_tensor(base), one_tensor(target));
  ASSERT_GT(e.changes, n / 200);
  EncodeOptions exp;
  exp.values = ValueCoding::exponent_class;
  exp.indices = IndexCoding::exponent_class;
  exp.compressor = Compressor::none;
  const auto patch = encode_patch(one_tensor(base), one_tensor(target), exp);
  const auto keydiff = encode_patch(one_tensor(base), one_tensor(target), {});
  const ParsedPatch p = parse_patch(patch.data(), patch.size());
  const double stream_bits = 8.0 * double(p.header.index_stream.coded + p.header.value_stream.coded);
  EXPECT_LT(stream_bits, 1.3 * e.bits()) << "entropy " << e.bits() / e.changes << " bits per change";
  EXPECT_LT(e.bits(), e.bits_no_context());
  EXPECT_LT(patch.size(), keydiff.size());
  std::vector<bf16_bits> receiver = base;
  std::vector<MutableTensor> m{{"w", "BF16", {std::int64_t(n)}, reinterpret_cast<std::byte*>(receiver.data()), 2 * n}};
  apply_patch(p, m);
  EXPECT_EQ(receiver, target);
}

TEST(ExponentClassCoding, IsChosenForIndicesAndValuesTogether) {
  const std::vector<bf16_bits> base{0x3F80, 0x4000}, target{0x3F81, 0x4000};
  EncodeOptions half;
  half.values = ValueCoding::exponent_class;
  EXPECT_THROW(encode_patch(one_tensor(base), one_tensor(target), half), Error);
  EncodeOptions both = half;
  both.indices = IndexCoding::exponent_class;
  auto patch = encode_patch(one_tensor(base), one_tensor(target), both);
  EXPECT_EQ(patch[12], 3);
  EXPECT_EQ(patch[13], 3);
  EXPECT_EQ(parse_value_coding("expclass"), ValueCoding::exponent_class);
  EXPECT_EQ(parse_index_coding("expclass"), IndexCoding::exponent_class);
  patch[13] = 1;  // a header naming expclass for values only is refused (before its checksum)
  try {
    parse_patch(patch.data(), patch.size());
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expclass coding for only one"), std::string::npos) << e.what();
  }
}

TEST(ExponentClassCoding, PatchesOfTheEarlierCodingAreRefusedWithOneLine) {
  // Coding id 2 was expclass before its contexts changed: its streams would decode to garbage
  // (or fail late), so the header is refused at once, before the checksum, for either half.
  const std::vector<bf16_bits> base{0x3F80, 0x4000}, target{0x3F81, 0x4000};
  const auto patch = encode_patch(one_tensor(base), one_tensor(target), exponent_class_options());
  for (const std::pair<std::uint8_t, std::uint8_t>& ids : {std::pair<std::uint8_t, std::uint8_t>{2, 2}, {2, 3}, {3, 2}, {1, 2}}) {
    auto old = patch;
    old[12] = ids.first;
    old[13] = ids.second;
    try {
      parse_patch(old.data(), old.size());
      ADD_FAILURE() << "coding ids " << int(ids.first) << ", " << int(ids.second) << " accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("expclass coding of an earlier pulse (coding id 2), which is no longer decoded"), std::string::npos) << what;
      EXPECT_NE(what.find("encode the patch again"), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
  auto unknown = patch;
  unknown[12] = unknown[13] = 4;
  EXPECT_THROW(parse_patch(unknown.data(), unknown.size()), Error);
}

TEST(ExponentClassCoding, CodecChoiceWeighsItAgainstTheOthers) {
  // On a slow link the smallest patch wins, and on a training step that is an expclass one; the
  // candidates report the sizes encode_patch gives.
  std::mt19937 rng(4);
  std::normal_distribution<float> weight(0.0f, 0.02f), update(0.0f, 1e-4f);
  const std::size_t n = 1 << 16;
  std::vector<bf16_bits> base(n), target(n);
  for (std::size_t i = 0; i < n; ++i) {
    const float w = weight(rng);
    base[i] = float_to_bf16(w);
    target[i] = float_to_bf16(w + update(rng));
  }
  const auto measured = measure_codecs(one_tensor(base), one_tensor(target));
  std::size_t expclass_candidates = 0;
  for (const auto& m : measured) {
    EXPECT_EQ(m.patch_bytes, encode_patch(one_tensor(base), one_tensor(target), m.options).size()) << m.name;
    expclass_candidates += m.options.values == ValueCoding::exponent_class;
  }
  EXPECT_EQ(expclass_candidates, 2u);
  const auto& slow = measured[best_codec(measured, 1e3)];
  EXPECT_EQ(slow.options.values, ValueCoding::exponent_class) << slow.name;
  for (const auto& m : measured) EXPECT_LE(slow.patch_bytes, m.patch_bytes) << m.name;
}

namespace {

// Weight-like bits of a sparse-coded dtype from integers only (the same on every platform):
// random sign and mantissa, an exponent spread over about 16 classes below the middle one (or
// uniform bits when `uniform`). The target moves per_mille of the elements by a few key steps.
struct RecordedCase {
  std::string dtype;
  std::size_t n;
  unsigned per_mille;
  bool uniform;
};

void weight_like_pair(const RecordedCase& c, std::uint64_t seed, std::vector<std::uint8_t>& base,
                      std::vector<std::uint8_t>& target) {
  const SparseFormat f = *sparse_format(c.dtype);
  std::mt19937_64 rng(seed);
  base.resize(c.n * f.bytes);
  target.resize(c.n * f.bytes);
  for (std::size_t i = 0; i < c.n; ++i) {
    std::uint64_t bits = rng() & f.mask();
    if (!c.uniform) {
      const std::uint64_t middle = f.classes() / 2, spread = __builtin_popcountll(rng() & 0xFFFF);
      const std::uint64_t exponent = middle > spread ? middle - spread : 0;
      bits = (bits & ~(((std::uint64_t(f.classes()) - 1) << f.mantissa_bits))) | (exponent << f.mantissa_bits);
    }
    std::uint64_t next = bits;
    if (rng() % 1000 < c.per_mille) {
      const std::int64_t step = 1 + (rng() % 4 == 0 ? std::int64_t(rng() % 5) : 0);
      const std::int64_t key = std::int64_t(f.key(bits)) + (rng() % 2 ? step : -step);
      if (key >= 0 && key <= std::int64_t(f.mask())) next = f.from_key(std::uint64_t(key));
    }
    std::memcpy(base.data() + f.bytes * i, &bits, f.bytes);
    std::memcpy(target.data() + f.bytes * i, &next, f.bytes);
  }
}

}  // namespace

TEST(ExponentClassCoding, EncodesTheBytesRecordedBeforeItsSpeedWork) {
  // The expclass bytes are the format: a faster coder must write exactly what the coder wrote
  // before (digests recorded from the coding id 3 encoder at commit 8030394, re-recorded for
  // patch format 3, whose header, digests and part table differ, and again for its compact part
  // table, which changed no stream byte: these patches are one part each), and the patches must apply.
  const std::vector<std::vector<RecordedCase>> patches{
      {{"BF16", 100000, 10, false}, {"F16", 30011, 10, false}, {"F32", 20003, 10, false},
       {"F8_E4M3", 5003, 10, false}, {"F8_E5M2", 4001, 20, false}, {"F8_E8M0", 3001, 30, false},
       {"BF16", 1, 1000, false}, {"BF16", 0, 0, false}, {"BF16", 777, 0, false}},
      {{"BF16", 1 << 20, 10, false}},
      {{"BF16", 1 << 18, 10, true}},
      {{"BF16", 1 << 18, 1, false}, {"F32", 1 << 16, 500, false}},
      {{"BF16", 4099, 1000, true}, {"F16", 4099, 900, false}},
  };
  const std::vector<std::string> recorded{"fbd2e56926ba603e245461fc1c5955ec", "8ebe1728cfca9d96f1343779451f7b24",
                                          "5e691e5b30d9e4c16c660887c4e58a71", "5bf34b186c958c823e4669923916fa4d",
                                          "98b0eae18c114204a240aaa034ea4f90"};
  for (std::size_t p = 0; p < patches.size(); ++p) {
    std::vector<std::vector<std::uint8_t>> bases(patches[p].size()), targets(patches[p].size());
    std::vector<TensorRef> base, target;
    for (std::size_t t = 0; t < patches[p].size(); ++t) {
      const RecordedCase& c = patches[p][t];
      weight_like_pair(c, 100 * p + t, bases[t], targets[t]);
      const std::string name = "t" + std::to_string(t);
      base.push_back({name, c.dtype, {std::int64_t(c.n)}, reinterpret_cast<const std::byte*>(bases[t].data()), bases[t].size()});
      target.push_back({name, c.dtype, {std::int64_t(c.n)}, reinterpret_cast<const std::byte*>(targets[t].data()), targets[t].size()});
    }
    const auto patch = encode_patch(base, target, exponent_class_options());
    EXPECT_EQ(to_hex(digest_bytes(patch.data(), patch.size())), recorded[p]) << "patch " << p << ", " << patch.size() << " bytes";
    std::vector<MutableTensor> receiver;
    for (std::size_t t = 0; t < base.size(); ++t)
      receiver.push_back({base[t].name, base[t].dtype, base[t].shape, reinterpret_cast<std::byte*>(bases[t].data()), bases[t].size()});
    apply_patch(parse_patch(patch.data(), patch.size()), receiver);
    for (std::size_t t = 0; t < base.size(); ++t) EXPECT_EQ(bases[t], targets[t]) << "patch " << p << ", tensor " << t;
  }
}

namespace {

// The ranker against ranks counted element by element, with the changes handed over in pieces
// of random size (empty ones too, and pieces that cross the blocks and chunks of the fast
// paths); then the decoder against the encoder's changes, its progress reports checked against
// the sorted indices.
void check_ranks_and_round_trip(const SparseFormat& f, const std::vector<std::uint8_t>& base,
                                const std::vector<std::uint8_t>& target, std::size_t n, std::mt19937_64& rng,
                                const std::string& label) {
  const auto* old_data = reinterpret_cast<const std::byte*>(base.data());
  std::vector<index_t> indices;
  std::vector<std::uint32_t> new_bits, old_bits;
  std::vector<std::uint64_t> expected, seen(f.classes(), 0);
  for (std::size_t i = 0; i < n; ++i) {
    const auto before = load_value(old_data, i, f.bytes);
    const auto after = load_value(reinterpret_cast<const std::byte*>(target.data()), i, f.bytes);
    const unsigned k = f.exponent_class(before);
    if (before != after) {
      indices.push_back(index_t(i));
      new_bits.push_back(std::uint32_t(after));
      old_bits.push_back(std::uint32_t(before));
      expected.push_back(seen[k]);
    }
    ++seen[k];
  }
  ASSERT_GT(indices.size(), 10u) << label;
  ExponentClassRanker ranker(f, old_data, n);
  std::vector<std::uint64_t> ranks;
  for (std::size_t j = 0; j < indices.size();) {
    const std::size_t piece = std::min<std::size_t>(indices.size() - j, rng() % 4 == 0 ? 0 : rng() % 2000);
    ranker.rank(indices.data() + j, old_bits.data() + j, piece, ranks);
    j += piece;
  }
  ASSERT_EQ(ranks, expected) << label;

  ExponentClassEncoder encoder;
  encoder.add(f, ranks.data(), new_bits.data(), old_bits.data(), indices.size());
  const auto index_stream = encoder.finish_indices(), value_stream = encoder.finish_values();
  ExponentClassDecoder decoder(index_stream.data(), index_stream.size(), value_stream.data(), value_stream.size(),
                               indices.size());
  std::vector<std::uint64_t> decoded(indices.size());
  std::vector<std::uint8_t> values(indices.size() * f.bytes);
  std::uint64_t last_end = 0, calls = 0;
  decoder.decode(f, old_data, n, indices.size(), decoded.data(), values.data(), "",
                 [&](std::uint64_t end, std::uint64_t found) {
                   ++calls;
                   EXPECT_GT(end, last_end);
                   EXPECT_TRUE(end == n || end - last_end <= ExponentClassDecoder::kPassChunk) << end;
                   last_end = end;
                   // Every change below `end` is among the first `found`, which are all below it.
                   const auto below = std::lower_bound(indices.begin(), indices.end(), index_t(end)) - indices.begin();
                   EXPECT_EQ(std::uint64_t(below), found) << label << " end " << end;
                 });
  decoder.check_consumed();
  EXPECT_EQ(last_end, n);
  EXPECT_GE(calls, 1u);
  for (std::size_t j = 0; j < indices.size(); ++j) {
    ASSERT_EQ(decoded[j], std::uint64_t(indices[j])) << label << " change " << j;
    ASSERT_EQ(load_value(reinterpret_cast<const std::byte*>(values.data()), j, f.bytes), new_bits[j]);
  }
}

}  // namespace

TEST(ExponentClassCoding, RanksInPiecesAndDecoderProgressMatchAReference) {
  // Concentrated classes take the block paths for 16-bit dtypes, uniform bits (and 8-, 32-bit
  // dtypes) the element-by-element ones.
  std::mt19937_64 rng(21);
  for (const RecordedCase c : {RecordedCase{"BF16", 300007, 10, false}, RecordedCase{"BF16", 70001, 30, true},
                               RecordedCase{"F16", 140003, 10, false}, RecordedCase{"F32", 70001, 20, false},
                               RecordedCase{"F8_E4M3", 9001, 50, false}, RecordedCase{"BF16", 130, 300, false}}) {
    std::vector<std::uint8_t> base, target;
    weight_like_pair(c, rng(), base, target);
    check_ranks_and_round_trip(*sparse_format(c.dtype), base, target, c.n, rng, std::string(c.dtype) + " " + std::to_string(c.n));
  }
}

TEST(ExponentClassCoding, BlocksWithEachCountOfChangesAndOtherClassesMatchAReference) {
  // Hand-made BF16 blocks of 64 elements: six common ("hot") exponent classes, and in block b
  // b % 6 elements of rare classes (two of one class where there are several) and (b / 6) % 5
  // changes, on rare and common elements alike; block 60 changes every element. Each count of
  // changes and of rare elements the block paths handle without a loop (0, 1, 2) and with one
  // (3 and more) is met, beside each other.
  std::mt19937_64 rng(5);
  const std::size_t blocks = 64, n = 64 * blocks + 37;  // a tail the block paths leave
  std::vector<std::uint16_t> base(n), target;
  for (std::size_t i = 0; i < n; ++i) base[i] = std::uint16_t((118 + rng() % 6) << 7 | rng() % 128);
  for (std::size_t b = 0; b < blocks; ++b)
    for (std::size_t r = 0; r < b % 6; ++r) base[64 * b + rng() % 64] = std::uint16_t((100 + b % 3 + (r > 1)) << 7 | rng() % 128);
  target = base;
  for (std::size_t b = 0; b < blocks; ++b)
    for (std::size_t r = 0; r < (b / 6) % 5; ++r) {
      std::size_t i = 64 * b + rng() % 64;
      // Every other change on a rare element where the block holds one.
      if (r % 2 == 1)
        for (std::size_t e = 64 * b; e < 64 * b + 64; ++e)
          if (base[e] >> 7 < 118 && target[e] == base[e]) i = e;
      target[i] = std::uint16_t(base[i] ^ 1);
    }
  for (std::size_t i = 64 * 60; i < 64 * 61; ++i) target[i] = std::uint16_t(base[i] ^ 2);
  target[n - 1] = std::uint16_t(base[n - 1] ^ 1);
  std::vector<std::uint8_t> base_bytes(2 * n), target_bytes(2 * n);
  std::memcpy(base_bytes.data(), base.data(), 2 * n);
  std::memcpy(target_bytes.data(), target.data(), 2 * n);
  check_ranks_and_round_trip(*sparse_format("BF16"), base_bytes, target_bytes, n, rng, "hand-made blocks");
}
