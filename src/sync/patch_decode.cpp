// Decoding and applying patches (FORMAT.md "Receiving"): the receiver's checks, the parts
// decoded on the threads, the target digest updated over the touched blocks, and the rollback.
#include <algorithm>
#include <cstring>
#include <map>

#include "core/element_word.hpp"
#include "core/error.hpp"
#include "sync/change_history.hpp"
#include "coding/parallel.hpp"
#include "sync/patch.hpp"
#include "sync/patch_table.hpp"

namespace pulse::sync {

using namespace patch_bytes;

namespace {

// Changes are scattered over tensors far larger than the caches; prefetching this many ahead
// keeps enough memory accesses in flight.
constexpr std::size_t kPrefetchAhead = 16;

// Writes `count` values (width bytes each) at their indices.
void write_values(std::byte* data, unsigned width, const std::uint64_t* indices, const std::uint8_t* values,
                  std::size_t count) {
  for (std::size_t k = 0; k < count; ++k) {
    if (k + kPrefetchAhead < count) __builtin_prefetch(data + width * indices[k + kPrefetchAhead], 1);
    std::memcpy(data + width * indices[k], values + width * k, width);
  }
}

// Swaps `count` values (width bytes each) with the elements at their indices: values then hold
// the old ones. The width known as a type: copies of a constant size are moves, not calls.
void swap_values(std::byte* data, unsigned width, const std::uint64_t* indices, std::uint8_t* values,
                 std::size_t count) {
  with_element_word(width, "patch values", [&](auto word) {
    constexpr std::size_t W = sizeof(word);
    for (std::size_t k = 0; k < count; ++k) {
      std::byte* element = data + W * indices[k];
      std::memcpy(&word, element, W);
      std::memcpy(element, values + W * k, W);
      std::memcpy(values + W * k, &word, W);
    }
  });
}

// Asks for the lines of the window of touched blocks numbers[0, count) (ascending) when they
// fill at least a quarter of the range they span (about half the blocks hold a change at 1%
// of the elements changed): every line of the range in order, which the hardware's prefetch
// follows, where the digest's prefetches of scattered blocks alone wait on the first touch.
// Sparser windows are left to those, so as not to read the untouched blocks between.
void prefetch_dense_window(const std::byte* data, const std::uint64_t* numbers, std::size_t count) {
  const std::uint64_t span = numbers[count - 1] + 1 - numbers[0];
  if (4 * count < span) return;
  const char* line = reinterpret_cast<const char*>(data + numbers[0] * kDigestBlockBytes);
  const char* end = line + span * kDigestBlockBytes;
  for (; line < end; line += 64) __builtin_prefetch(line);
}

// Swaps the sorted changes in and sums the blocks they touch before (old_sum) and after
// (new_sum, when hash), a window of touched blocks at a time: the swap and the second sum find
// the window's blocks in cache, where over a whole segment each pass read them from memory;
// the next window's lines are asked for before each.
// decode_run(k, end) writes the new values of changes [k, end) first, once the old sum has
// brought their lines in (keydiff reads each change's old value). swapped: the changes swapped
// so far, for the rollback when a later run throws.
template <class DecodeRun>
void swap_and_sum(std::byte* data, std::uint64_t bytes, unsigned width, const std::uint64_t* indices,
                  std::uint8_t* values, std::size_t count, bool hash, BlockDigest& old_sum, BlockDigest& new_sum,
                  std::uint64_t& swapped, const DecodeRun& decode_run) {
  // The touched blocks' numbers, ascending, listed (and allocated) before anything is swapped.
  thread_local std::vector<std::uint64_t> blocks;
  blocks.clear();
  for (std::size_t k = 0; k < count; ++k) {
    const std::uint64_t b = width * indices[k] / kDigestBlockBytes;
    if (blocks.empty() || blocks.back() != b) blocks.push_back(b);
  }
  constexpr std::size_t kWindowBlocks = 256;  // 32 KiB: within the first-level cache
  std::size_t k = 0;                          // the window's first change
  for (std::size_t first = 0; first < blocks.size(); first += kWindowBlocks) {
    const std::size_t n = std::min(kWindowBlocks, blocks.size() - first);
    const std::uint64_t end_byte = (blocks[first + n - 1] + 1) * kDigestBlockBytes;
    std::size_t end = k;
    while (end < count && width * indices[end] < end_byte) ++end;
    const std::size_t next = first + n;
    if (next < blocks.size()) prefetch_dense_window(data, blocks.data() + next, std::min(kWindowBlocks, blocks.size() - next));
    old_sum.add_blocks(data, bytes, blocks.data() + first, n);
    decode_run(k, end);
    swap_values(data, width, indices + k, values + width * k, end - k);
    swapped = end;
    if (hash) new_sum.add_blocks(data, bytes, blocks.data() + first, n);
    k = end;
  }
}

// The digest of a tensor's bytes with sorted changes written, without writing them: ranges of
// whole blocks on the threads, each copied where it holds a change.
Digest digest_with_changes(const std::byte* data, std::uint64_t bytes, unsigned width, const std::uint64_t* indices,
                           const std::uint8_t* values, std::size_t count, unsigned threads) {
  constexpr std::uint64_t kRange = std::uint64_t(1) << 20;
  const std::size_t ranges = std::size_t((bytes + kRange - 1) / kRange);
  std::vector<BlockDigest> sums(ranges);
  parallel_for(threads, ranges, [&](std::size_t r) {
    const std::uint64_t begin = r * kRange, length = std::min(kRange, bytes - begin);
    const std::uint64_t* first = std::lower_bound(indices, indices + count, begin / width);
    const std::uint64_t* last = std::lower_bound(first, indices + count, (begin + length) / width);
    if (first == last) return sums[r].add(data + begin, length, begin);
    thread_local std::vector<std::byte> copy;
    copy.assign(data + begin, data + begin + length);
    for (const std::uint64_t* i = first; i != last; ++i)
      std::memcpy(copy.data() + (width * *i - begin), values + width * std::size_t(i - indices), width);
    sums[r].add(copy.data(), length, begin);
  });
  BlockDigest total;
  for (const auto& s : sums) total += s;
  return total.digest();
}

}  // namespace

PatchDecoder::PatchDecoder(const ParsedPatch& patch, const std::vector<TensorRef>& base, bool hash_targets,
                           const ChangeHistory* history, unsigned threads)
    : patch_(patch), base_(base), hash_targets_(hash_targets), threads_(resolve_threads(threads)) {
  const PatchHeader& h = patch.header;
  if (h.values == ValueCoding::exponent_class_history) {
    PULSE_CHECK(history, "patch is coded against the change history of a receiver that follows every version "
                         "(expclass-history), which this receiver does not keep");
    PULSE_CHECK(history->digest() == h.history, "receiver's change history is not the one patch " +
                                                    std::to_string(h.base_version) + " -> " +
                                                    std::to_string(h.target_version) +
                                                    " was coded against (it followed other versions)");
    history_ = history;
  }
  // 1. The receiver holds the base's layout.
  std::map<std::string, Target> targets;
  base_layout_.reserve(base.size());
  for (std::size_t i = 0; i < base.size(); ++i) {
    const TensorRef& t = base[i];
    base_layout_.push_back({t.name, t.dtype, t.shape});
    PULSE_CHECK(targets.emplace(t.name, Target{&base_layout_.back(), false, i, t.bytes}).second,
                "receiver holds tensor '" + t.name + "' twice");
  }
  PULSE_CHECK(layout_digest(base) == h.base_layout,
              "receiver's tensors (names, dtypes, shapes) are not the layout of the patch's base version " +
                  std::to_string(h.base_version));

  // 2. The target layout: the base's tensors less the removed ones, plus the added ones.
  for (const auto& name : patch.removed)
    PULSE_CHECK(targets.erase(name) == 1, "patch removes tensor '" + name + "', which the receiver does not hold");
  for (std::size_t i = 0; i < patch.added.size(); ++i) {
    const TensorLayout& a = patch.added[i];
    PULSE_CHECK(targets.emplace(a.name, Target{&a, true, i, layout_bytes(a.name, a.dtype, a.shape)}).second,
                "patch adds tensor '" + a.name + "' twice or over a tensor it keeps");
  }
  PULSE_CHECK(targets.size() == patch.entries.size(), "patch has " + std::to_string(patch.entries.size()) +
                                                          " entries for a target of " + std::to_string(targets.size()) + " tensors");

  // 3. Every entry against its tensor, and the segments against the entries, before anything
  // is decompressed: the raw stream sizes follow from them and the layout, so they are bounded
  // by the receiver's tensors.
  std::vector<TensorLayout> target_layout;
  std::vector<std::uint64_t> target_bytes;
  std::vector<std::uint64_t> value_bytes(patch.parts.size(), 0), value_bytes_max(patch.parts.size(), 0),
      index_bytes(patch.parts.size(), 0);
  std::uint64_t whole_bytes = 0;
  std::size_t part = 0, segment = 0;  // the next segment
  std::size_t k = 0;
  for (auto& [name, target] : targets) {
    const PatchEntry& e = patch.entries[k++];
    const TensorLayout& l = *target.layout;
    entry_segments_.push_back(segments_.size());
    whole_offsets_.push_back(whole_bytes);
    if (!target.added)
      PULSE_CHECK(target.bytes == layout_bytes(name, l.dtype, l.shape),
                  "receiver's tensor '" + name + "' size does not match its dtype and shape");
    else
      PULSE_CHECK(e.kind == EntryKind::whole, "patch adds tensor '" + name + "' without its bytes");
    if (e.kind == EntryKind::sparse) {
      const auto format = sparse_format(l.dtype);
      PULSE_CHECK(format.has_value(), "patch codes tensor '" + name + "' of " + l.dtype + " sparsely");
      const std::uint64_t n = numel_of(l.shape);
      PULSE_CHECK(e.count <= n, "patch changes more elements than tensor '" + name + "' has");
      std::uint64_t covered = 0, changes = 0;
      for (bool ended = false; !ended;) {  // the entry's segments, up to the one that ends it
        PULSE_CHECK(part < patch.parts.size(), "patch parts end inside tensor '" + name + "' (corrupt part table)");
        const PatchSegment& s = patch.parts[part].segments[segment];
        ended = s.ends_entry;
        const std::uint64_t elements = ended ? n - covered : s.elements;
        PULSE_CHECK((ended || elements < n - covered) && s.count <= elements &&
                        (covered * format->bytes) % kDigestBlockBytes == 0,
                    "patch segment crosses the end of tensor '" + name +
                        "' or starts inside a 128-byte block (corrupt part table)");
        if (elements > 0) segments_.push_back({k - 1, part, covered, elements, s.count, changes});
        covered += elements;
        changes += s.count;
        value_bytes[part] += s.count * format->bytes;
        value_bytes_max[part] += s.count * format->max_varint_bytes();
        index_bytes[part] += s.count * e.index_width;
        if (++segment == patch.parts[part].segments.size()) {
          ++part;
          segment = 0;
        }
      }
      PULSE_CHECK(changes == e.count, "patch segments of tensor '" + name +
                                          "' do not add up to its entry's changes (corrupt part table)");
    }
    if (e.kind == EntryKind::whole) whole_bytes += target.bytes;
    targets_.push_back(target);
    target_layout.push_back(l);
    target_bytes.push_back(target.bytes);
  }
  entry_segments_.push_back(segments_.size());
  PULSE_CHECK(part == patch.parts.size(), "patch has parts beyond its sparse entries (corrupt part table)");
  PULSE_CHECK(summarize(target_layout, target_bytes, patch.entries) == patch.summary,
              "patch dtype summary disagrees with its entries and the receiver's layout");
  for (std::size_t p = 0; p < patch.parts.size(); ++p) {
    const PatchPart& pp = patch.parts[p];
    if (h.values == ValueCoding::raw)
      PULSE_CHECK(pp.value.raw == value_bytes[p], "patch value stream size disagrees with its entries");
    else if (h.values == ValueCoding::keydiff)
      PULSE_CHECK(pp.value.raw <= value_bytes_max[p], "patch value stream size disagrees with its entries");
    if (h.indices == IndexCoding::gap_fixed)
      PULSE_CHECK(pp.index.raw == index_bytes[p], "patch index stream size disagrees with its entries");
  }
  PULSE_CHECK(h.whole_stream.raw == whole_bytes, "patch whole-tensor stream size disagrees with its entries");

  // 4. The streams: each part's decompressed on the threads, then decoded segment by segment.
  whole_raw_ = decompress(h.compressor, patch.whole_stream, h.whole_stream.coded, h.whole_stream.raw);
  index_raw_.resize(patch.parts.size());
  value_raw_.resize(patch.parts.size());
  std::vector<std::uint64_t> index_at(patch.parts.size(), 0), value_at(patch.parts.size(), 0);
  for (std::size_t p = 1; p < patch.parts.size(); ++p) {
    index_at[p] = index_at[p - 1] + patch.parts[p - 1].index.coded;
    value_at[p] = value_at[p - 1] + patch.parts[p - 1].value.coded;
  }
  parallel_for(threads_, patch.parts.size(), [&](std::size_t p) {
    const PatchPart& pp = patch.parts[p];
    index_raw_[p] = decompress(h.compressor, patch.index_stream + index_at[p], pp.index.coded, pp.index.raw);
    value_raw_[p] = decompress(h.compressor, patch.value_stream + value_at[p], pp.value.coded, pp.value.raw);
  });
  part_first_.assign(patch.parts.size() + 1, segments_.size());
  for (std::size_t s = segments_.size(); s-- > 0;) part_first_[segments_[s].part] = s;
  for (std::size_t p = patch.parts.size(); p-- > 0;) part_first_[p] = std::min(part_first_[p], part_first_[p + 1]);
  parts_.reserve(patch.parts.size());
  for (std::size_t p = 0; p < patch.parts.size(); ++p) {
    std::uint64_t changes = 0;
    for (const PatchSegment& s : patch.parts[p].segments) changes += s.count;
    parts_.emplace_back(h.values, h.indices, index_raw_[p], value_raw_[p], changes);
  }
}

PatchDecoder::~PatchDecoder() = default;

DecodedEntry PatchDecoder::start_entry(std::size_t k) const {
  const PatchEntry& e = patch_.entries[k];
  const Target& target = targets_[k];
  DecodedEntry w;
  w.kind = e.kind;
  w.added = target.added;
  w.tensor = target.tensor;
  w.bytes = target.bytes;
  if (e.kind == EntryKind::whole) w.whole = whole_raw_.data() + whole_offsets_[k];
  if (e.kind == EntryKind::sparse && e.count > 0) {
    w.width = sparse_format(target.layout->dtype)->bytes;
    w.indices.resize(e.count);
    w.values.resize(e.count * w.width);
  }
  return w;
}

std::string PatchDecoder::error_context(const Segment& s) const {
  return " in tensor '" + targets_[s.entry].layout->name + "'";
}

void PatchDecoder::decode_segment(const Segment& s, DecodedEntry& w, const std::byte* old) {
  if (s.count == 0) return;
  const TensorRef& t = base_[w.tensor];
  const std::string& name = targets_[s.entry].layout->name;
  const SparseFormat format = *sparse_format(t.dtype);
  const std::uint8_t* history = nullptr;
  if (history_) {
    history = history_->of(name);
    PULSE_CHECK(history, "receiver's change history does not track tensor '" + name + "'");
    history += s.begin;
  }
  std::uint64_t* indices = w.indices.data() + s.first_change;
  parts_[s.part].decode(format, old ? old : t.data + format.bytes * s.begin, s.elements, s.count,
                        patch_.entries[s.entry].index_width, history, indices,
                        w.values.data() + format.bytes * s.first_change, error_context(s));
  for (std::uint64_t c = 0; c < s.count; ++c) indices[c] += s.begin;
}

DecodedEntry PatchDecoder::next() {
  PULSE_CHECK(!decoded_all_ && next_ < targets_.size(), "PatchDecoder::next past the last entry");
  const std::size_t k = next_++;
  DecodedEntry w = start_entry(k);
  if (w.kind == EntryKind::whole) {
    if (hash_targets_) w.digest = tensor_digest({"", "", {}, reinterpret_cast<const std::byte*>(w.whole), w.bytes}, threads_);
    return w;
  }
  if (!w.touched()) return w;
  // The entry's segments, those of one part in order on one thread.
  std::vector<std::pair<std::size_t, std::size_t>> runs;  // [first, last) segments of one part
  for (std::size_t s = entry_segments_[k]; s < entry_segments_[k + 1]; ++s)
    if (runs.empty() || segments_[s].part != segments_[runs.back().first].part) runs.push_back({s, s + 1});
    else runs.back().second = s + 1;
  parallel_for(threads_, runs.size(), [&](std::size_t r) {
    for (std::size_t s = runs[r].first; s < runs[r].second; ++s) decode_segment(segments_[s], w);
  });
  if (hash_targets_) {
    const TensorRef& t = base_[w.tensor];
    w.digest = digest_with_changes(t.data, t.bytes, w.width, w.indices.data(), w.values.data(), w.indices.size(), threads_);
  }
  return w;
}

DecodedEntry PatchDecoder::next_in_place(std::vector<MutableTensor>& state) {
  PULSE_CHECK(!decoded_all_ && next_ < targets_.size(), "PatchDecoder::next past the last entry");
  const Target& target = targets_[next_];
  if (target.added) return next();
  std::byte* data = state[target.tensor].data;
  PULSE_CHECK(data == base_[target.tensor].data, "PatchDecoder::next_in_place: state is not the decoder's base");
  const bool hash = hash_targets_;
  hash_targets_ = false;
  DecodedEntry w;
  try {
    w = next();
  } catch (...) {
    hash_targets_ = hash;
    throw;
  }
  hash_targets_ = hash;
  if (w.kind != EntryKind::sparse || !w.touched()) {
    if (hash && w.kind == EntryKind::whole) w.digest = tensor_digest({"", "", {}, reinterpret_cast<const std::byte*>(w.whole), w.bytes}, threads_);
    return w;
  }
  swap_values(data, w.width, w.indices.data(), w.values.data(), w.indices.size());
  if (hash) w.digest = tensor_digest(state[target.tensor].view(), threads_);
  return w;
}

std::vector<DecodedEntry> PatchDecoder::decode_all_in_place(std::vector<MutableTensor>& state,
                                                             const std::vector<Digest>& known) {
  PULSE_CHECK(!decoded_all_ && next_ == 0, "PatchDecoder::decode_all_in_place after next()");
  PULSE_CHECK(state.size() == base_.size() && known.size() == base_.size(),
              "PatchDecoder::decode_all_in_place: state is not the decoder's base");
  for (std::size_t i = 0; i < state.size(); ++i)
    PULSE_CHECK(state[i].data == base_[i].data, "PatchDecoder::decode_all_in_place: state is not the decoder's base");
  std::vector<DecodedEntry> plan;
  plan.reserve(targets_.size());
  for (std::size_t k = 0; k < targets_.size(); ++k) plan.push_back(start_entry(k));
  // Each part's segments on one thread: decode, take the old blocks' sums off, swap the changes
  // in, add the new blocks' sums (keydiff: decoding each window's values in between).
  // Parts touch distinct blocks (segments start on block bounds).
  std::vector<BlockDigest> old_sums(segments_.size()), new_sums(segments_.size());
  std::vector<std::uint64_t> swapped(segments_.size(), 0);  // each segment's changes swapped in
  const std::vector<std::size_t>& part_first = part_first_;
  try {
    parallel_for(threads_, parts_.size(), [&](std::size_t p) {
      PartDecoder& part = parts_[p];
      for (std::size_t s = part_first[p]; s < part_first[p + 1]; ++s) {
        const Segment& seg = segments_[s];
        if (seg.count == 0) continue;
        DecodedEntry& w = plan[seg.entry];
        MutableTensor& t = state[w.tensor];
        std::uint64_t* indices = w.indices.data() + seg.first_change;
        std::uint8_t* values = w.values.data() + w.width * seg.first_change;
        if (!part.keydiff()) {
          decode_segment(seg, w);
          swap_and_sum(t.data, t.bytes, w.width, indices, values, seg.count, hash_targets_, old_sums[s], new_sums[s],
                       swapped[s], [](std::size_t, std::size_t) {});
          continue;
        }
        // Keydiff: the indices first, then each window's values against its old blocks, which
        // the old sum has just read: each changed line comes from memory once.
        const SparseFormat format = *sparse_format(t.dtype);
        const std::string context = error_context(seg);
        part.decode_indices(seg.begin, seg.elements, seg.count, patch_.entries[seg.entry].index_width, indices, context);
        swap_and_sum(t.data, t.bytes, w.width, indices, values, seg.count, hash_targets_, old_sums[s], new_sums[s],
                     swapped[s], [&](std::size_t k, std::size_t end) {
                       part.decode_values(format, t.data, end - k, indices + k, values + w.width * k, context);
                     });
      }
    });
  } catch (...) {
    // The values swapped in hold the old ones: write them back, last first.
    for (std::size_t s = segments_.size(); s-- > 0;)
      if (swapped[s] > 0) {
        const Segment& seg = segments_[s];
        const DecodedEntry& w = plan[seg.entry];
        write_values(state[w.tensor].data, w.width, w.indices.data() + seg.first_change,
                     w.values.data() + w.width * seg.first_change, swapped[s]);
      }
    throw;
  }
  next_ = targets_.size();
  decoded_all_ = true;
  if (!hash_targets_) return plan;
  for (std::size_t k = 0; k < plan.size(); ++k) {
    DecodedEntry& w = plan[k];
    if (w.kind == EntryKind::whole)
      w.digest = tensor_digest({"", "", {}, reinterpret_cast<const std::byte*>(w.whole), w.bytes}, threads_);
    if (w.kind != EntryKind::sparse || !w.touched()) continue;
    BlockDigest sum = BlockDigest::of(known[w.tensor]);
    for (std::size_t s = entry_segments_[k]; s < entry_segments_[k + 1]; ++s) {
      sum -= old_sums[s];
      sum += new_sums[s];
    }
    w.digest = sum.digest();
  }
  return plan;
}

std::vector<std::size_t> PatchDecoder::part_entries(std::size_t p) const {
  std::vector<std::size_t> out;
  for (std::size_t s = part_first_[p]; s < part_first_[p + 1]; ++s)
    if (out.empty() || out.back() != segments_[s].entry) out.push_back(segments_[s].entry);
  return out;
}

void PatchDecoder::decode_part(std::size_t p, std::vector<DecodedEntry>& entries) {
  decode_part(p, entries, [](const Segment&) { return nullptr; }, [](const Segment&) {});
}

std::vector<PatchDecoder::Segment> PatchDecoder::part_segments(std::size_t p) const {
  return {segments_.begin() + std::ptrdiff_t(part_first_[p]), segments_.begin() + std::ptrdiff_t(part_first_[p + 1])};
}

std::vector<PatchDecoder::Segment> PatchDecoder::entry_segments(std::size_t k) const {
  return {segments_.begin() + std::ptrdiff_t(entry_segments_[k]),
          segments_.begin() + std::ptrdiff_t(entry_segments_[k + 1])};
}

void PatchDecoder::decode_part(std::size_t p, std::vector<DecodedEntry>& entries,
                               const std::function<const std::byte*(const Segment&)>& old,
                               const std::function<void(const Segment&)>& done) {
  PULSE_CHECK(next_ == 0 && !decoded_all_, "PatchDecoder::decode_part after next()");
  for (std::size_t s = part_first_[p]; s < part_first_[p + 1]; ++s) {
    const Segment& segment = segments_[s];
    decode_segment(segment, entries[segment.entry], old(segment));
    done(segment);
  }
  parts_decoded_.fetch_add(1);
}

void PatchDecoder::finish() const {
  PULSE_CHECK(next_ == targets_.size() || (next_ == 0 && parts_decoded_.load() == parts_.size()),
              "PatchDecoder::finish before the last entry");
  for (const PartDecoder& p : parts_) p.check_consumed();
}

void PatchDecoder::check_base(const Digest& base_state) const {
  PULSE_CHECK(base_state == patch_.header.base_state, "receiver's weights are not the patch's base version " +
                                                         std::to_string(patch_.header.base_version) +
                                                         " (state digest mismatch)");
}

void PatchDecoder::check_target(const Digest& target_state) const {
  PULSE_CHECK(target_state == patch_.header.target_state,
              "weights do not match the patch's target state digest after apply");
}

std::uint64_t apply_patch(const ParsedPatch& patch, std::vector<MutableTensor>& state, const PatchLimits& limits,
                          const StateDigests* base_digests, StateDigests* target_digests, const Metadata& metadata,
                          StateChange* change, ChangeHistory* history, unsigned threads) {
  (void)limits;  // sizes were bounded by parse_patch; the receiver's own tensors bound the rest
  threads = resolve_threads(threads);
  const PatchHeader& h = patch.header;
  PULSE_CHECK(change || (!h.changes_layout && !h.changes_metadata),
              "patch adds or removes tensors or changes the metadata, which this receiver cannot take");
  PULSE_CHECK(!history || !h.changes_layout, "patch adds or removes tensors, which a change history cannot follow");
  // 1. The receiver holds the base: its layout (checked by the decoder), then its contents.
  std::vector<TensorRef> base_refs;
  for (auto& t : state) base_refs.push_back(t.view());
  PatchDecoder decoder(patch, base_refs, true, history, threads);
  std::vector<Digest> base_tensor_digests;
  if (base_digests) {
    for (const auto& t : state) base_tensor_digests.push_back(known_digest(*base_digests, t.name));
    decoder.check_base(base_digests->state);
  } else {
    for (const auto& t : base_refs) base_tensor_digests.push_back(tensor_digest(t, threads));
    decoder.check_base(state_digest(base_refs, base_tensor_digests, metadata));
  }

  // 2.-5. Decode every part on the threads, writing the sparse changes in place; check every
  // index and value, then the target state digest, updated from the base's over the blocks the
  // changes touch. Untouched tensors keep their (verified) base digest. On any failure the old
  // values (what the entries written in place then hold) are written back, so a rejected patch
  // leaves the weights exactly as they were.
  std::vector<DecodedEntry> plan;
  std::vector<Digest> after;
  std::vector<TensorRef> target_refs;
  const Metadata& target_metadata = h.changes_metadata ? patch.metadata : metadata;
  // The history's bytes of each receiver tensor it tracks, found before anything is written.
  std::vector<std::uint8_t*> marks(state.size(), nullptr);
  if (history)
    for (std::size_t i = 0; i < state.size(); ++i)
      if (sparse_format(state[i].dtype)) marks[i] = history->marks(state[i].name);
  plan = decoder.decode_all_in_place(state, base_tensor_digests);
  Digest target_state{};
  try {
    decoder.finish();
    for (const DecodedEntry& w : plan) {
      if (!w.added) {
        target_refs.push_back(state[w.tensor].view());
        after.push_back(w.touched() ? w.digest : base_tensor_digests[w.tensor]);
      } else {
        const TensorLayout& l = patch.added[w.tensor];
        target_refs.push_back({l.name, l.dtype, l.shape, reinterpret_cast<const std::byte*>(w.whole), w.bytes});
        after.push_back(w.digest);
      }
    }
    target_state = state_digest(target_refs, after, target_metadata);
    PULSE_CHECK(target_state == h.target_state,
                "the patched weights would not match the patch's target state digest; nothing written");
  } catch (...) {
    // Last first: exact even where a receiver's tensors share bytes.
    for (auto w = plan.rbegin(); w != plan.rend(); ++w)
      if (w->kind == EntryKind::sparse) write_values(state[w->tensor].data, w->width, w->indices.data(), w->values.data(), w->indices.size());
    throw;
  }

  // 6. Write the tensors carried whole (the sparse changes are in place), and mark each change
  // in the history: the entries written in place now hold the old values.
  if (history) history->age();
  std::uint64_t written = 0;
  for (const DecodedEntry& w : plan) {
    if (w.added || !w.touched()) continue;
    MutableTensor& t = state[w.tensor];
    std::uint8_t* marked = marks[w.tensor];
    if (w.kind == EntryKind::whole) {
      if (marked) {
        const SparseFormat format = *sparse_format(t.dtype);
        ChangeHistory::mark_differences(marked, format, t.data, reinterpret_cast<const std::byte*>(w.whole),
                                        t.bytes / format.bytes);
      }
      if (t.bytes) std::memcpy(t.data, w.whole, t.bytes);
      written += t.bytes;
    } else {
      if (marked) {
        const SparseFormat format = *sparse_format(t.dtype);
        const auto* old_values = reinterpret_cast<const std::byte*>(w.values.data());
        for (std::size_t k = 0; k < w.indices.size(); ++k)
          marked[w.indices[k]] = ChangeHistory::changed(format.key(load_value(old_values, k, w.width)),
                                                        format.key(load_value(t.data, w.indices[k], w.width)));
      }
      written += w.indices.size();
    }
  }
  if (history) history->seal(target_state);
  if (change) {
    change->removed = patch.removed;
    change->added = patch.added;
    change->added_bytes.clear();
    change->added_bytes.resize(patch.added.size());
    for (const DecodedEntry& w : plan)
      if (w.added) {
        const auto* p = reinterpret_cast<const std::byte*>(w.whole);
        change->added_bytes[w.tensor].assign(p, p + w.bytes);
      }
    change->metadata = target_metadata;
  }
  if (target_digests) {
    target_digests->tensors.clear();
    for (std::size_t k = 0; k < target_refs.size(); ++k) target_digests->tensors[target_refs[k].name] = after[k];
    target_digests->state = target_state;
  }
  return written;
}

}  // namespace pulse::sync
