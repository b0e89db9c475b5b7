#include "shard/sharded_receiver.hpp"

#include <algorithm>
#include <cstring>
#include <map>

#include "core/error.hpp"
#include "coding/compress.hpp"
#include "coding/parallel.hpp"
#include "sync/part_coding.hpp"
#include "sync/patch_table.hpp"
#include "shard/sharded_sums.hpp"
#include "sync/sparse_format.hpp"

namespace pulse::sync {

namespace {

// A run of a piece: elements [begin, end) of a tensor, at data.
struct Run {
  std::size_t tensor;
  std::uint64_t begin, end;
  std::byte* data;
};

// A segment of the patch placed in its tensor.
struct Segment {
  std::size_t tensor, part;
  std::uint64_t begin, elements, count;
};

// A change this rank writes: the element's place and its new value (then its old one).
struct Change {
  std::size_t run;
  std::uint64_t element;  // in the tensor
  std::uint8_t value[8];
};

// The runs of `tensor` (sorted by begin) that overlap [begin, end), as [first, last) indices.
std::pair<std::size_t, std::size_t> overlapping(const std::vector<Run>& runs, const std::vector<std::size_t>& first_run,
                                                std::size_t tensor, std::uint64_t begin, std::uint64_t end) {
  std::size_t lo = first_run[tensor], hi = first_run[tensor + 1];
  lo = std::size_t(std::partition_point(runs.begin() + std::ptrdiff_t(lo), runs.begin() + std::ptrdiff_t(hi),
                                        [&](const Run& r) { return r.end <= begin; }) - runs.begin());
  std::size_t last = lo;
  while (last < hi && runs[last].begin < end) ++last;
  return {lo, last};
}

}  // namespace

std::uint64_t apply_sharded(const Communicator& comm, const ParsedPatch& patch, const std::vector<TensorLayout>& layout,
                            const std::vector<ReceiverSlice>& slices, const Metadata& metadata, unsigned threads) {
  const PatchHeader& h = patch.header;
  std::vector<TensorLayout> sorted = layout;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  std::vector<PieceSums> sums(sorted.size());
  std::vector<Run> runs;
  std::vector<std::size_t> first_run(sorted.size() + 1, 0);
  std::vector<std::vector<Change>> changes;  // per part
  std::exception_ptr error;
  try {
    PULSE_CHECK(!h.changes_layout && !h.changes_metadata && patch.added.empty() && patch.removed.empty(),
                "sliced receivers apply patches that keep the layout and metadata; this one changes them");
    PULSE_CHECK(h.values != ValueCoding::exponent_class_history,
                "sliced receivers do not decode expclass-history patches (their history is the whole state's)");
    std::vector<TensorRef> refs;
    std::vector<std::uint64_t> target_bytes;
    std::map<std::string, std::size_t> index;
    for (std::size_t i = 0; i < sorted.size(); ++i) {
      const TensorLayout& t = sorted[i];
      target_bytes.push_back(patch_bytes::layout_bytes(t.name, t.dtype, t.shape));
      refs.push_back({t.name, t.dtype, t.shape, nullptr, std::size_t(target_bytes.back())});
      PULSE_CHECK(index.emplace(t.name, i).second, "sliced receiver: tensor '" + t.name + "' is in the layout twice");
    }
    PULSE_CHECK(layout_digest(refs) == h.base_layout, "receivers' layout (names, dtypes, shapes) is not the layout of "
                                                      "the patch's base version " + std::to_string(h.base_version));
    PULSE_CHECK(patch.entries.size() == sorted.size() &&
                    patch_bytes::summarize(sorted, target_bytes, patch.entries) == patch.summary,
                "patch entries disagree with the receivers' layout");

    // This rank's runs, by tensor then begin, without overlaps; their base digests.
    for (const ReceiverSlice& s : slices) {
      const auto it = index.find(s.name);
      PULSE_CHECK(it != index.end(), "sliced receiver: piece of tensor '" + s.name + "', which is not in the layout");
      const unsigned w = element_bytes(sorted[it->second]);
      for (const SliceRun& r : slice_runs(sorted[it->second], s.spec, s.row_stride))
        runs.push_back({it->second, r.begin, r.end, s.data + w * r.local});
    }
    std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) {
      return a.tensor != b.tensor ? a.tensor < b.tensor : a.begin < b.begin;
    });
    for (std::size_t k = 0; k < runs.size(); ++k) {
      const Run& r = runs[k];
      PULSE_CHECK(k == 0 || runs[k - 1].tensor != r.tensor || runs[k - 1].end <= r.begin,
                  "sliced receiver: this rank's pieces of tensor '" + sorted[r.tensor].name + "' overlap at element " +
                      std::to_string(r.begin));
      ++first_run[r.tensor + 1];
      const unsigned w = element_bytes(sorted[r.tensor]);
      sums[r.tensor].base.add(r.data, w * (r.end - r.begin), w * r.begin);
      sums[r.tensor].elements += r.end - r.begin;
    }
    for (std::size_t i = 0; i < sorted.size(); ++i) first_run[i + 1] += first_run[i];

    // The segments, walked as PatchDecoder walks them (tiling the sparse entries).
    std::vector<Segment> segments;
    std::size_t part = 0, segment = 0;
    for (std::size_t i = 0; i < sorted.size(); ++i) {
      const PatchEntry& e = patch.entries[i];
      PULSE_CHECK(e.kind != EntryKind::whole, "patch carries tensor '" + sorted[i].name +
                                                  "' whole; sliced receivers apply sparse changes only");
      if (e.kind != EntryKind::sparse) continue;
      const auto format = sparse_format(sorted[i].dtype);
      PULSE_CHECK(format.has_value(), "patch codes tensor '" + sorted[i].name + "' of " + sorted[i].dtype + " sparsely");
      const std::uint64_t n = element_count(sorted[i]);
      std::uint64_t covered = 0, count = 0;
      while (covered < n) {
        PULSE_CHECK(part < patch.parts.size(), "patch parts end inside tensor '" + sorted[i].name + "' (corrupt part table)");
        const PatchSegment& s = patch.parts[part].segments[segment];
        PULSE_CHECK(s.elements <= n - covered && (covered * format->bytes) % kDigestBlockBytes == 0,
                    "patch segment crosses the end of tensor '" + sorted[i].name + "' (corrupt part table)");
        segments.push_back({i, part, covered, s.elements, s.count});
        covered += s.elements;
        count += s.count;
        if (++segment == patch.parts[part].segments.size()) ++part, segment = 0;
      }
      PULSE_CHECK(count == e.count, "patch segments of tensor '" + sorted[i].name + "' do not add up to its changes");
    }
    PULSE_CHECK(part == patch.parts.size(), "patch has parts beyond its sparse entries (corrupt part table)");

    // The parts this rank needs: those with changes in its runs, decoded up to the last such
    // segment (a part's streams are read in order).
    const std::size_t parts = patch.parts.size();
    std::vector<std::size_t> part_first(parts + 1, segments.size()), part_last(parts, 0);
    std::vector<bool> needed(parts, false);
    for (std::size_t s = segments.size(); s-- > 0;) part_first[segments[s].part] = s;
    for (std::size_t s = 0; s < segments.size(); ++s) {
      const Segment& g = segments[s];
      const auto [lo, hi] = overlapping(runs, first_run, g.tensor, g.begin, g.begin + g.elements);
      if (g.count > 0 && lo < hi) needed[g.part] = true, part_last[g.part] = s + 1;
    }
    std::vector<std::uint64_t> index_at(parts + 1, 0), value_at(parts + 1, 0);
    for (std::size_t p = 0; p < parts; ++p) {
      index_at[p + 1] = index_at[p] + patch.parts[p].index.coded;
      value_at[p + 1] = value_at[p] + patch.parts[p].value.coded;
    }
    changes.resize(parts);
    parallel_for(resolve_threads(threads), parts, [&](std::size_t p) {
      if (!needed[p]) return;
      const PatchPart& pp = patch.parts[p];
      std::uint64_t total = 0, value_bytes = 0, value_max = 0, index_bytes = 0;
      for (std::size_t s = part_first[p]; s < segments.size() && segments[s].part == p; ++s) {
        const SparseFormat f = *sparse_format(sorted[segments[s].tensor].dtype);
        total += segments[s].count;
        value_bytes += segments[s].count * f.bytes;
        value_max += segments[s].count * f.max_varint_bytes();
        index_bytes += segments[s].count * patch.entries[segments[s].tensor].index_width;
      }
      // Declared sizes bounded by the layout before anything is allocated (as PatchDecoder).
      if (h.values == ValueCoding::raw) PULSE_CHECK(pp.value.raw == value_bytes, "patch value stream size disagrees with its entries");
      if (h.values == ValueCoding::keydiff) PULSE_CHECK(pp.value.raw <= value_max, "patch value stream size disagrees with its entries");
      if (h.indices == IndexCoding::gap_fixed) PULSE_CHECK(pp.index.raw == index_bytes, "patch index stream size disagrees with its entries");
      const auto index_raw = decompress(h.compressor, patch.index_stream + index_at[p], pp.index.coded, pp.index.raw);
      const auto value_raw = decompress(h.compressor, patch.value_stream + value_at[p], pp.value.coded, pp.value.raw);
      PartDecoder decoder(h.values, h.indices, index_raw, value_raw, total);
      std::vector<std::uint64_t> indices;
      std::vector<std::uint8_t> values, old;
      for (std::size_t s = part_first[p]; s < part_last[p]; ++s) {
        const Segment& g = segments[s];
        if (g.count == 0) continue;
        const TensorLayout& t = sorted[g.tensor];
        const SparseFormat f = *sparse_format(t.dtype);
        const std::uint64_t end = g.begin + g.elements;
        const auto [lo, hi] = overlapping(runs, first_run, g.tensor, g.begin, end);
        // The old values of the segment: in place when one run holds it, else gathered (zero
        // where this rank holds none: raw and keydiff read old values at changes only).
        const std::byte* old_data = nullptr;
        if (lo < hi && runs[lo].begin <= g.begin && runs[lo].end >= end) {
          old_data = runs[lo].data + f.bytes * (g.begin - runs[lo].begin);
        } else {
          std::uint64_t held = 0;
          old.assign(f.bytes * g.elements, 0);
          for (std::size_t r = lo; r < hi; ++r) {
            const std::uint64_t b = std::max(g.begin, runs[r].begin), e = std::min(end, runs[r].end);
            std::memcpy(old.data() + f.bytes * (b - g.begin), runs[r].data + f.bytes * (b - runs[r].begin), f.bytes * (e - b));
            held += e - b;
          }
          PULSE_CHECK(!is_exponent_class(h.values) || held == g.elements,
                      "expclass patch: this receiver holds " + std::to_string(held) + " of the " +
                          std::to_string(g.elements) + " elements of a segment of tensor '" + t.name +
                          "' it must decode; use keydiff patches for sliced receivers, or sender pieces that match theirs");
          old_data = reinterpret_cast<const std::byte*>(old.data());
        }
        indices.resize(g.count);
        values.resize(g.count * f.bytes);
        decoder.decode(f, old_data, g.elements, g.count, patch.entries[g.tensor].index_width, nullptr, indices.data(),
                       values.data(), " in tensor '" + t.name + "'");
        std::size_t r = lo;
        for (std::uint64_t c = 0; c < g.count; ++c) {
          const std::uint64_t element = g.begin + indices[c];
          while (r < hi && runs[r].end <= element) ++r;
          if (r == hi || runs[r].begin > element) continue;  // another rank's
          Change ch{r, element, {}};
          std::memcpy(ch.value, values.data() + f.bytes * c, f.bytes);
          changes[p].push_back(ch);
        }
      }
      if (part_last[p] == part_first[p + 1] || part_last[p] == segments.size()) decoder.check_consumed();
    });
  } catch (...) {
    error = std::current_exception();
  }
  agree(comm, error, "sliced apply");

  // Write: each touched block's digest taken off before and added after its changes.
  for (std::size_t i = 0; i < sorted.size(); ++i) sums[i].target = sums[i].base;
  std::uint64_t written = 0;
  auto swap_in = [&](Change& c, unsigned w) {
    std::byte* at = runs[c.run].data + w * (c.element - runs[c.run].begin);
    std::uint8_t old[8];
    std::memcpy(old, at, w);
    std::memcpy(at, c.value, w);
    std::memcpy(c.value, old, w);
  };
  for (auto& part_changes : changes)
    for (std::size_t k = 0; k < part_changes.size();) {
      const Run& run = runs[part_changes[k].run];
      const TensorLayout& t = sorted[run.tensor];
      const unsigned w = element_bytes(t);
      const std::uint64_t tensor_bytes = w * element_count(t);
      const std::uint64_t offset = w * part_changes[k].element / kDigestBlockBytes * kDigestBlockBytes;
      const std::size_t bytes = std::size_t(std::min<std::uint64_t>(kDigestBlockBytes, tensor_bytes - offset));
      const std::byte* block = run.data + (offset - w * run.begin);  // runs lie on the block grid
      sums[run.tensor].target.subtract(block, bytes, offset);
      for (; k < part_changes.size() && part_changes[k].run == std::size_t(&run - runs.data()) &&
             w * part_changes[k].element < offset + bytes;
           ++k, ++written)
        swap_in(part_changes[k], w);
      sums[run.tensor].target.add(block, bytes, offset);
    }
  auto roll_back = [&] {
    for (auto p = changes.rbegin(); p != changes.rend(); ++p)
      for (auto c = p->rbegin(); c != p->rend(); ++c) swap_in(*c, element_bytes(sorted[runs[c->run].tensor]));
  };

  sum_over_ranks(comm, sums, -1, Channel::patches);
  std::vector<Digest> base, target;
  std::vector<TensorRef> refs;
  try {
    for (std::size_t i = 0; i < sorted.size(); ++i) {
      const std::uint64_t n = element_count(sorted[i]);
      PULSE_CHECK(sums[i].elements == n, "the receivers' pieces of tensor '" + sorted[i].name + "' hold " +
                                             std::to_string(sums[i].elements) + " of its " + std::to_string(n) +
                                             " elements (each element must be held by exactly one receiver)");
      base.push_back(sums[i].base.digest());
      target.push_back(sums[i].target.digest());
      refs.push_back({sorted[i].name, sorted[i].dtype, sorted[i].shape, nullptr, 0});
    }
    PULSE_CHECK(state_digest(refs, base, metadata) == h.base_state,
                "the receivers' state is not the base version " + std::to_string(h.base_version) +
                    " of the patch (the digest of their pieces differs); every receiver kept its pieces");
    PULSE_CHECK(state_digest(refs, target, metadata) == h.target_state,
                "the receivers' pieces after the patch do not have its target digest (version " +
                    std::to_string(h.target_version) + "); every receiver kept its pieces");
  } catch (...) {
    roll_back();
    throw;
  }
  return written;
}

}  // namespace pulse::sync
