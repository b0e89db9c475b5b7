// Format-3 patches made of parts, and the block digest they rest on: the digest's partial sums
// against a direct sum of XXH3_128bits_withSeed per block; round trips of every coding with
// many parts; identical bytes at any thread count; corrupt part tables refused in one line; and
// patches assembled from the parts of tensor slices (as sharded senders make them), which decode
// to the unsharded patch's changes and target digest; and the scan's edges (its 64-byte windows
// and chunks), against the bytes encode_changes writes from the same changes listed.
#include <gtest/gtest.h>

#include <xxhash.h>

#include <cstring>
#include <random>

#include "core/error.hpp"
#include "sync/change_history.hpp"
#include "sync/patch.hpp"
#include "support/owned_state.hpp"

using namespace pulse;
using namespace pulse::sync;

namespace {

using test::OwnedTensor;
using test::State;
using test::refs;
using test::changed;
using test::decoded;
using test::element_width;
using test::mutables;

OwnedTensor random_tensor(std::mt19937_64& rng, const std::string& name, const std::string& dtype, std::size_t n) {
  const std::size_t w = element_width(dtype);
  OwnedTensor t{name, dtype, {std::int64_t(n)}, std::vector<std::byte>(n * w)};
  for (std::size_t i = 0; i < n; ++i) {
    // Weights of a few exponents, as trained ones: the exponent classes repeat.
    std::uint32_t bits = std::uint32_t(rng());
    if (w == 2) bits = (bits & 0x807F) | ((0x78 + bits % 6) << 7);
    if (w == 4) bits = (bits & 0x807FFFFF) | ((0x78 + (bits >> 8) % 6) << 23);
    if (w == 1) bits = (bits & 0x87) | ((5 + bits % 4) << 3);
    std::memcpy(t.bytes.data() + i * w, &bits, w);
  }
  return t;
}

State sample_state(std::mt19937_64& rng) {
  return {random_tensor(rng, "a.bf16", "BF16", 1000), random_tensor(rng, "b.f32", "F32", 300),
          random_tensor(rng, "c.f8", "F8_E4M3", 500), random_tensor(rng, "d.small", "BF16", 10),
          random_tensor(rng, "e.empty", "BF16", 0)};
}

// The digest by its definition: sum of XXH3_128bits_withSeed(block b, seed b) modulo 2^128.
Digest direct_digest(const std::byte* data, std::size_t bytes) {
  unsigned __int128 sum = 0;
  for (std::size_t b = 0; 128 * b < bytes; ++b) {
    const XXH128_hash_t h = XXH3_128bits_withSeed(data + 128 * b, std::min<std::size_t>(128, bytes - 128 * b), b);
    sum += (unsigned __int128)(h.high64) << 64 | h.low64;
  }
  Digest d;
  for (int i = 0; i < 16; ++i) d[i] = std::uint8_t(sum >> (120 - 8 * i));
  return d;
}


}  // namespace

TEST(BlockDigest, PartialSumsAddUpToTheDirectSumOfSeededBlockHashes) {
  std::mt19937_64 rng(7);
  for (std::size_t bytes : {std::size_t(0), std::size_t(1), std::size_t(128), std::size_t(1000), std::size_t(3 << 20) + 77}) {
    std::vector<std::byte> data(bytes);
    for (auto& b : data) b = std::byte(rng());
    const Digest direct = direct_digest(data.data(), bytes);
    for (unsigned threads : {1u, 2u, 3u})
      EXPECT_EQ(tensor_digest({"t", "U8", {std::int64_t(bytes)}, data.data(), bytes}, threads), direct) << bytes;
    // Pieces at 128-byte offsets, in any order, add up; subtracting one takes it off.
    BlockDigest sum;
    std::vector<std::size_t> cuts{0, std::min<std::size_t>(bytes, 256), std::min<std::size_t>(bytes, 640), bytes};
    for (std::size_t c = cuts.size() - 1; c-- > 0;) sum.add(data.data() + cuts[c], cuts[c + 1] - cuts[c], cuts[c]);
    EXPECT_EQ(sum.digest(), direct);
    EXPECT_EQ(BlockDigest::of(direct).digest(), direct);
    if (bytes >= 256) {
      // A change in block 1: the digest updated over that block equals the new bytes' digest.
      BlockDigest updated = BlockDigest::of(direct);
      updated.subtract(data.data() + 128, 128, 128);
      data[130] ^= std::byte{1};
      updated.add(data.data() + 128, 128, 128);
      EXPECT_EQ(updated.digest(), direct_digest(data.data(), bytes));
      EXPECT_NE(updated.digest(), direct);
    }
  }
  EXPECT_EQ(direct_digest(nullptr, 0), Digest{});
  BlockDigest bad;
  EXPECT_THROW(bad.add("x", 1, 5), Error);  // a piece must start a block
  bad.add("x", 0, 5);                       // (an empty piece adds nothing anywhere)
  EXPECT_EQ(bad.digest(), Digest{});
}

TEST(PatchParts, EveryCodingRoundTripsWithManyPartsAndTheSameBytesAtAnyThreadCount) {
  std::mt19937_64 rng(11);
  const State base = sample_state(rng);
  const State target = changed(rng, base, 0.05);
  const Digest origin = state_digest(refs(base));
  ChangeHistory history(refs(base), origin);
  std::vector<EncodeOptions> codings;
  for (ValueCoding v : {ValueCoding::raw, ValueCoding::keydiff})
    for (IndexCoding i : {IndexCoding::gap_fixed, IndexCoding::gap_varint})
      for (Compressor c : {Compressor::zstd, Compressor::lz4, Compressor::none}) {
        EncodeOptions o;
        o.values = v;
        o.indices = i;
        o.compressor = c;
        codings.push_back(o);
      }
  codings.push_back(exponent_class_options());
  codings.push_back(exponent_class_history_options(history));
  for (EncodeOptions options : codings) {
    const std::string what = std::string(value_coding_name(options.values)) + "/" + index_coding_name(options.indices) +
                             "/" + compressor_name(options.compressor);
    options.part_elements = 64;
    std::vector<std::uint8_t> bytes;
    for (unsigned threads : {1u, 2u, 3u}) {
      options.threads = threads;
      StateDigests after;
      const auto patch = encode_patch(refs(base), refs(target), options, nullptr, &after);
      if (bytes.empty()) bytes = patch;
      EXPECT_EQ(patch, bytes) << what << " at " << threads << " threads";
      EXPECT_EQ(after.state, state_digest(refs(target))) << what;
    }
    const ParsedPatch p = parse_patch(bytes.data(), bytes.size());
    EXPECT_GT(p.parts.size(), 20u) << what;  // 1000/64 + 300/32 + 500/128 + 1 segments, grouped up to 64 elements
    for (unsigned threads : {1u, 3u}) {
      State receiver = base;
      auto m = mutables(receiver);
      ChangeHistory receiver_history(refs(base), origin);
      const bool with_history = options.history != nullptr;
      StateDigests digests;
      apply_patch(p, m, {}, nullptr, &digests, {}, nullptr, with_history ? &receiver_history : nullptr, threads);
      for (std::size_t i = 0; i < base.size(); ++i) EXPECT_EQ(receiver[i].bytes, target[i].bytes) << what << " " << base[i].name;
      EXPECT_EQ(digests.state, state_digest(refs(target))) << what;
    }
    // The streamed decoder (next) decodes the same entries and digests.
    if (!options.history) {
      const auto base_refs = refs(base);
      PatchDecoder decoder(p, base_refs, true, nullptr, 2);
      for (std::size_t k = 0; k < decoder.size(); ++k) {
        const DecodedEntry e = decoder.next();
        if (e.touched()) EXPECT_EQ(e.digest, tensor_digest(refs(target)[e.tensor])) << what;
      }
      decoder.finish();
    }
  }
}

TEST(PatchParts, EncodeChangesWritesTheSameBytesAsEncodePatchWithManyParts) {
  std::mt19937_64 rng(3);
  const State base = sample_state(rng);
  const State target = changed(rng, base, 0.1);
  EncodeOptions options = exponent_class_options();
  options.part_elements = 100;
  std::vector<TensorChanges> changes;
  for (std::size_t i = 0; i < base.size(); ++i) {
    const std::size_t w = base[i].dtype == "F32" ? 4 : base[i].dtype == "F8_E4M3" ? 1 : 2;
    TensorChanges c{base[i].name, {}, {}};
    for (std::size_t e = 0; e < base[i].bytes.size() / w; ++e) {
      std::uint32_t bits = 0;
      std::memcpy(&bits, target[i].bytes.data() + e * w, w);
      if (std::memcmp(base[i].bytes.data() + e * w, target[i].bytes.data() + e * w, w) != 0) {
        c.indices.push_back(index_t(e));
        c.new_bits.push_back(bits);
      }
    }
    changes.push_back(c);
  }
  StateDigests a, b;
  const auto from_states = encode_patch(refs(base), refs(target), options, nullptr, &a);
  const auto from_changes = encode_changes(refs(base), changes, options, compute_digests(refs(base)), &b);
  EXPECT_EQ(from_changes, from_states);
  EXPECT_EQ(a.state, b.state);
  EXPECT_EQ(a.tensors, b.tensors);
}

TEST(PatchParts, CorruptPartTablesAreRefusedInOneLine) {
  std::mt19937_64 rng(5);
  const State base = sample_state(rng);
  const State target = changed(rng, base, 0.05);
  EncodeOptions options;
  options.part_elements = 64;
  const auto good = encode_patch(refs(base), refs(target), options);
  const ParsedPatch p = parse_patch(good.data(), good.size());
  // The part table is the tail of the tables: rewrite it from (altered) parts.
  auto with_parts = [&](const std::vector<PatchPart>& parts) {
    auto table = [](const std::vector<PatchPart>& ps) {
      std::vector<std::uint8_t> t;
      auto put = [&](std::uint64_t v) {
        for (; v >= 0x80; v >>= 7) t.push_back(std::uint8_t(v | 0x80));
        t.push_back(std::uint8_t(v));
      };
      put(ps.size());
      for (const PatchPart& q : ps) {
        // Tokens: (size, count) inside an entry; a run of segments ending entries as (0, k).
        std::vector<std::uint64_t> tokens;
        for (const PatchSegment& s : q.segments) {
          if (!s.ends_entry) tokens.insert(tokens.end(), {s.elements, s.count});
          else if (tokens.size() >= 2 && tokens[tokens.size() - 2] == 0) ++tokens.back();
          else tokens.insert(tokens.end(), {0, 1});
        }
        put(tokens.size() / 2);
        for (std::uint64_t v : tokens) put(v);
        for (std::uint64_t v : {q.index.coded, q.index.raw, q.value.coded, q.value.raw}) put(v);
      }
      return t;
    };
    const std::size_t entries = p.table_bytes - table(p.parts).size();
    std::vector<std::uint8_t> out(good.begin(), good.begin() + std::ptrdiff_t(patch_fixed_header_bytes + entries));
    const auto new_table = table(parts);
    out.insert(out.end(), new_table.begin(), new_table.end());
    const std::uint64_t size = entries + new_table.size();
    std::memcpy(out.data() + 128, &size, 8);
    out.insert(out.end(), good.begin() + std::ptrdiff_t(patch_fixed_header_bytes + p.table_bytes), good.end() - 16);
    const Digest d = digest_bytes(out.data(), out.size());
    out.insert(out.end(), d.begin(), d.end());
    return out;
  };
  ASSERT_EQ(with_parts(p.parts), good);
  std::vector<std::vector<PatchPart>> bad;
  auto altered = [&](auto change) {
    auto parts = p.parts;
    change(parts);
    bad.push_back(parts);
  };
  altered([](auto& ps) { ps[0].segments[0].elements += 1; });                  // crosses a block / the entry
  altered([](auto& ps) { ps[0].segments[0].elements -= 64; ps[0].segments[0].elements += 32; });  // not block-aligned after
  altered([](auto& ps) { ps[1].segments[0].count += 1; ps[2].segments[0].count -= ps[2].segments[0].count ? 1 : 0; });
  altered([](auto& ps) { ps.pop_back(); });                                     // parts end inside a tensor
  altered([](auto& ps) { ps.push_back(ps.back()); });                           // parts beyond the entries
  altered([](auto& ps) {  // sizes in the wrong parts
    std::size_t other = 1;
    while (ps[other].index.raw == ps[0].index.raw) ++other;
    std::swap(ps[0].index, ps[other].index);
  });
  altered([](auto& ps) { ps[0].segments.clear(); });                            // an empty part
  altered([](auto& ps) { ps[3].value.raw += 1; });                              // sums disagree with the header
  for (std::size_t b = 0; b < bad.size(); ++b) {
    const auto patch = with_parts(bad[b]);
    State receiver = base;
    auto m = mutables(receiver);
    try {
      const ParsedPatch q = parse_patch(patch.data(), patch.size());
      apply_patch(q, m);
      ADD_FAILURE() << "corruption " << b << " was applied";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
      EXPECT_FALSE(what.empty());
    }
    for (std::size_t i = 0; i < base.size(); ++i) EXPECT_EQ(receiver[i].bytes, base[i].bytes) << "corruption " << b;
  }
}

// As FSDP ranks: each of R senders holds a contiguous range of every tensor, encodes its
// ranges' parts alone; the parts, gathered tensor by tensor in rank order, make one patch.
TEST(PatchParts, PartsOfSlicesAssembleIntoThePatchOfTheWholeState) {
  std::mt19937_64 rng(13);
  const State base{random_tensor(rng, "a", "BF16", 4096), random_tensor(rng, "b", "F32", 1000),
                   random_tensor(rng, "c", "BF16", 640), random_tensor(rng, "d", "F8_E4M3", 1280)};
  const State target = changed(rng, base, 0.03);
  for (EncodeOptions options : {exponent_class_options(), EncodeOptions{}}) {
    options.part_elements = 256;
    const auto whole = encode_patch(refs(base), refs(target), options);
    const auto expected = decoded(whole, base, 2);
    for (std::size_t ranks : {1, 2, 4}) {
      std::vector<std::vector<SliceParts>> by_rank;
      for (std::size_t r = 0; r < ranks; ++r) {
        std::vector<TensorSlice> slices;
        for (std::size_t i = 0; i < base.size(); ++i) {
          const std::size_t w = base[i].dtype == "F32" ? 4 : base[i].dtype == "F8_E4M3" ? 1 : 2;
          const std::uint64_t n = base[i].bytes.size() / w, block = 128 / w;
          const std::uint64_t per_rank = (n / ranks + block - 1) / block * block;  // on 128-byte bounds
          const std::uint64_t begin = std::min(n, r * per_rank), end = std::min(n, begin + per_rank);
          const std::uint64_t stop = r + 1 == ranks ? n : end;
          slices.push_back({base[i].name, base[i].dtype, n, begin, stop, base[i].bytes.data() + w * begin,
                            target[i].bytes.data() + w * begin, nullptr});
        }
        by_rank.push_back(encode_slice_parts(slices, options));
      }
      std::vector<EncodedPart> parts;
      std::vector<Digest> target_digests;
      std::vector<TensorLayout> layout;
      for (std::size_t i = 0; i < base.size(); ++i) {
        BlockDigest sum;
        for (std::size_t r = 0; r < ranks; ++r) {
          for (const EncodedPart& part : by_rank[r][i].parts) parts.push_back(part);
          sum += by_rank[r][i].target;
        }
        target_digests.push_back(sum.digest());
        layout.push_back({base[i].name, base[i].dtype, base[i].shape});
        EXPECT_EQ(sum.digest(), tensor_digest(refs(target)[i])) << ranks << " ranks, " << base[i].name;
      }
      const Digest target_state = state_digest(refs(target), target_digests);
      EXPECT_EQ(target_state, state_digest(refs(target)));
      const auto assembled = assemble_patch(options, layout, state_digest(refs(base)), target_state, parts);
      EXPECT_EQ(decoded(assembled, base, 2), expected) << ranks << " ranks";
      State receiver = base;
      auto m = mutables(receiver);
      apply_patch(parse_patch(assembled.data(), assembled.size()), m);
      for (std::size_t i = 0; i < base.size(); ++i) EXPECT_EQ(receiver[i].bytes, target[i].bytes) << ranks << " ranks";
      if (ranks == 1 && options.part_elements >= 256) EXPECT_LE(assembled.size(), whole.size() + 64);
    }
  }
}

// The scan compares 64 bytes at a time in chunks of 65536 elements and codes some codings'
// changes as it finds them: changes at the edges of both, of any one byte of an element, in a
// dense run across a chunk's end, and tensors that end inside a window or a chunk give the
// bytes encode_changes writes from the same changes listed, in memory or read by loaders (in
// pieces of 1 MiB: tensor a).
TEST(PatchParts, TheScanFindsEveryChangeAtTheEdgesOfItsWindowsAndChunks) {
  std::mt19937_64 rng(17);
  constexpr std::size_t kChunk = 65536;
  const State base{random_tensor(rng, "a", "BF16", 9 * kChunk + 77), random_tensor(rng, "b", "F32", kChunk + 5),
                   random_tensor(rng, "c", "F8_E4M3", 3 * kChunk + 1), random_tensor(rng, "d", "BF16", 31),
                   random_tensor(rng, "e", "BF16", 4 * kChunk)};
  State target = base;
  std::vector<TensorChanges> listed;
  for (std::size_t i = 0; i + 1 < target.size(); ++i) {  // the last tensor stays equal
    const std::size_t w = element_width(target[i].dtype), n = target[i].bytes.size() / w;
    TensorChanges c{target[i].name, {}, {}};
    for (std::size_t e = 0; e < n; ++e) {
      const std::size_t in_window = e * w % 64, in_chunk = e % kChunk;
      const bool edge = in_window == 0 || in_window + w == 64 || in_chunk == 0 || in_chunk + 1 == kChunk || e + 1 == n;
      const bool run = e + 300 >= kChunk && e < kChunk + 300;
      if (!edge && !run && rng() % 50 != 0) continue;
      target[i].bytes[e * w + e / 3 % w] ^= std::byte(1 + rng() % 255);  // one byte: low, high or between
      std::uint32_t bits = 0;
      std::memcpy(&bits, target[i].bytes.data() + e * w, w);
      c.indices.push_back(index_t(e));
      c.new_bits.push_back(bits);
    }
    listed.push_back(c);
  }
  const auto loader = [](const State& s) {
    return TensorLoader([&s](std::size_t i, std::uint64_t offset, std::size_t bytes, std::byte* out) {
      std::memcpy(out, s[i].bytes.data() + offset, bytes);
    });
  };
  auto unloaded = [](const State& s) {
    std::vector<TensorRef> out = refs(s);
    for (TensorRef& t : out) t.data = nullptr;
    return out;
  };
  std::vector<EncodeOptions> codings{EncodeOptions{}, EncodeOptions{}, EncodeOptions{}, exponent_class_options()};
  codings[1].indices = IndexCoding::gap_fixed;
  codings[2].values = ValueCoding::raw;
  for (EncodeOptions options : codings)
    for (std::uint64_t part_elements : {std::uint64_t(1) << 24, std::uint64_t(40000)}) {
      const std::string what = std::string(value_coding_name(options.values)) + "/" + index_coding_name(options.indices) +
                               " in parts of " + std::to_string(part_elements);
      options.part_elements = part_elements;
      options.threads = 2;
      StateDigests a, b;
      const auto from_states = encode_patch(refs(base), refs(target), options, nullptr, &a);
      const auto from_changes = encode_changes(refs(base), listed, options, compute_digests(refs(base)), &b);
      EXPECT_EQ(from_states, from_changes) << what;
      EXPECT_EQ(a.state, b.state) << what;
      EXPECT_EQ(encode_patch(unloaded(base), unloaded(target), options, nullptr, nullptr, {}, {}, loader(base), loader(target)),
                from_states)
          << what;
      State receiver = base;
      auto m = mutables(receiver);
      apply_patch(parse_patch(from_states.data(), from_states.size()), m);
      for (std::size_t i = 0; i < base.size(); ++i) EXPECT_EQ(receiver[i].bytes, target[i].bytes) << what << " " << base[i].name;
    }
}
