// The change set (src/sync/change_set.hpp), one step's changes from AdamW to the wire: a patch
// coded from it (encode_change_set) is the bytes of encode_patch comparing the two versions and of
// encode_changes, for every coding and compressor, across part boundaries, with listed elements
// that keep their bits; its summary is what parsing the patch says; a change history advanced
// from it is the one advanced by comparing; sets that do not fit are refused, and applying one in
// place keeps what it overwrote, so reverting gives the state back.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>

#include "core/error.hpp"
#include "support/owned_state.hpp"
#include "sync/change_history.hpp"
#include "sync/change_set.hpp"
#include "sync/patch.hpp"

using namespace pulse;
using namespace pulse::sync;
using test::OwnedTensor;
using test::State;
using test::refs;

namespace {

OwnedTensor bf16_tensor(const std::string& name, std::size_t n, std::mt19937& rng) {
  OwnedTensor t{name, "BF16", {std::int64_t(n)}, std::vector<std::byte>(2 * n)};
  for (std::size_t i = 0; i < n; ++i) {
    const auto bits = std::uint16_t(0x3c00 + rng() % 0x400);  // weights of magnitude about 2^-7..2^-1
    std::memcpy(t.bytes.data() + 2 * i, &bits, 2);
  }
  return t;
}

std::uint16_t bits_at(const OwnedTensor& t, std::size_t i) {
  std::uint16_t b;
  std::memcpy(&b, t.bytes.data() + 2 * i, 2);
  return b;
}

// Tensors in table order (not name order), one empty, one over several parts at part_elements 512.
State random_state(std::mt19937& rng) {
  return {bf16_tensor("layer.1.weight", 3000, rng), bf16_tensor("empty", 0, rng), bf16_tensor("layer.0.bias", 77, rng),
          bf16_tensor("a.first", 1, rng)};
}

// A fraction of the elements moved by a few key steps.
State step(const State& base, std::mt19937& rng, double density) {
  State t = base;
  std::uniform_real_distribution<double> u(0, 1);
  for (auto& tensor : t)
    for (std::size_t i = 0; i < tensor.bytes.size() / 2; ++i)
      if (u(rng) < density) {
        const auto bits = std::uint16_t(bits_at(tensor, i) + 1 + rng() % 3);
        std::memcpy(tensor.bytes.data() + 2 * i, &bits, 2);
      }
  return t;
}

std::vector<index_t> offsets_of(const State& s) {
  std::vector<index_t> offsets{0};
  for (const auto& t : s) offsets.push_back(offsets.back() + index_t(t.bytes.size() / 2));
  return offsets;
}

// base -> target as AdamW lists it (flat indices in table order), besides every noop_every-th
// element whose bits stay.
ChangeSet change_set(const State& base, const State& target, std::size_t noop_every) {
  ChangeSet set;
  index_t flat = 0;
  for (std::size_t t = 0; t < base.size(); ++t)
    for (std::size_t i = 0; i < base[t].bytes.size() / 2; ++i, ++flat)
      if (bits_at(base[t], i) != bits_at(target[t], i) || (noop_every && flat % index_t(noop_every) == 0)) {
        set.indices.push_back(flat);
        set.new_bits.push_back(bits_at(target[t], i));
      }
  set.tensor_begin = tensor_begins(set.indices, offsets_of(base));
  return set;
}

std::vector<TensorChanges> tensor_changes(const State& base, const ChangeSet& set) {
  std::vector<TensorChanges> out;
  const auto offsets = offsets_of(base);
  for (std::size_t t = 0; t < base.size(); ++t) {
    TensorChanges c{base[t].name, {}, {}};
    for (auto j = std::size_t(set.tensor_begin[t]); j < std::size_t(set.tensor_begin[t + 1]); ++j)
      c.indices.push_back(set.indices[j] - offsets[t]), c.new_bits.push_back(set.new_bits[j]);
    out.push_back(c);
  }
  return out;
}

std::vector<EncodeOptions> every_coding(const ChangeHistory& history) {
  std::vector<EncodeOptions> out;
  for (auto values : {ValueCoding::raw, ValueCoding::keydiff})
    for (auto indices : {IndexCoding::gap_fixed, IndexCoding::gap_varint}) {
      out.emplace_back();
      out.back().values = values, out.back().indices = indices;
    }
  out.emplace_back();
  out.back().values = ValueCoding::exponent_class, out.back().indices = IndexCoding::exponent_class;
  out.push_back(exponent_class_history_options(history));
  return out;
}

}  // namespace

TEST(ChangeSet, EncodeChangeSetWritesTheBytesOfEncodePatchAndSaysWhatItWrote) {
  std::mt19937 rng(5);
  const State v0 = random_state(rng), base = step(v0, rng, 0.2);
  ChangeHistory history(refs(v0), compute_digests(refs(v0)).state);
  history.advance(refs(v0), refs(base), compute_digests(refs(base)).state);
  const StateDigests base_digests = compute_digests(refs(base));
  for (double density : {0.0, 0.003, 0.05, 1.0}) {
    const State target = step(base, rng, density);
    for (EncodeOptions opt : every_coding(history))
      for (auto compressor : {Compressor::none, Compressor::zstd})
        for (std::size_t noop_every : {std::size_t(0), std::size_t(13)}) {
          opt.compressor = compressor;
          opt.part_elements = 512;
          opt.base_version = 7, opt.target_version = 8;
          SCOPED_TRACE(std::string(value_coding_name(opt.values)) + " " + index_coding_name(opt.indices) + " " +
                       compressor_name(compressor) + " density " + std::to_string(density) + " no-ops every " +
                       std::to_string(noop_every));
          StateDigests from_patch, from_set;
          const auto expected = encode_patch(refs(base), refs(target), opt, &base_digests, &from_patch);
          const ChangeSet set = change_set(base, target, noop_every);
          const EncodedPatch got = encode_change_set(refs(base), set, opt, base_digests, &from_set);
          EXPECT_EQ(got.bytes, expected);
          EXPECT_EQ(got.bytes, encode_changes(refs(base), tensor_changes(base, set), opt, base_digests));
          EXPECT_EQ(from_set.state, from_patch.state);
          EXPECT_EQ(from_set.tensors, from_patch.tensors);
          const ParsedPatch parsed = parse_patch(expected.data(), expected.size());
          EXPECT_EQ(got.summary.bytes, expected.size());
          EXPECT_EQ(got.summary.changed, parsed.header.total_changed);
          EXPECT_EQ(got.summary.index_stream.raw, parsed.header.index_stream.raw);
          EXPECT_EQ(got.summary.index_stream.coded, parsed.header.index_stream.coded);
          EXPECT_EQ(got.summary.value_stream.raw, parsed.header.value_stream.raw);
          EXPECT_EQ(got.summary.value_stream.coded, parsed.header.value_stream.coded);
          EXPECT_EQ(got.summary.whole_raw, parsed.header.whole_stream.raw);
          EXPECT_EQ(got.summary.parts, parsed.parts.size());
          EXPECT_EQ(got.summary.raw_bytes(), parsed.header.index_stream.raw + parsed.header.value_stream.raw +
                                                 parsed.header.whole_stream.raw);
        }
  }
}

TEST(ChangeSet, HistoryAdvancedFromTheSetIsTheOneAdvancedByComparing) {
  std::mt19937 rng(6);
  std::vector<State> versions{random_state(rng)};
  for (int v = 1; v < 6; ++v) versions.push_back(step(versions.back(), rng, 0.1));
  const Digest origin = compute_digests(refs(versions[0])).state;
  ChangeHistory from_sets(refs(versions[0]), origin), by_comparing(refs(versions[0]), origin);
  for (std::size_t v = 1; v < versions.size(); ++v) {
    const Digest target = compute_digests(refs(versions[v])).state;
    from_sets.advance(refs(versions[v - 1]), change_set(versions[v - 1], versions[v], 5), target);
    by_comparing.advance(refs(versions[v - 1]), refs(versions[v]), target);
    EXPECT_EQ(from_sets.bytes(), by_comparing.bytes()) << v;
    EXPECT_EQ(from_sets.digest(), by_comparing.digest()) << v;
  }
}

TEST(ChangeSet, SetsThatDoNotFitAreRefused) {
  std::mt19937 rng(7);
  const State base = random_state(rng), target = step(base, rng, 0.05);
  const StateDigests digests = compute_digests(refs(base));
  const ChangeSet good = change_set(base, target, 0);
  ASSERT_GT(good.count(0), 2);
  auto refuses = [&](const ChangeSet& set, const std::string& message) {
    try {
      encode_change_set(refs(base), set, {}, digests);
      ADD_FAILURE() << "accepted: " << message;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  };
  ChangeSet s = good;
  s.tensor_begin.pop_back();
  refuses(s, "tensors, the state has 4");
  s = good;
  std::swap(s.indices[0], s.indices[1]);
  refuses(s, "is not sorted, distinct and inside tensor 0");
  s = good;
  s.indices[1] = s.indices[0];
  refuses(s, "is not sorted, distinct and inside tensor 0");
  s = good;
  s.tensor_begin[1] -= 1;  // tensor 0's last change counted in the empty tensor 1
  refuses(s, "inside tensor 1");
  s = good;
  s.indices.back() = 3000 + 77 + 1;  // past the end
  refuses(s, "is not sorted, distinct and inside tensor");
  s = good;
  s.new_bits.pop_back();
  refuses(s, "new and 0 old values");
  s = good;
  s.old_bits.assign(2, 0);
  refuses(s, "new and 2 old values");
  State with_f32 = base;
  with_f32[1] = OwnedTensor{"scale", "F32", {0}, {}};
  EXPECT_THROW(encode_change_set(refs(with_f32), good, {}, compute_digests(refs(with_f32))), Error);
}

TEST(ChangeSet, TensorBeginsApplyAndRevert) {
  ChangeSet set;
  set.indices = {0, 4, 5, 9, 10};
  set.new_bits = {1, 2, 3, 4, 5};
  set.tensor_begin = tensor_begins(set.indices, {0, 5, 5, 10, 11});
  EXPECT_EQ(set.tensor_begin, (std::vector<index_t>{0, 2, 2, 4, 5}));
  EXPECT_EQ(set.count(0), 2);
  EXPECT_EQ(set.count(1), 0);
  EXPECT_NO_THROW(check_change_set(set, {0, 5, 5, 10, 11}));
  // An index past the last tensor falls into it, and the check refuses it.
  EXPECT_THROW(check_change_set(set, {0, 5, 5, 10}), Error);
  std::vector<std::uint16_t> state(11);
  for (std::size_t i = 0; i < state.size(); ++i) state[i] = std::uint16_t(100 + i);
  const auto before = state;
  std::vector<std::uint16_t> small(state.begin(), state.begin() + 10);
  const auto small_before = small;
  EXPECT_THROW(apply_change_set(set, small.data(), small.size()), Error);  // index 10 is outside
  EXPECT_EQ(small, small_before);
  apply_change_set(set, state.data(), state.size());
  EXPECT_EQ(state, (std::vector<std::uint16_t>{1, 101, 102, 103, 2, 3, 106, 107, 108, 4, 5}));
  EXPECT_EQ(set.old_bits, (std::vector<std::uint16_t>{100, 104, 105, 109, 110}));
  revert_change_set(set, state.data(), state.size());
  EXPECT_EQ(state, before);
  set.old_bits.clear();
  EXPECT_THROW(revert_change_set(set, state.data(), state.size()), Error);
}
