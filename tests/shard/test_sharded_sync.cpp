// Sharded senders and resharding receivers over MPI (issue 26 item 3), at np 1, 2 and 4. Every
// rank builds the whole base and target states from one seed (the oracle) and takes its pieces
// of them: senders split by rows, by flat ranges of unequal sizes, or by columns; their gathered
// patch must decode to the unsharded patch's changes, and its MPI bytes stay near its size.
// Receivers split by rows (two tensors fused in one buffer), or by columns (in a padded buffer)
// apply it: each piece must equal the target's; a wrong base on one receiver, or an expclass
// patch a receiver cannot decode, leaves every piece as it was.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <iostream>
#include <random>

#include "comm/communicator.hpp"
#include "core/error.hpp"
#include "shard/sharded_receiver.hpp"
#include "shard/sharded_sender.hpp"
#include "support/owned_state.hpp"

using namespace pulse;
using namespace pulse::sync;

namespace {

using test::OwnedTensor;
using test::State;
using test::changed;
using test::decoded;
using test::element_width;
using test::refs;

std::vector<TensorLayout> layout_of(const State& s) {
  std::vector<TensorLayout> out;
  for (const auto& t : s) out.push_back(t.layout());
  return out;
}


OwnedTensor random_tensor(std::mt19937_64& rng, const std::string& name, const std::string& dtype,
                          std::vector<std::int64_t> shape) {
  std::size_t n = 1;
  for (auto d : shape) n *= std::size_t(d);
  const unsigned w = element_width(dtype);
  OwnedTensor t{name, dtype, shape, std::vector<std::byte>(n * w)};
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t bits = rng();
    if (dtype == "BF16") bits = (bits & 0x807F) | ((0x78 + bits % 6) << 7);  // a few exponents, as trained weights
    if (dtype == "F32") bits = (bits & 0x807FFFFF) | ((0x78 + (bits >> 8) % 6) << 23);
    std::memcpy(t.bytes.data() + i * w, &bits, w);
  }
  return t;
}

State small_state(std::mt19937_64& rng) {
  return {random_tensor(rng, "a.q", "BF16", {64, 256}), random_tensor(rng, "b.k", "BF16", {32, 256}),
          random_tensor(rng, "c.mlp", "F32", {48, 128}), random_tensor(rng, "d.norm", "BF16", {256}),
          random_tensor(rng, "e.steps", "I64", {16})};
}

std::uint64_t rows_of(const TensorLayout& t) { return t.shape.empty() ? 1 : std::uint64_t(t.shape[0]); }
std::uint64_t numel(const TensorLayout& t) {
  std::uint64_t n = 1;
  for (auto d : t.shape) n *= std::uint64_t(d);
  return n;
}

// [begin, end) of rank r among p over `units` units, each `grid` units aligned (weights r + 1
// when skewed, so the ranges differ in size); the last rank takes the rest.
std::pair<std::uint64_t, std::uint64_t> split(std::uint64_t units, std::uint64_t grid, int p, int r, bool skewed) {
  auto at = [&](int k) -> std::uint64_t {
    if (k >= p) return units;
    const std::uint64_t weight = skewed ? std::uint64_t(k) * (k + 1) / 2 : std::uint64_t(k);
    const std::uint64_t total = skewed ? std::uint64_t(p) * (p + 1) / 2 : std::uint64_t(p);
    return std::min(units, units * weight / total / grid * grid);
  };
  return {at(r), at(r + 1)};
}

enum class Split { rows, flat, columns };
const char* split_name(Split s) { return s == Split::rows ? "rows" : s == Split::flat ? "flat" : "columns"; }

// Rank r's piece of tensor t: columns of 2-D tensors (Split::columns), else rows or flat ranges.
SliceSpec piece(const TensorLayout& t, Split s, int p, int r) {
  const unsigned w = element_width(t.dtype);
  const std::uint64_t n = numel(t), rows = rows_of(t), cols = n / rows;
  if (s == Split::columns && t.shape.size() == 2) {
    const auto [b, e] = split(cols, 128 / w, p, r, false);
    return SliceSpec::columns(b, e);
  }
  if (s == Split::flat) {
    const auto [b, e] = split(n, 128 / w, p, r, true);
    return SliceSpec::elements(b, e);
  }
  const std::uint64_t grid = std::max<std::uint64_t>(1, 128 / w / cols);
  const auto [b, e] = split(rows, grid, p, r, false);
  return SliceSpec::rows(b, e);
}

// A piece's elements copied out of a whole tensor, row by row at `stride` (0: its width).
std::vector<std::byte> copy_piece(const OwnedTensor& t, const SliceSpec& spec, std::uint64_t stride = 0) {
  const unsigned w = element_width(t.dtype);
  std::vector<std::byte> out;
  for (const SliceRun& run : slice_runs(t.layout(), spec, stride)) {
    out.resize(std::max<std::size_t>(out.size(), w * (run.local + run.end - run.begin)));
    std::memcpy(out.data() + w * run.local, t.bytes.data() + w * run.begin, w * (run.end - run.begin));
  }
  return out;
}


std::vector<std::uint8_t> sharded_patch(const Communicator& comm, const State& base, const State& target, Split s,
                                        const EncodeOptions& options) {
  std::vector<std::vector<std::byte>> keep;
  std::vector<SenderSlice> slices;
  for (std::size_t i = 0; i < base.size(); ++i) {
    const SliceSpec spec = piece(base[i].layout(), s, comm.size(), comm.rank());
    keep.push_back(copy_piece(base[i], spec));
    keep.push_back(copy_piece(target[i], spec));
    slices.push_back({base[i].name, spec, keep[keep.size() - 2].data(), keep.back().data()});
  }
  auto patch = encode_sharded(comm, 0, layout_of(base), slices, options);
  // Every rank gets the root's patch (as from a relay).
  std::uint64_t size = patch.size();
  MPI_Bcast(&size, 1, MPI_UINT64_T, 0, comm.raw());
  patch.resize(size);
  MPI_Bcast(patch.data(), int(size), MPI_BYTE, 0, comm.raw());
  return patch;
}

// A receiver's pieces: by rows (a.q and b.k fused in one buffer, as qkv) or by columns (each
// 2-D piece in a buffer padded by 64 elements a row).
struct Receiver {
  std::vector<std::vector<std::byte>> buffers;
  std::vector<ReceiverSlice> slices;
  std::vector<std::vector<std::byte>> expected;  // each slice's bytes as the target has them
  std::vector<std::size_t> buffer_of;
};

Receiver receiver(const Communicator& comm, const State& base, const State& target, Split s) {
  Receiver r;
  const int p = comm.size(), rank = comm.rank();
  if (s == Split::rows) {
    // a.q rows then b.k rows in one buffer of 256 columns.
    const SliceSpec qa = piece(base[0].layout(), s, p, rank), kb = piece(base[1].layout(), s, p, rank);
    auto q = copy_piece(base[0], qa), k = copy_piece(base[1], kb);
    std::vector<std::byte> fused(q);
    fused.insert(fused.end(), k.begin(), k.end());
    r.buffers.push_back(fused);
    r.slices.push_back({"a.q", qa, nullptr, 0});
    r.slices.push_back({"b.k", kb, nullptr, 0});
    r.expected.push_back(copy_piece(target[0], qa));
    r.expected.push_back(copy_piece(target[1], kb));
    r.buffer_of = {0, 0};
    const std::size_t q_bytes = q.size();
    for (std::size_t i = 2; i < base.size(); ++i) {
      const SliceSpec spec = piece(base[i].layout(), s, p, rank);
      r.buffers.push_back(copy_piece(base[i], spec));
      r.slices.push_back({base[i].name, spec, nullptr, 0});
      r.expected.push_back(copy_piece(target[i], spec));
      r.buffer_of.push_back(r.buffers.size() - 1);
    }
    r.slices[0].data = r.buffers[0].data();
    r.slices[1].data = r.buffers[0].data() + q_bytes;
    for (std::size_t i = 2; i < r.slices.size(); ++i) r.slices[i].data = r.buffers[r.buffer_of[i]].data();
    return r;
  }
  for (std::size_t i = 0; i < base.size(); ++i) {
    const SliceSpec spec = piece(base[i].layout(), s, p, rank);
    const std::uint64_t stride = spec.kind == SliceSpec::Kind::columns ? spec.end - spec.begin + 64 : 0;
    r.buffers.push_back(copy_piece(base[i], spec, stride));
    r.slices.push_back({base[i].name, spec, r.buffers.back().data(), stride});
    r.expected.push_back(copy_piece(target[i], spec, stride));
    r.buffer_of.push_back(i);
  }
  for (std::size_t i = 0; i < r.slices.size(); ++i) r.slices[i].data = r.buffers[i].data();
  return r;
}

// Each slice's bytes in the receiver's buffers (the padding of column buffers aside).
std::vector<std::byte> slice_bytes(const Receiver& r, std::size_t i, const State& s) {
  std::size_t k = 0;
  while (s[k].name != r.slices[i].name) ++k;
  const unsigned w = element_width(s[k].dtype);
  std::vector<std::byte> out(r.expected[i].size(), std::byte{0});
  for (const SliceRun& run : slice_runs(s[k].layout(), r.slices[i].spec, r.slices[i].row_stride))
    std::memcpy(out.data() + w * run.local, r.slices[i].data + w * run.local, w * (run.end - run.begin));
  return out;
}

std::vector<EncodeOptions> codings() {
  EncodeOptions keydiff, raw, expclass = exponent_class_options();
  raw.values = ValueCoding::raw;
  raw.compressor = Compressor::lz4;
  for (EncodeOptions* o : {&keydiff, &raw, &expclass}) o->part_elements = 1024;
  return {keydiff, raw, expclass};
}

}  // namespace

TEST(ShardedSync, SendersOfEverySplitMakeThePatchOfTheWholeState) {
  const Communicator comm;
  std::mt19937_64 rng(21);
  const State base = small_state(rng);
  const State target = changed(rng, base, 0.03);
  for (const EncodeOptions& options : codings()) {
    const auto whole = encode_patch(refs(base), refs(target), options);
    const auto expected = decoded(whole, base, 1);
    for (Split s : {Split::rows, Split::flat, Split::columns}) {
      const std::string what = std::string(value_coding_name(options.values)) + ", senders by " + split_name(s);
      StateDigests digests;
      const auto patch = sharded_patch(comm, base, target, s, options);
      EXPECT_EQ(decoded(patch, base, 1), expected) << what;
      const ParsedPatch parsed = parse_patch(patch.data(), patch.size());
      EXPECT_EQ(parsed.header.base_state, state_digest(refs(base))) << what;
      EXPECT_EQ(parsed.header.target_state, state_digest(refs(target))) << what;
    }
  }
}

TEST(ShardedSync, ReceiversOfEverySplitApplyTheirPiecesOfThePatch) {
  const Communicator comm;
  std::mt19937_64 rng(22);
  const State base = small_state(rng);
  const State target = changed(rng, base, 0.03);
  for (const EncodeOptions& options : codings()) {
    for (Split sender : {Split::rows, Split::flat}) {
      const auto patch = sharded_patch(comm, base, target, sender, options);
      const ParsedPatch parsed = parse_patch(patch.data(), patch.size());
      for (Split s : {Split::rows, Split::columns}) {
        const std::string what = std::string(value_coding_name(options.values)) + ", senders by " +
                                 split_name(sender) + ", receivers by " + split_name(s);
        Receiver r = receiver(comm, base, target, s);
        // expclass decodes whole segments: a receiver holding part of one refuses (all ranks do).
        const bool whole_segments = !is_exponent_class(options.values) || comm.size() == 1 || s == sender;
        if (whole_segments) {
          EXPECT_NO_THROW(apply_sharded(comm, parsed, layout_of(base), r.slices, {}, 2)) << what;
          for (std::size_t i = 0; i < r.slices.size(); ++i)
            EXPECT_EQ(slice_bytes(r, i, base), r.expected[i]) << what << ", " << r.slices[i].name;
        } else {
          const Receiver before = receiver(comm, base, target, s);
          try {
            apply_sharded(comm, parsed, layout_of(base), r.slices, {}, 2);
            ADD_FAILURE() << what << " was applied";
          } catch (const Error& e) {
            EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
          }
          EXPECT_EQ(r.buffers, before.buffers) << what;
        }
      }
    }
  }
}

TEST(ShardedSync, AWrongBaseOnOneReceiverRollsBackEveryReceiver) {
  const Communicator comm;
  std::mt19937_64 rng(23);
  const State base = small_state(rng);
  const State target = changed(rng, base, 0.03);
  const auto patch = sharded_patch(comm, base, target, Split::rows, EncodeOptions{});
  const ParsedPatch parsed = parse_patch(patch.data(), patch.size());
  for (Split s : {Split::rows, Split::columns}) {
    Receiver r = receiver(comm, base, target, s);
    if (comm.rank() == comm.size() - 1) r.slices[2].data[0] ^= std::byte{1};  // c.mlp differs from the base
    const auto before = r.buffers;
    try {
      apply_sharded(comm, parsed, layout_of(base), r.slices);
      ADD_FAILURE() << "a wrong base was applied";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("not the base version"), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos);
    }
    EXPECT_EQ(r.buffers, before) << split_name(s);
  }
}

TEST(ShardedSync, PiecesOffTheDigestGridOrNotTilingAreRefusedOnEveryRank) {
  const Communicator comm;
  std::mt19937_64 rng(24);
  const State base = small_state(rng);
  const auto layout = layout_of(base);
  // 10 BF16 elements are 20 bytes: off the 128-byte grid.
  EXPECT_THROW(slice_runs(layout[0], SliceSpec::elements(10, 64)), Error);
  EXPECT_THROW(slice_runs(layout[0], SliceSpec::columns(0, 100)), Error);
  EXPECT_THROW(slice_runs(layout[0], SliceSpec::rows(0, 65)), Error);  // outside
  EXPECT_NO_THROW(slice_runs(layout[3], SliceSpec::elements(64, 256)));  // ends at the tensor's end
  std::vector<SenderSlice> slices;
  for (const auto& t : base) {
    const bool bad = comm.rank() == comm.size() - 1 && t.name == "a.q";
    slices.push_back({t.name, bad ? SliceSpec::elements(1, 64) : SliceSpec::elements(0, 0), t.bytes.data(),
                      t.bytes.data()});
  }
  try {
    encode_sharded(comm, 0, layout, slices, EncodeOptions{});
    ADD_FAILURE() << "an off-grid piece was encoded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(comm.rank() == comm.size() - 1 ? "128-byte digest grid" : "refused"),
              std::string::npos)
        << e.what();
  }
  // Pieces that do not tile a tensor (every rank holds the first half of a.q) are refused on root.
  slices.clear();
  for (const auto& t : base)
    slices.push_back({t.name, SliceSpec::elements(0, comm.rank() == 0 ? numel(t.layout()) : 0), t.bytes.data(),
                      t.bytes.data()});
  if (comm.size() > 1) slices[0].spec = SliceSpec::elements(0, 8192);  // a.q: half on root, nothing elsewhere
  if (comm.size() > 1 && comm.rank() == 0) EXPECT_THROW(encode_sharded(comm, 0, layout, slices, EncodeOptions{}), Error);
  else EXPECT_NO_THROW(encode_sharded(comm, 0, layout, slices, EncodeOptions{}));
}

// The bytes the root gathers against the patch it writes, on a layout large enough that the
// changes dominate (8 tensors of 512 x 1024 BF16, 1% changed).
TEST(ShardedSync, GatheredBytesStayWithinATenthOfThePatchSize) {
  const Communicator comm;
  std::mt19937_64 rng(25);
  State base;
  for (int i = 0; i < 8; ++i) base.push_back(random_tensor(rng, "layer" + std::to_string(i), "BF16", {512, 1024}));
  const State target = changed(rng, base, 0.01);
  for (EncodeOptions options : {EncodeOptions{}, exponent_class_options()}) {
    const auto whole = encode_patch(refs(base), refs(target), options);
    for (Split s : {Split::rows, Split::flat, Split::columns}) {
      std::vector<std::vector<std::byte>> keep;
      std::vector<SenderSlice> slices;
      for (const auto& t : base) {
        const SliceSpec spec = piece(t.layout(), s, comm.size(), comm.rank());
        keep.push_back(copy_piece(t, spec));
        keep.push_back(copy_piece(target[&t - base.data()], spec));
        slices.push_back({t.name, spec, keep[keep.size() - 2].data(), keep.back().data()});
      }
      Communicator counted(comm.raw());
      const auto patch = encode_sharded(counted, 0, layout_of(base), slices, options);
      const std::uint64_t received = counted.bytes_received(Channel::patches);
      std::uint64_t sent = counted.bytes_sent(Channel::patches), all_sent = 0;
      MPI_Allreduce(&sent, &all_sent, 1, MPI_UINT64_T, MPI_SUM, comm.raw());
      if (comm.rank() != 0) continue;
      EXPECT_EQ(received, all_sent);
      EXPECT_LE(double(received), 1.1 * double(patch.size()));
      // Row and flat pieces cost a few parts more than the unsharded patch; column pieces a part
      // per row (documented), so only they may exceed it.
      if (s != Split::columns) EXPECT_LE(double(received), 1.1 * double(whole.size()));
      std::cout << "np " << comm.size() << " " << value_coding_name(options.values) << " senders by " << split_name(s)
                << ": gathered " << received << " bytes, sharded patch " << patch.size() << " bytes, unsharded patch "
                << whole.size() << " bytes (gathered/patch " << double(received) / double(patch.size()) << ")\n";
    }
  }
}
