// Encoding patches (FORMAT.md): the entries of two states, their sparse changes cut into
// segments and parts, each part coded on its own on the threads.
#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <type_traits>

#include "core/element_compare.hpp"
#include "core/error.hpp"
#include "sync/change_history.hpp"
#include "sync/change_set.hpp"
#include "sync/exponent_class_coding.hpp"
#include "coding/parallel.hpp"
#include "sync/patch.hpp"
#include "sync/patch_table.hpp"

namespace pulse::sync {

using namespace patch_bytes;

namespace {

void check_codings(const EncodeOptions& options) {
  const bool indices_expclass =
      options.indices == IndexCoding::exponent_class || options.indices == IndexCoding::exponent_class_history;
  PULSE_CHECK(!(is_exponent_class(options.values) || indices_expclass) ||
                  std::uint8_t(options.values) == std::uint8_t(options.indices),
              "the expclass codings code indices and values together: choose the same one for both");
  PULSE_CHECK((options.values == ValueCoding::exponent_class_history) == (options.history != nullptr),
              "the expclass-history coding needs the sender's change history, and only it takes one");
  PULSE_CHECK(options.part_elements > 0, "part_elements must be positive");
}

void check_sizes(const std::vector<TensorRef>& state) {
  for (const TensorRef& t : state)
    PULSE_CHECK(t.bytes == layout_bytes(t.name, t.dtype, t.shape),
                "tensor '" + t.name + "' holds " + std::to_string(t.bytes) + " bytes, not what its dtype and shape need");
}

std::map<std::string, const TensorRef*> by_name(const std::vector<TensorRef>& state, const char* which) {
  std::map<std::string, const TensorRef*> out;
  for (const auto& t : state)
    PULSE_CHECK(out.emplace(t.name, &t).second, "duplicate tensor '" + t.name + "' in " + which);
  return out;
}

// An element range of a sparse entry that is coded in segments: a whole tensor, or a slice.
struct Range {
  std::string name;
  SparseFormat format;
  std::uint64_t begin = 0, end = 0;
  const std::uint8_t* history = nullptr;  // the history's byte of element `begin`, or null
};

struct SegmentPlan {
  std::size_t range;
  std::uint64_t begin, elements;  // in the tensor
};

// Segments of at most segment_elements, consecutive ones grouped into one part up to
// part_elements (across ranges only when `across`).
std::vector<std::vector<SegmentPlan>> plan_parts(const std::vector<Range>& ranges, std::uint64_t part_elements,
                                                 bool across) {
  std::vector<std::vector<SegmentPlan>> parts;
  std::uint64_t filled = 0;
  for (std::size_t r = 0; r < ranges.size(); ++r) {
    const std::uint64_t step = segment_elements(part_elements, ranges[r].format.bytes);
    if (!across) filled = 0;
    bool fresh = !across;
    for (std::uint64_t begin = ranges[r].begin; begin < ranges[r].end; begin += step) {
      const std::uint64_t elements = std::min(step, ranges[r].end - begin);
      if (parts.empty() || fresh || (filled > 0 && filled + elements > part_elements)) {
        parts.emplace_back();
        filled = 0;
        fresh = false;
      }
      parts.back().push_back({r, begin, elements});
      filled += elements;
    }
  }
  return parts;
}

// What a part's scan found in one segment: its changes, listed, or (where code_parts offers an
// encoder that takes batches) coded into that encoder as found and counted.
struct ScannedSegment {
  Changes changes;
  BlockDigest old_sum, new_sum;  // the segment's blocks, or (changes given) the difference
  PartEncoder* encoder = nullptr;
  bool coded = false;
  std::uint64_t coded_count = 0;
};
using Scan = std::function<void(const SegmentPlan&, ScannedSegment&)>;

// A scan's chunk: its inputs (2 x 128 KiB of BF16) stay in the second-level cache until hashed.
constexpr std::size_t kScanChunk = std::size_t(1) << 16;
static_assert(kScanChunk <= kMaxFindElements);

// The changes of a chunk of elements [0, len) of W bytes, their indices from `begin`: coded into
// `encoder` as found where it is given, else appended to `changes`; returns their count.
template <unsigned W>
std::size_t find_changes(const SparseFormat& format, const std::byte* o, const std::byte* t, std::size_t len,
                         std::uint64_t begin, PartEncoder* encoder, Changes& changes) {
  using T = std::conditional_t<W == 1, std::uint8_t, std::conditional_t<W == 2, std::uint16_t, std::uint32_t>>;
  const auto [at, count] = pulse::find_changes(t, o, len, W);
  if (count == 0) return 0;
  const auto value = [](const std::byte* data, std::size_t j) {
    T v;
    std::memcpy(&v, data + W * j, W);
    return v;
  };
  if (encoder) {
    // Locals only (the streams' byte stores could alias anything else), the width a constant.
    const bool sign_magnitude = format.sign_magnitude;
    const auto key = [sign_magnitude](T bits) { return SparseFormat{W, sign_magnitude, 0, 0}.key(bits); };
    KeydiffBatch batch = encoder->open_batch(format, count, begin + len);
    for (std::size_t k = 0; k < count; ++k) {
      const std::size_t j = at[k];
      batch.put(begin + j, key(value(o, j)), key(value(t, j)));
    }
    encoder->close_batch(batch);
    return count;
  }
  const std::size_t first = changes.indices.size();
  changes.indices.resize(first + count);
  changes.values.resize(first + count);
  changes.old_values.resize(first + count);
  index_t* indices = changes.indices.data() + first;
  std::uint32_t* values = changes.values.data() + first;
  std::uint32_t* old_values = changes.old_values.data() + first;
  for (std::size_t k = 0; k < count; ++k) {
    const std::size_t j = at[k];
    indices[k] = index_t(begin + j);
    values[k] = value(t, j);
    old_values[k] = value(o, j);
  }
  return count;
}

// Appends the changes of the n elements of a segment from its element `from` on (indices from
// the segment's start; ranked with `rank`, which needs the whole segment: from 0), hashing each
// chunk while in cache; byte_offset: element from's in its tensor. Codes them into out.encoder
// instead where it is given (and rank is not).
void scan_changes(const SparseFormat& format, const std::byte* old_data, const std::byte* new_data, std::uint64_t from,
                  std::uint64_t n, std::uint64_t byte_offset, bool hash_old, bool rank, ScannedSegment& out) {
  Changes& changes = out.changes;
  std::optional<ExponentClassRanker> ranker;
  if (rank) ranker.emplace(format, old_data, n);
  PartEncoder* encoder = rank ? nullptr : out.encoder;
  std::uint64_t found = 0;
  const unsigned w = format.bytes;
  for (std::size_t begin = 0; begin < n; begin += kScanChunk) {
    const std::size_t first = changes.indices.size();
    const std::size_t len = std::min<std::uint64_t>(kScanChunk, n - begin);
    const std::byte* o = old_data + w * begin;
    const std::byte* t = new_data + w * begin;
    if (w == 1) found += find_changes<1>(format, o, t, len, from + begin, encoder, changes);
    if (w == 2) found += find_changes<2>(format, o, t, len, from + begin, encoder, changes);
    if (w == 4) found += find_changes<4>(format, o, t, len, from + begin, encoder, changes);
    if (ranker)
      ranker->rank(changes.indices.data() + first, changes.old_values.data() + first, changes.indices.size() - first,
                   changes.ranks);
    if (hash_old) out.old_sum.add(o, w * len, byte_offset + w * begin);
    out.new_sum.add(t, w * len, byte_offset + w * begin);
  }
  if (encoder) {
    out.coded = true;
    out.coded_count += found;
  }
}

// Scans and codes the parts on the threads; returns each part's segments' scans (changes
// dropped once coded) and fills `coded`.
std::vector<std::vector<ScannedSegment>> code_parts(const std::vector<Range>& ranges,
                                                    const std::vector<std::vector<SegmentPlan>>& plan,
                                                    const EncodeOptions& options, const Scan& scan, unsigned threads,
                                                    std::vector<EncodedPart>& coded, std::vector<unsigned>& widths) {
  std::vector<std::vector<ScannedSegment>> scanned(plan.size());
  coded.assign(plan.size(), {});
  const bool fixed = options.indices == IndexCoding::gap_fixed;
  widths.assign(ranges.size(), 1);  // gap-fixed: per range, the widest segment's
  auto code = [&](std::size_t p, PartEncoder& encoder) {
    EncodedPart& out = coded[p];
    for (std::size_t s = 0; s < plan[p].size(); ++s) {
      const SegmentPlan& seg = plan[p][s];
      const Range& r = ranges[seg.range];
      ScannedSegment& sc = scanned[p][s];
      if (!sc.coded)
        encoder.add(r.format, sc.changes, widths[seg.range], r.history ? r.history + (seg.begin - r.begin) : nullptr);
      out.part.segments.push_back({seg.elements, sc.coded ? sc.coded_count : sc.changes.indices.size()});
      sc.changes = Changes{};
    }
    std::vector<std::uint8_t> index, value;
    encoder.finish(index, value);
    out.index_coded = compress(options.compressor, options.level, index);
    out.value_coded = compress(options.compressor, options.level, value);
    out.part.index = {out.index_coded.size(), index.size()};
    out.part.value = {out.value_coded.size(), value.size()};
  };
  parallel_for(threads, plan.size(), [&](std::size_t p) {
    scanned[p].resize(plan[p].size());
    PartEncoder encoder(options.values, options.indices);
    for (std::size_t s = 0; s < plan[p].size(); ++s) {
      // A scan may code the segment's changes as it finds them, in the part's order.
      ScannedSegment& sc = scanned[p][s];
      if (encoder.takes_batches()) {
        encoder.start_segment();
        sc.encoder = &encoder;
      }
      scan(plan[p][s], sc);
      sc.encoder = nullptr;
    }
    if (!fixed) code(p, encoder);
  });
  if (fixed) {
    for (std::size_t p = 0; p < plan.size(); ++p)
      for (std::size_t s = 0; s < plan[p].size(); ++s) {
        const Changes& c = scanned[p][s].changes;
        unsigned& w = widths[plan[p][s].range];
        w = std::max(w, unsigned(fixed_gap_width(c.indices.data(), c.indices.size(), 0)));
      }
    parallel_for(threads, plan.size(), [&](std::size_t p) {
      PartEncoder encoder(options.values, options.indices);
      code(p, encoder);
    });
  }
  return scanned;
}

// A state's tensors: in memory, or read in pieces by its loader (from any thread).
class StateBytes {
 public:
  StateBytes(const std::vector<TensorRef>& state, const TensorLoader& loader) : state_(state), loader_(loader) {}
  // Bytes [offset, offset + bytes) of t: in place, or read into buffer.
  const std::byte* piece(const TensorRef& t, std::uint64_t offset, std::size_t bytes,
                         std::vector<std::byte>& buffer) const {
    if (t.data || t.bytes == 0) return t.data + offset;
    PULSE_CHECK(loader_, "internal: tensor '" + t.name + "' is not in memory and its state has no loader");
    if (buffer.size() < bytes) buffer.resize(bytes);
    loader_(std::size_t(&t - state_.data()), offset, bytes, buffer.data());
    return buffer.data();
  }
  // The tensor's digest: hashed in place on the threads, or piece by piece.
  Digest digest(const TensorRef& t, unsigned threads) const {
    if (t.data || t.bytes == 0) return tensor_digest(t, threads);
    std::vector<std::byte> buffer;
    BlockDigest sum;
    for (std::uint64_t at = 0; at < t.bytes; at += kPieceBytes) {
      const std::size_t n = std::size_t(std::min<std::uint64_t>(kPieceBytes, t.bytes - at));
      sum.add(piece(t, at, n, buffer), n, at);
    }
    return sum.digest();
  }
  // A tensor not in memory is read this much at a time where it is not coded in segments.
  static constexpr std::size_t kPieceBytes = std::size_t(8) << 20;

 private:
  const std::vector<TensorRef>& state_;
  const TensorLoader& loader_;
};

// Each thread's buffers for a state not in memory (a segment of each state, or a scan piece).
// A piece: small enough to stay in cache, large enough to be one efficient read from disk.
constexpr std::size_t kScanPieceBytes = std::size_t(1) << 20;
thread_local std::vector<std::byte> base_segment, target_segment;

// Fills the sparse entries' counts (and gap-fixed widths) from the parts' segments.
void count_entries(const std::vector<std::size_t>& entry_of_range, const std::vector<std::vector<SegmentPlan>>& plan,
                   const std::vector<EncodedPart>& coded, const std::vector<unsigned>& widths, bool fixed,
                   std::vector<PatchEntry>& entries) {
  for (std::size_t r = 0; r < entry_of_range.size(); ++r)
    if (fixed) entries[entry_of_range[r]].index_width = std::uint8_t(widths[r]);
  for (std::size_t p = 0; p < plan.size(); ++p)
    for (std::size_t s = 0; s < plan[p].size(); ++s)
      entries[entry_of_range[plan[p][s].range]].count += coded[p].part.segments[s].count;
}

}  // namespace

std::vector<std::uint8_t> encode_patch(const std::vector<TensorRef>& base, const std::vector<TensorRef>& target,
                                       const EncodeOptions& options, const StateDigests* base_digests,
                                       StateDigests* target_digests, const Metadata& base_metadata,
                                       const Metadata& target_metadata, const TensorLoader& base_loader,
                                       const TensorLoader& target_loader) {
  check_codings(options);
  const auto base_by_name = by_name(base, "base"), target_by_name = by_name(target, "target");
  check_sizes(base);
  check_sizes(target);
  const unsigned threads = resolve_threads(options.threads);
  // The layout change: base tensors the target lacks or re-declares, target tensors the base
  // lacks or declares otherwise.
  PatchContent c;
  for (const auto& [name, b] : base_by_name) {
    const auto it = target_by_name.find(name);
    if (it == target_by_name.end() || it->second->dtype != b->dtype || it->second->shape != b->shape) c.removed.push_back(name);
  }
  for (const auto& [name, t] : target_by_name) {
    const auto it = base_by_name.find(name);
    if (it == base_by_name.end() || it->second->dtype != t->dtype || it->second->shape != t->shape)
      c.added.push_back({t->name, t->dtype, t->shape});
  }
  PULSE_CHECK(!options.history || (c.removed.empty() && c.added.empty()),
              "the expclass-history coding follows a fixed layout: this target adds or removes tensors");

  // The entries; the sparse ones become ranges of segments, coded below.
  std::map<std::string, Digest> base_digest_of, target_digest_of;
  std::vector<Range> ranges;
  std::vector<std::size_t> entry_of_range;
  std::vector<std::pair<const TensorRef*, const TensorRef*>> range_tensors;  // base, target
  const StateBytes base_bytes(base, base_loader), target_bytes(target, target_loader);
  for (const auto& [name, tp] : target_by_name) {
    const TensorRef& t = *tp;
    const auto it = base_by_name.find(name);
    const TensorRef* b = it != base_by_name.end() && it->second->dtype == t.dtype && it->second->shape == t.shape
                             ? it->second : nullptr;
    PatchEntry e;
    const auto format = sparse_format(t.dtype);
    if (b && format) {
      e.kind = EntryKind::sparse;
      const std::uint8_t* history = options.history ? options.history->of(name) : nullptr;
      PULSE_CHECK(!options.history || history, "the change history does not track tensor '" + name + "'");
      ranges.push_back({name, *format, 0, t.bytes / format->bytes, history});
      entry_of_range.push_back(c.entries.size());
      range_tensors.push_back({b, &t});
    } else {
      // Carried whole unless equal to the base: compared (and kept) piece by piece.
      if (b && !base_digests) base_digest_of[name] = base_bytes.digest(*b, threads);
      if (b && base_digests) base_digest_of[name] = known_digest(*base_digests, name);
      target_digest_of[name] = target_bytes.digest(t, threads);
      const std::size_t kept = c.whole_stream.size();
      const bool in_memory = t.data || t.bytes == 0;
      bool differs = !b;
      std::vector<std::byte> base_piece, target_piece;
      for (std::uint64_t at = 0; at < t.bytes && !(differs && in_memory); at += StateBytes::kPieceBytes) {
        const std::size_t n = std::size_t(std::min<std::uint64_t>(StateBytes::kPieceBytes, t.bytes - at));
        const auto* p = reinterpret_cast<const std::uint8_t*>(target_bytes.piece(t, at, n, target_piece));
        differs = differs || std::memcmp(base_bytes.piece(*b, at, n, base_piece), p, n) != 0;
        if (!in_memory) c.whole_stream.insert(c.whole_stream.end(), p, p + n);  // kept if it differs
      }
      if (differs) e.kind = EntryKind::whole;
      if (!differs) c.whole_stream.resize(kept);
      if (differs && in_memory) {
        const auto* p = reinterpret_cast<const std::uint8_t*>(t.data);
        c.whole_stream.insert(c.whole_stream.end(), p, p + t.bytes);
      }
    }
    c.target_layout.push_back({t.name, t.dtype, t.shape});
    c.target_bytes.push_back(t.bytes);
    c.entries.push_back(e);
  }

  const auto plan = plan_parts(ranges, options.part_elements, true);
  const bool rank = is_exponent_class(options.values);
  const Scan scan = [&](const SegmentPlan& seg, ScannedSegment& out) {
    const auto [b, t] = range_tensors[seg.range];
    const SparseFormat& format = ranges[seg.range].format;
    out.changes.clear();
    // A state read by its loader is read a piece at a time and scanned while in cache: each byte
    // crosses memory once, not three times (read, stored in the buffer, read back), which bounds
    // the threads of a scan that is memory-bound. The ranker needs the whole segment.
    const std::uint64_t step = rank ? seg.elements : kScanPieceBytes / format.bytes;
    for (std::uint64_t from = 0; from < seg.elements; from += step) {
      const std::uint64_t n = std::min(step, seg.elements - from), offset = format.bytes * (seg.begin + from);
      scan_changes(format, base_bytes.piece(*b, offset, format.bytes * n, base_segment),
                   target_bytes.piece(*t, offset, format.bytes * n, target_segment), from, n, offset, !base_digests,
                   rank, out);
    }
  };
  std::vector<unsigned> widths;
  const auto scanned = code_parts(ranges, plan, options, scan, threads, c.parts, widths);
  count_entries(entry_of_range, plan, c.parts, widths, options.indices == IndexCoding::gap_fixed, c.entries);
  std::vector<BlockDigest> old_sums(ranges.size()), new_sums(ranges.size());
  for (std::size_t p = 0; p < plan.size(); ++p)
    for (std::size_t s = 0; s < plan[p].size(); ++s) {
      old_sums[plan[p][s].range] += scanned[p][s].old_sum;
      new_sums[plan[p][s].range] += scanned[p][s].new_sum;
    }
  for (std::size_t r = 0; r < ranges.size(); ++r) {
    const std::string& name = ranges[r].name;
    base_digest_of[name] = base_digests ? known_digest(*base_digests, name) : old_sums[r].digest();
    target_digest_of[name] = new_sums[r].digest();
  }
  if (base_digests) {
    c.base_state = base_digests->state;
  } else {
    std::vector<Digest> in_base_order;
    for (const auto& t : base) {
      const auto it = base_digest_of.find(t.name);
      in_base_order.push_back(it != base_digest_of.end() ? it->second : base_bytes.digest(t, threads));
    }
    c.base_state = state_digest(base, in_base_order, base_metadata);
  }
  std::vector<Digest> in_target_order;
  for (const auto& t : target) in_target_order.push_back(target_digest_of.at(t.name));
  c.target_state = state_digest(target, in_target_order, target_metadata);
  if (target_digests) {
    target_digests->tensors = target_digest_of;
    target_digests->state = c.target_state;
  }
  c.base_layout = layout_digest(base);
  if (base_metadata != target_metadata) c.target_metadata = &target_metadata;
  std::vector<std::byte>().swap(base_segment);  // the other threads' went with them
  std::vector<std::byte>().swap(target_segment);
  return write_patch(options, c);
}

namespace {

// One tensor's listed changes in either form the encoders take: element k changes index(k)
// (within the tensor) to bits(k).
struct Listed {
  const index_t* indices = nullptr;
  std::size_t count = 0;
  index_t origin = 0;  // subtracted from indices[k]: the tensor's flat offset in a change set
  const std::uint32_t* bits32 = nullptr;
  const std::uint16_t* bits16 = nullptr;
  index_t index(std::size_t k) const { return indices[k] - origin; }
  std::uint32_t bits(std::size_t k) const { return bits32 ? bits32[k] : bits16[k]; }
};

// The content of the patch that writes `listed` (checked by the caller) into base.
PatchContent content_of_listed(const std::vector<TensorRef>& base,
                               const std::map<std::string, const TensorRef*>& base_by_name,
                               const std::map<std::string, Listed>& listed, const EncodeOptions& options,
                               const StateDigests& base_digests, StateDigests* target_digests,
                               const Metadata& metadata) {
  PatchContent c;
  std::vector<Range> ranges;
  std::vector<std::size_t> entry_of_range;
  std::vector<const TensorRef*> range_tensor;
  std::vector<const Listed*> range_changes;
  for (const auto& [name, b] : base_by_name) {
    PatchEntry e;
    if (const auto format = sparse_format(b->dtype)) {
      e.kind = EntryKind::sparse;
      const std::uint8_t* history = options.history ? options.history->of(name) : nullptr;
      PULSE_CHECK(!options.history || history, "the change history does not track tensor '" + name + "'");
      ranges.push_back({name, *format, 0, b->bytes / format->bytes, history});
      entry_of_range.push_back(c.entries.size());
      range_tensor.push_back(b);
      const auto it = listed.find(name);
      range_changes.push_back(it != listed.end() ? &it->second : nullptr);
    }
    c.target_layout.push_back({b->name, b->dtype, b->shape});
    c.target_bytes.push_back(b->bytes);
    c.entries.push_back(e);
  }

  const auto plan = plan_parts(ranges, options.part_elements, true);
  const bool rank = is_exponent_class(options.values);
  // A segment's listed changes that change something; its digest difference over the blocks
  // they touch (old_sum: the old blocks, new_sum: the blocks with the changes written).
  const Scan scan = [&](const SegmentPlan& seg, ScannedSegment& out) {
    out.changes.clear();
    const Listed* ch = range_changes[seg.range];
    if (!ch) return;
    const TensorRef& t = *range_tensor[seg.range];
    const SparseFormat& f = ranges[seg.range].format;
    const unsigned w = f.bytes;
    const index_t* listed_end = ch->indices + ch->count;
    const index_t* first = std::lower_bound(ch->indices, listed_end, ch->origin + index_t(seg.begin));
    const index_t* last = std::lower_bound(first, listed_end, ch->origin + index_t(seg.begin + seg.elements));
    Changes& out_changes = out.changes;
    out_changes.indices.reserve(std::size_t(last - first));
    out_changes.values.reserve(std::size_t(last - first));
    out_changes.old_values.reserve(std::size_t(last - first));
    if (rank) out_changes.ranks.reserve(std::size_t(last - first));
    for (const index_t* it = first; it != last; ++it) {
      const std::size_t k = std::size_t(it - ch->indices);
      const std::uint64_t i = std::uint64_t(ch->index(k));
      const auto old_bits = std::uint32_t(load_value(t.data, i, w));
      if (old_bits == ch->bits(k)) continue;
      out_changes.indices.push_back(index_t(i - seg.begin));
      out_changes.values.push_back(ch->bits(k));
      out_changes.old_values.push_back(old_bits);
    }
    if (out_changes.indices.empty()) return;
    if (rank)
      ExponentClassRanker(f, t.data + w * seg.begin, seg.elements)
          .rank(out_changes.indices.data(), out_changes.old_values.data(), out_changes.indices.size(), out_changes.ranks);
    // Runs of up to kRunBlocks consecutive blocks with a change, each hashed in one call: the
    // old bytes in place, the new ones from a copy with the changes written.
    constexpr std::uint64_t kRunBlocks = 64;
    std::byte run[kRunBlocks * kDigestBlockBytes];
    const std::size_t num_changes = out_changes.indices.size();
    const auto block_of = [&](std::size_t k) { return (seg.begin + std::uint64_t(out_changes.indices[k])) * w / kDigestBlockBytes; };
    for (std::size_t k = 0; k < num_changes;) {
      const std::uint64_t first_block = block_of(k);
      std::size_t end = k + 1;
      std::uint64_t last_block = first_block;
      for (; end < num_changes && block_of(end) <= last_block + 1 && block_of(end) < first_block + kRunBlocks; ++end)
        last_block = block_of(end);
      const std::uint64_t offset = first_block * kDigestBlockBytes;
      const std::size_t bytes = std::min<std::uint64_t>((last_block + 1) * kDigestBlockBytes, t.bytes) - offset;
      out.old_sum.add(t.data + offset, bytes, offset);
      std::memcpy(run, t.data + offset, bytes);
      for (; k < end; ++k)
        store_value(run, seg.begin + std::uint64_t(out_changes.indices[k]) - offset / w, w, out_changes.values[k]);
      out.new_sum.add(run, bytes, offset);
    }
  };
  std::vector<unsigned> widths;
  const auto scanned = code_parts(ranges, plan, options, scan, resolve_threads(options.threads), c.parts, widths);
  count_entries(entry_of_range, plan, c.parts, widths, options.indices == IndexCoding::gap_fixed, c.entries);
  std::map<std::string, Digest> target_digest_of;
  for (const auto& [name, b] : base_by_name) target_digest_of[name] = known_digest(base_digests, name);
  std::vector<BlockDigest> sums(ranges.size());
  for (std::size_t r = 0; r < ranges.size(); ++r) sums[r] = BlockDigest::of(target_digest_of[ranges[r].name]);
  for (std::size_t p = 0; p < plan.size(); ++p)
    for (std::size_t s = 0; s < plan[p].size(); ++s) {
      sums[plan[p][s].range] -= scanned[p][s].old_sum;
      sums[plan[p][s].range] += scanned[p][s].new_sum;
    }
  for (std::size_t r = 0; r < ranges.size(); ++r) target_digest_of[ranges[r].name] = sums[r].digest();

  c.base_state = base_digests.state;
  std::vector<Digest> in_order;
  for (const auto& t : base) in_order.push_back(target_digest_of.at(t.name));
  c.target_state = state_digest(base, in_order, metadata);  // the layout stays
  if (target_digests) {
    target_digests->tensors = target_digest_of;
    target_digests->state = c.target_state;
  }
  c.base_layout = layout_digest(base);
  return c;
}

EncodeSummary summary_of(const PatchContent& c, std::size_t bytes) {
  EncodeSummary s;
  s.bytes = bytes;
  s.parts = c.parts.size();
  for (const EncodedPart& p : c.parts) {
    s.index_stream.coded += p.part.index.coded;
    s.index_stream.raw += p.part.index.raw;
    s.value_stream.coded += p.part.value.coded;
    s.value_stream.raw += p.part.value.raw;
  }
  s.whole_raw = c.whole_stream.size();
  for (const PatchEntry& e : c.entries)
    if (e.kind == EntryKind::sparse) s.changed += e.count;
  return s;
}

}  // namespace

std::vector<std::uint8_t> encode_changes(const std::vector<TensorRef>& base, const std::vector<TensorChanges>& changes,
                                         const EncodeOptions& options, const StateDigests& base_digests,
                                         StateDigests* target_digests, const Metadata& metadata) {
  check_codings(options);
  const auto base_by_name = by_name(base, "base");
  check_sizes(base);
  std::map<std::string, Listed> listed;
  for (const TensorChanges& ch : changes) {
    const auto it = base_by_name.find(ch.name);
    PULSE_CHECK(it != base_by_name.end(), "changes name tensor '" + ch.name + "', which the base does not hold");
    const auto format = sparse_format(it->second->dtype);
    PULSE_CHECK(format || ch.indices.empty(),
                "changes name tensor '" + ch.name + "' of " + it->second->dtype + ", which is not coded sparsely");
    PULSE_CHECK(ch.indices.size() == ch.new_bits.size(), "changes of tensor '" + ch.name + "' have " +
                                                             std::to_string(ch.indices.size()) + " indices and " +
                                                             std::to_string(ch.new_bits.size()) + " values");
    PULSE_CHECK(listed.emplace(ch.name, Listed{ch.indices.data(), ch.indices.size(), 0, ch.new_bits.data(), nullptr}).second,
                "changes name tensor '" + ch.name + "' twice");
    if (!format) continue;
    const std::uint64_t n = it->second->bytes / format->bytes;
    for (std::size_t k = 0; k < ch.indices.size(); ++k) {
      PULSE_CHECK(ch.indices[k] >= 0 && std::uint64_t(ch.indices[k]) < n && (k == 0 || ch.indices[k] > ch.indices[k - 1]),
                  "changes of tensor '" + ch.name + "' are not sorted distinct indices below " + std::to_string(n));
      PULSE_CHECK(ch.new_bits[k] <= format->mask(),
                  "changes of tensor '" + ch.name + "' hold a value wider than " + it->second->dtype);
    }
  }
  return write_patch(options, content_of_listed(base, base_by_name, listed, options, base_digests, target_digests, metadata));
}

EncodedPatch encode_change_set(const std::vector<TensorRef>& base, const ChangeSet& changes, const EncodeOptions& options,
                               const StateDigests& base_digests, StateDigests* target_digests, const Metadata& metadata) {
  check_codings(options);
  const auto base_by_name = by_name(base, "base");
  check_sizes(base);
  std::vector<index_t> offsets{0};
  for (const TensorRef& t : base) {
    const auto format = sparse_format(t.dtype);
    PULSE_CHECK(format && format->bytes == 2, "a change set's state holds 16-bit elements; tensor '" + t.name +
                                                  "' is " + t.dtype);
    offsets.push_back(offsets.back() + index_t(t.bytes / 2));
  }
  check_change_set(changes, offsets);
  std::map<std::string, Listed> listed;
  for (std::size_t t = 0; t < base.size(); ++t) {
    const auto begin = std::size_t(changes.tensor_begin[t]);
    if (changes.count(t) > 0)
      listed[base[t].name] = Listed{changes.indices.data() + begin, std::size_t(changes.count(t)), offsets[t], nullptr,
                                    changes.new_bits.data() + begin};
  }
  const PatchContent c = content_of_listed(base, base_by_name, listed, options, base_digests, target_digests, metadata);
  EncodedPatch out;
  out.bytes = write_patch(options, c);
  out.summary = summary_of(c, out.bytes.size());
  return out;
}

std::vector<SliceParts> encode_slice_parts(const std::vector<TensorSlice>& slices, const EncodeOptions& options) {
  check_codings(options);
  PULSE_CHECK(options.indices != IndexCoding::gap_fixed,
              "gap-fixed patches cannot be encoded in slices (the gap width is the whole tensor's)");
  std::vector<Range> ranges;
  for (const TensorSlice& s : slices) {
    const auto format = sparse_format(s.dtype);
    PULSE_CHECK(format.has_value(), "slice of tensor '" + s.name + "' of " + s.dtype + ", which is not coded sparsely");
    PULSE_CHECK(s.begin <= s.end && s.end <= s.numel, "slice of tensor '" + s.name + "' lies outside it");
    PULSE_CHECK((s.begin * format->bytes) % kDigestBlockBytes == 0 &&
                    (s.end == s.numel || (s.end * format->bytes) % kDigestBlockBytes == 0),
                "slice of tensor '" + s.name + "' does not begin and end on 128-byte boundaries");
    PULSE_CHECK(!options.history == !s.history, "the expclass-history coding needs each slice's history, and only it");
    ranges.push_back({s.name, *format, s.begin, s.end, s.history});
  }
  const auto plan = plan_parts(ranges, options.part_elements, false);
  const bool rank = is_exponent_class(options.values);
  const Scan scan = [&](const SegmentPlan& seg, ScannedSegment& out) {
    const TensorSlice& s = slices[seg.range];
    const unsigned w = ranges[seg.range].format.bytes;
    const std::uint64_t at = w * (seg.begin - s.begin);
    out.changes.clear();
    scan_changes(ranges[seg.range].format, s.base + at, s.target + at, 0, seg.elements, w * seg.begin, true, rank, out);
  };
  std::vector<EncodedPart> coded;
  std::vector<unsigned> widths;
  const auto scanned = code_parts(ranges, plan, options, scan, resolve_threads(options.threads), coded, widths);
  std::vector<SliceParts> out(slices.size());
  for (std::size_t p = 0; p < plan.size(); ++p) {
    SliceParts& o = out[plan[p].front().range];
    for (std::size_t s = 0; s < plan[p].size(); ++s) {
      o.base += scanned[p][s].old_sum;
      o.target += scanned[p][s].new_sum;
    }
    o.parts.push_back(std::move(coded[p]));
  }
  return out;
}

std::vector<std::uint8_t> assemble_patch(const EncodeOptions& options, const std::vector<TensorLayout>& layout,
                                         const Digest& base_state, const Digest& target_state,
                                         const std::vector<EncodedPart>& parts) {
  check_codings(options);
  PULSE_CHECK(options.indices != IndexCoding::gap_fixed, "gap-fixed patches cannot be assembled from parts");
  PatchContent c;
  std::vector<TensorRef> refs;
  // The segments, in order, tile the sparse-coded tensors in name order.
  std::size_t part = 0, segment = 0;
  for (std::size_t i = 0; i < layout.size(); ++i) {
    const TensorLayout& l = layout[i];
    PULSE_CHECK(i == 0 || layout[i - 1].name < l.name, "assemble_patch: the layout is not in order of name");
    c.target_layout.push_back(l);
    c.target_bytes.push_back(layout_bytes(l.name, l.dtype, l.shape));
    refs.push_back({l.name, l.dtype, l.shape, nullptr, c.target_bytes.back()});
    PatchEntry e;
    if (sparse_format(l.dtype)) {
      e.kind = EntryKind::sparse;
      const std::uint64_t n = numel_of(l.shape);
      for (std::uint64_t covered = 0; covered < n;) {
        PULSE_CHECK(part < parts.size(), "assemble_patch: the parts end inside tensor '" + l.name + "'");
        const PatchSegment& s = parts[part].part.segments.at(segment);
        PULSE_CHECK(s.elements <= n - covered, "assemble_patch: a segment crosses the end of tensor '" + l.name + "'");
        covered += s.elements;
        e.count += s.count;
        if (++segment == parts[part].part.segments.size()) {
          ++part;
          segment = 0;
        }
      }
    }
    c.entries.push_back(e);
  }
  PULSE_CHECK(part == parts.size(), "assemble_patch: parts beyond the last tensor");
  c.parts = parts;
  c.base_layout = layout_digest(refs);
  c.base_state = base_state;
  c.target_state = target_state;
  return write_patch(options, c);
}

}  // namespace pulse::sync
