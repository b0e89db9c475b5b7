#include "shard/sharded_sender.hpp"

#include <algorithm>
#include <cstring>
#include <map>

#include "comm/collectives.hpp"
#include "core/error.hpp"
#include "shard/sharded_sums.hpp"
#include "sync/sparse_format.hpp"
#include "coding/varint.hpp"

namespace pulse::sync {

namespace {

// A part as root receives it: the tensor (in name order) and the element its segments begin at.
struct GatheredPart {
  std::uint64_t tensor = 0, begin = 0;
  EncodedPart part;
};

void put_part(std::vector<std::uint8_t>& out, std::uint64_t tensor, std::uint64_t begin, const EncodedPart& p) {
  put_varint(out, tensor);
  put_varint(out, begin);
  put_varint(out, p.part.segments.size());
  for (const PatchSegment& s : p.part.segments) {
    put_varint(out, s.elements);
    put_varint(out, s.count);
  }
  for (std::uint64_t v : {p.part.index.coded, p.part.index.raw, p.part.value.coded, p.part.value.raw}) put_varint(out, v);
  out.insert(out.end(), p.index_coded.begin(), p.index_coded.end());
  out.insert(out.end(), p.value_coded.begin(), p.value_coded.end());
}

std::vector<GatheredPart> get_parts(const std::vector<std::uint8_t>& in) {
  std::vector<GatheredPart> out;
  std::size_t pos = 0;
  auto bytes = [&](std::uint64_t n) {
    PULSE_CHECK(n <= in.size() - pos, "sharded encode: a rank's gathered parts are truncated");
    std::vector<std::uint8_t> b(in.begin() + std::ptrdiff_t(pos), in.begin() + std::ptrdiff_t(pos + n));
    pos += n;
    return b;
  };
  while (pos < in.size()) {
    GatheredPart g;
    g.tensor = get_varint(in.data(), in.size(), pos);
    g.begin = get_varint(in.data(), in.size(), pos);
    const std::uint64_t segments = get_varint(in.data(), in.size(), pos);
    PULSE_CHECK(segments <= in.size() - pos, "sharded encode: a rank's gathered parts are corrupt");
    for (std::uint64_t s = 0; s < segments; ++s) {
      PatchSegment seg;
      seg.elements = get_varint(in.data(), in.size(), pos);
      seg.count = get_varint(in.data(), in.size(), pos);
      g.part.part.segments.push_back(seg);
    }
    for (std::uint64_t* v : {&g.part.part.index.coded, &g.part.part.index.raw, &g.part.part.value.coded,
                             &g.part.part.value.raw})
      *v = get_varint(in.data(), in.size(), pos);
    g.part.index_coded = bytes(g.part.part.index.coded);
    g.part.value_coded = bytes(g.part.part.value.coded);
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace

std::vector<std::uint8_t> encode_sharded(const Communicator& comm, int root, const std::vector<TensorLayout>& layout,
                                         const std::vector<SenderSlice>& slices, const EncodeOptions& options,
                                         const Metadata& metadata, StateDigests* target_digests) {
  std::vector<TensorLayout> sorted = layout;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  std::vector<PieceSums> sums(sorted.size());
  std::vector<std::uint8_t> mine;  // this rank's coded parts
  std::exception_ptr error;
  try {
    PULSE_CHECK(root >= 0 && root < comm.size(), "sharded encode: root " + std::to_string(root) + " is not a rank");
    PULSE_CHECK(options.history == nullptr, "sharded senders do not code expclass-history (its history is the whole state's)");
    std::map<std::string, std::size_t> index;
    for (std::size_t i = 0; i < sorted.size(); ++i)
      PULSE_CHECK(index.emplace(sorted[i].name, i).second, "sharded encode: tensor '" + sorted[i].name + "' is in the layout twice");
    std::vector<TensorSlice> pieces;
    std::vector<std::size_t> piece_tensor;
    for (const SenderSlice& s : slices) {
      const auto it = index.find(s.name);
      PULSE_CHECK(it != index.end(), "sharded encode: piece of tensor '" + s.name + "', which is not in the layout");
      const TensorLayout& t = sorted[it->second];
      const unsigned w = element_bytes(t);
      const std::uint64_t n = element_count(t);
      for (const SliceRun& run : slice_runs(t, s.spec)) {
        const std::byte* base = s.base + w * run.local;
        const std::byte* target = s.target + w * run.local;
        if (sparse_format(t.dtype)) {
          pieces.push_back({t.name, t.dtype, n, run.begin, run.end, base, target, nullptr});
          piece_tensor.push_back(it->second);
        } else {
          const std::size_t bytes = w * (run.end - run.begin);
          PULSE_CHECK(std::memcmp(base, target, bytes) == 0,
                      "tensor '" + t.name + "' of " + t.dtype + " changed: sharded senders carry changes of sparse-coded dtypes only");
          sums[it->second].base.add(base, bytes, w * run.begin);
          sums[it->second].target.add(base, bytes, w * run.begin);
        }
        sums[it->second].elements += run.end - run.begin;
      }
    }
    std::vector<SliceParts> coded = encode_slice_parts(pieces, options);
    for (std::size_t k = 0; k < pieces.size(); ++k) {
      const std::size_t t = piece_tensor[k];
      sums[t].base += coded[k].base;
      sums[t].target += coded[k].target;
      std::uint64_t begin = pieces[k].begin;
      for (const EncodedPart& p : coded[k].parts) {
        put_part(mine, t, begin, p);
        for (const PatchSegment& s : p.part.segments) begin += s.elements;
      }
    }
  } catch (...) {
    error = std::current_exception();
  }
  agree(comm, error, "sharded encode");

  sum_over_ranks(comm, sums, root, Channel::patches);
  std::vector<std::uint8_t> gathered;
  const std::vector<index_t> offsets = gatherv(comm, mine.data(), mine.size(), gathered, root, Channel::patches);
  if (comm.rank() != root) return {};

  std::vector<GatheredPart> parts;
  for (int r = 0; r < comm.size(); ++r) {
    auto from = get_parts({gathered.begin() + offsets[r], gathered.begin() + offsets[r + 1]});
    for (auto& p : from) {
      PULSE_CHECK(p.tensor < sorted.size(), "sharded encode: rank " + std::to_string(r) + " sent a part of no tensor");
      parts.push_back(std::move(p));
    }
  }
  std::stable_sort(parts.begin(), parts.end(), [](const GatheredPart& a, const GatheredPart& b) {
    return a.tensor != b.tensor ? a.tensor < b.tensor : a.begin < b.begin;
  });
  // The pieces tile every tensor: the parts of a sparse-coded one follow each other without a
  // gap or an overlap; the elements held add up to each tensor's.
  std::vector<EncodedPart> in_order;
  std::size_t k = 0;
  std::vector<Digest> base_digests, target_digests_in_order;
  std::vector<TensorRef> refs;
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    const TensorLayout& t = sorted[i];
    const std::uint64_t n = element_count(t);
    PULSE_CHECK(sums[i].elements == n, "sharded encode: the ranks' pieces of tensor '" + t.name + "' hold " +
                                           std::to_string(sums[i].elements) + " of its " + std::to_string(n) +
                                           " elements (each element must be held by exactly one rank)");
    std::uint64_t covered = 0;
    for (; k < parts.size() && parts[k].tensor == i; ++k) {
      PULSE_CHECK(parts[k].begin == covered, "sharded encode: the ranks' pieces of tensor '" + t.name + "' " +
                                                 (parts[k].begin > covered ? "leave out" : "overlap at") + " element " +
                                                 std::to_string(std::min(covered, parts[k].begin)));
      for (const PatchSegment& s : parts[k].part.part.segments) covered += s.elements;
      in_order.push_back(std::move(parts[k].part));
    }
    PULSE_CHECK(!sparse_format(t.dtype) || covered == n,
                "sharded encode: the ranks' pieces of tensor '" + t.name + "' end at element " + std::to_string(covered) +
                    " of " + std::to_string(n));
    base_digests.push_back(sums[i].base.digest());
    target_digests_in_order.push_back(sums[i].target.digest());
    refs.push_back({t.name, t.dtype, t.shape, nullptr, std::size_t(element_bytes(t) * element_count(t))});
  }
  const Digest base_state = state_digest(refs, base_digests, metadata);
  const Digest target_state = state_digest(refs, target_digests_in_order, metadata);
  if (target_digests) {
    target_digests->tensors.clear();
    for (std::size_t i = 0; i < sorted.size(); ++i) target_digests->tensors[sorted[i].name] = target_digests_in_order[i];
    target_digests->state = target_state;
  }
  return assemble_patch(options, sorted, base_state, target_state, in_order);
}

}  // namespace pulse::sync
