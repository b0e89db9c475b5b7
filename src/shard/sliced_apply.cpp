#include "shard/sliced_apply.hpp"

#include <algorithm>
#include <cstring>
#include <map>

#include "core/error.hpp"
#include "coding/compress.hpp"
#include "coding/parallel.hpp"
#include "sync/part_coding.hpp"
#include "sync/patch_table.hpp"
#include "sync/sparse_format.hpp"

namespace pulse::sync {

namespace {

// A segment of the patch placed in its tensor.
struct Segment {
  std::size_t tensor, part;
  std::uint64_t begin, elements, count;
};

// The runs of `tensor` (sorted by begin) that overlap [begin, end), as [first, last) indices.
template <class Runs>
std::pair<std::size_t, std::size_t> overlapping(const Runs& runs, const std::vector<std::size_t>& first_run,
                                                std::size_t tensor, std::uint64_t begin, std::uint64_t end) {
  std::size_t lo = first_run[tensor], hi = first_run[tensor + 1];
  lo = std::size_t(std::partition_point(runs.begin() + std::ptrdiff_t(lo), runs.begin() + std::ptrdiff_t(hi),
                                        [&](const auto& r) { return r.end <= begin; }) - runs.begin());
  std::size_t last = lo;
  while (last < hi && runs[last].begin < end) ++last;
  return {lo, last};
}

// A 128-bit sum as 4 limbs of 32 bits, least significant first (Digest is big-endian).
void put_limbs(std::int64_t* out, const BlockDigest& b) {
  const Digest d = b.digest();
  for (int k = 0; k < 4; ++k) {
    std::uint32_t limb = 0;
    for (int j = 0; j < 4; ++j) limb = limb << 8 | d[std::size_t(12 - 4 * k + j)];
    out[k] = limb;
  }
}

// Limbs summed over ranks (each < 2^63) folded into a sum modulo 2^(32 * n): carries go up.
std::vector<std::uint32_t> fold(const std::int64_t* in, int n) {
  std::vector<std::uint32_t> out(std::size_t(n), 0);
  std::uint64_t carry = 0;
  for (int k = 0; k < n; ++k) {
    PULSE_CHECK(in[k] >= 0, "sliced receiver: a summed limb is negative (not a SUM all-reduce of partial)");
    const std::uint64_t t = std::uint64_t(in[k]) + carry;  // < 2^63 + 2^31
    out[std::size_t(k)] = std::uint32_t(t);
    carry = t >> 32;
  }
  return out;
}

BlockDigest digest_of_limbs(const std::int64_t* in) {
  const std::vector<std::uint32_t> limbs = fold(in, 4);
  Digest d;
  for (int k = 0; k < 4; ++k)
    for (int j = 0; j < 4; ++j) d[std::size_t(12 - 4 * k + j)] = std::uint8_t(limbs[std::size_t(k)] >> (24 - 8 * j));
  return BlockDigest::of(d);
}

}  // namespace

SlicedApply::SlicedApply(const ParsedPatch& patch, const std::vector<TensorLayout>& layout,
                         const std::vector<ReceiverSlice>& slices, const Metadata& metadata, unsigned threads)
    : header_(patch.header), metadata_(metadata), sorted_(layout) {
  std::sort(sorted_.begin(), sorted_.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  sums_.resize(sorted_.size());
  first_run_.assign(sorted_.size() + 1, 0);
  decode(patch, slices, threads);
  write();
}

void SlicedApply::decode(const ParsedPatch& patch, const std::vector<ReceiverSlice>& slices, unsigned threads) {
  const PatchHeader& h = patch.header;
  PULSE_CHECK(!h.changes_layout && !h.changes_metadata && patch.added.empty() && patch.removed.empty(),
              "sliced receivers apply patches that keep the layout and metadata; this one changes them");
  PULSE_CHECK(h.values != ValueCoding::exponent_class_history,
              "sliced receivers do not decode expclass-history patches (their history is the whole state's)");
  std::vector<TensorRef> refs;
  std::vector<std::uint64_t> target_bytes;
  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < sorted_.size(); ++i) {
    const TensorLayout& t = sorted_[i];
    target_bytes.push_back(patch_bytes::layout_bytes(t.name, t.dtype, t.shape));
    refs.push_back({t.name, t.dtype, t.shape, nullptr, std::size_t(target_bytes.back())});
    PULSE_CHECK(index.emplace(t.name, i).second, "sliced receiver: tensor '" + t.name + "' is in the layout twice");
  }
  PULSE_CHECK(layout_digest(refs) == h.base_layout, "receivers' layout (names, dtypes, shapes) is not the layout of "
                                                    "the patch's base version " + std::to_string(h.base_version));
  PULSE_CHECK(patch.entries.size() == sorted_.size() &&
                  patch_bytes::summarize(sorted_, target_bytes, patch.entries) == patch.summary,
              "patch entries disagree with the receivers' layout");

  // This rank's runs, by tensor then begin, without overlaps; their base digests.
  for (const ReceiverSlice& s : slices) {
    const auto it = index.find(s.name);
    PULSE_CHECK(it != index.end(), "sliced receiver: piece of tensor '" + s.name + "', which is not in the layout");
    const unsigned w = element_bytes(sorted_[it->second]);
    for (const SliceRun& r : slice_runs(sorted_[it->second], s.spec, s.row_stride))
      runs_.push_back({it->second, r.begin, r.end, s.data + w * r.local});
  }
  std::sort(runs_.begin(), runs_.end(), [](const Run& a, const Run& b) {
    return a.tensor != b.tensor ? a.tensor < b.tensor : a.begin < b.begin;
  });
  for (std::size_t k = 0; k < runs_.size(); ++k) {
    const Run& r = runs_[k];
    PULSE_CHECK(k == 0 || runs_[k - 1].tensor != r.tensor || runs_[k - 1].end <= r.begin,
                "sliced receiver: this rank's pieces of tensor '" + sorted_[r.tensor].name + "' overlap at element " +
                    std::to_string(r.begin));
    ++first_run_[r.tensor + 1];
    const unsigned w = element_bytes(sorted_[r.tensor]);
    sums_[r.tensor].base.add(r.data, w * (r.end - r.begin), w * r.begin);
    sums_[r.tensor].elements += r.end - r.begin;
  }
  for (std::size_t i = 0; i < sorted_.size(); ++i) first_run_[i + 1] += first_run_[i];

  // The segments, walked as PatchDecoder walks them (tiling the sparse entries).
  std::vector<Segment> segments;
  std::size_t part = 0, segment = 0;
  for (std::size_t i = 0; i < sorted_.size(); ++i) {
    const PatchEntry& e = patch.entries[i];
    PULSE_CHECK(e.kind != EntryKind::whole, "patch carries tensor '" + sorted_[i].name +
                                                "' whole; sliced receivers apply sparse changes only");
    if (e.kind != EntryKind::sparse) continue;
    const auto format = sparse_format(sorted_[i].dtype);
    PULSE_CHECK(format.has_value(), "patch codes tensor '" + sorted_[i].name + "' of " + sorted_[i].dtype + " sparsely");
    const std::uint64_t n = element_count(sorted_[i]);
    std::uint64_t covered = 0, count = 0;
    for (bool ended = false; !ended;) {  // the entry's segments, up to the one that ends it
      PULSE_CHECK(part < patch.parts.size(), "patch parts end inside tensor '" + sorted_[i].name + "' (corrupt part table)");
      const PatchSegment& s = patch.parts[part].segments[segment];
      ended = s.ends_entry;
      const std::uint64_t elements = ended ? n - covered : s.elements;
      PULSE_CHECK((ended || elements < n - covered) && s.count <= elements &&
                      (covered * format->bytes) % kDigestBlockBytes == 0,
                  "patch segment crosses the end of tensor '" + sorted_[i].name + "' (corrupt part table)");
      if (elements > 0) segments.push_back({i, part, covered, elements, s.count});
      covered += elements;
      count += s.count;
      if (++segment == patch.parts[part].segments.size()) ++part, segment = 0;
    }
    PULSE_CHECK(count == e.count, "patch segments of tensor '" + sorted_[i].name + "' do not add up to its changes");
  }
  PULSE_CHECK(part == patch.parts.size(), "patch has parts beyond its sparse entries (corrupt part table)");

  // The parts this rank needs: those with changes in its runs_, decoded up to the last such
  // segment (a part's streams are read in order).
  const std::size_t parts = patch.parts.size();
  std::vector<std::size_t> part_first(parts + 1, segments.size()), part_last(parts, 0);
  std::vector<bool> needed(parts, false);
  for (std::size_t s = segments.size(); s-- > 0;) part_first[segments[s].part] = s;
  for (std::size_t s = 0; s < segments.size(); ++s) {
    const Segment& g = segments[s];
    const auto [lo, hi] = overlapping(runs_, first_run_, g.tensor, g.begin, g.begin + g.elements);
    if (g.count > 0 && lo < hi) needed[g.part] = true, part_last[g.part] = s + 1;
  }
  std::vector<std::uint64_t> index_at(parts + 1, 0), value_at(parts + 1, 0);
  for (std::size_t p = 0; p < parts; ++p) {
    index_at[p + 1] = index_at[p] + patch.parts[p].index.coded;
    value_at[p + 1] = value_at[p] + patch.parts[p].value.coded;
  }
  changes_.resize(parts);
  parallel_for(resolve_threads(threads), parts, [&](std::size_t p) {
    if (!needed[p]) return;
    const PatchPart& pp = patch.parts[p];
    std::uint64_t total = 0, value_bytes = 0, value_max = 0, index_bytes = 0;
    for (std::size_t s = part_first[p]; s < segments.size() && segments[s].part == p; ++s) {
      const SparseFormat f = *sparse_format(sorted_[segments[s].tensor].dtype);
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
      const TensorLayout& t = sorted_[g.tensor];
      const SparseFormat f = *sparse_format(t.dtype);
      const std::uint64_t end = g.begin + g.elements;
      const auto [lo, hi] = overlapping(runs_, first_run_, g.tensor, g.begin, end);
      // The old values of the segment: in place when one run holds it, else gathered (zero
      // where this rank holds none: raw and keydiff read old values at changes only).
      const std::byte* old_data = nullptr;
      if (lo < hi && runs_[lo].begin <= g.begin && runs_[lo].end >= end) {
        old_data = runs_[lo].data + f.bytes * (g.begin - runs_[lo].begin);
      } else {
        std::uint64_t held = 0;
        old.assign(f.bytes * g.elements, 0);
        for (std::size_t r = lo; r < hi; ++r) {
          const std::uint64_t b = std::max(g.begin, runs_[r].begin), e = std::min(end, runs_[r].end);
          std::memcpy(old.data() + f.bytes * (b - g.begin), runs_[r].data + f.bytes * (b - runs_[r].begin), f.bytes * (e - b));
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
        while (r < hi && runs_[r].end <= element) ++r;
        if (r == hi || runs_[r].begin > element) continue;  // another rank's
        Change ch{r, element, {}};
        std::memcpy(ch.value, values.data() + f.bytes * c, f.bytes);
        changes_[p].push_back(ch);
      }
    }
    if (part_last[p] == part_first[p + 1] || part_last[p] == segments.size()) decoder.check_consumed();
  });
}

void SlicedApply::swap_in(Change& c) {
  const unsigned w = element_bytes(sorted_[runs_[c.run].tensor]);
  std::byte* at = runs_[c.run].data + w * (c.element - runs_[c.run].begin);
  std::uint8_t old[8];
  std::memcpy(old, at, w);
  std::memcpy(at, c.value, w);
  std::memcpy(c.value, old, w);
}

// Each touched block's digest taken off before and added after its changes.
void SlicedApply::write() {
  for (auto& s : sums_) s.target = s.base;
  for (auto& part_changes : changes_)
    for (std::size_t k = 0; k < part_changes.size();) {
      const std::size_t run_index = part_changes[k].run;
      const Run& run = runs_[run_index];
      const TensorLayout& t = sorted_[run.tensor];
      const unsigned w = element_bytes(t);
      const std::uint64_t tensor_bytes = w * element_count(t);
      const std::uint64_t offset = w * part_changes[k].element / kDigestBlockBytes * kDigestBlockBytes;
      const std::size_t bytes = std::size_t(std::min<std::uint64_t>(kDigestBlockBytes, tensor_bytes - offset));
      const std::byte* block = run.data + (offset - w * run.begin);  // runs lie on the block grid
      sums_[run.tensor].target.subtract(block, bytes, offset);
      for (; k < part_changes.size() && part_changes[k].run == run_index && w * part_changes[k].element < offset + bytes;
           ++k, ++written_)
        swap_in(part_changes[k]);
      sums_[run.tensor].target.add(block, bytes, offset);
    }
}

void SlicedApply::rollback() {
  PULSE_CHECK(!finished_, "sliced receiver: the patch was finished; there is nothing to roll back");
  for (auto p = changes_.rbegin(); p != changes_.rend(); ++p)
    for (auto c = p->rbegin(); c != p->rend(); ++c) swap_in(*c);
  changes_.clear();
  written_ = 0;
}

std::vector<std::int64_t> SlicedApply::partial() const {
  std::vector<std::int64_t> out(1 + kWordsPerTensor * sums_.size(), 0);
  for (std::size_t i = 0; i < sums_.size(); ++i) {
    std::int64_t* p = out.data() + 1 + kWordsPerTensor * i;
    put_limbs(p, sums_[i].base);
    put_limbs(p + 4, sums_[i].target);
    p[8] = std::int64_t(sums_[i].elements & 0xffffffffu);
    p[9] = std::int64_t(sums_[i].elements >> 32);
  }
  return out;
}

std::vector<std::int64_t> SlicedApply::failed_partial(std::size_t tensors) {
  std::vector<std::int64_t> out(1 + kWordsPerTensor * tensors, 0);
  out[0] = 1;
  return out;
}

void SlicedApply::finish(const std::vector<std::int64_t>& summed) {
  PULSE_CHECK(!finished_, "sliced receiver: the patch was finished already");
  try {
    PULSE_CHECK(summed.size() == 1 + kWordsPerTensor * sums_.size(),
                "sliced receiver: the summed partial has " + std::to_string(summed.size()) + " words, not " +
                    std::to_string(1 + kWordsPerTensor * sums_.size()) + "; every receiver kept its pieces");
    PULSE_CHECK(summed[0] == 0, std::to_string(summed[0]) + " receiver(s) refused the patch (see their errors); "
                                "every receiver kept its pieces");
    std::vector<PieceSums> sums(sums_.size());
    for (std::size_t i = 0; i < sums.size(); ++i) {
      const std::int64_t* p = summed.data() + 1 + kWordsPerTensor * i;
      sums[i].base = digest_of_limbs(p);
      sums[i].target = digest_of_limbs(p + 4);
      const std::int64_t count[3] = {p[8], p[9], 0};
      const std::vector<std::uint32_t> n = fold(count, 3);
      PULSE_CHECK(n[2] == 0, "the receivers' element counts of tensor '" + sorted_[i].name + "' overflow 64 bits");
      sums[i].elements = std::uint64_t(n[1]) << 32 | n[0];
    }
    check(sums);
  } catch (...) {
    rollback();
    throw;
  }
  changes_.clear();
  finished_ = true;
}

void SlicedApply::check(const std::vector<PieceSums>& sums) const {
  std::vector<Digest> base, target;
  std::vector<TensorRef> refs;
  for (std::size_t i = 0; i < sorted_.size(); ++i) {
    const std::uint64_t n = element_count(sorted_[i]);
    PULSE_CHECK(sums[i].elements == n, "the receivers' pieces of tensor '" + sorted_[i].name + "' hold " +
                                           std::to_string(sums[i].elements) + " of its " + std::to_string(n) +
                                           " elements (each element must be held by exactly one receiver)");
    base.push_back(sums[i].base.digest());
    target.push_back(sums[i].target.digest());
    refs.push_back({sorted_[i].name, sorted_[i].dtype, sorted_[i].shape, nullptr, 0});
  }
  PULSE_CHECK(state_digest(refs, base, metadata_) == header_.base_state,
              "the receivers' state is not the base version " + std::to_string(header_.base_version) +
                  " of the patch (the digest of their pieces differs); every receiver kept its pieces");
  PULSE_CHECK(state_digest(refs, target, metadata_) == header_.target_state,
              "the receivers' pieces after the patch do not have its target digest (version " +
                  std::to_string(header_.target_version) + "); every receiver kept its pieces");
}

}  // namespace pulse::sync
