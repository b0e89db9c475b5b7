// Reading a patch's bytes (FORMAT.md): header, sizes, checksum, signature, entry and part tables.
#include <cstring>

#include "core/error.hpp"
#include "sync/patch.hpp"
#include "sync/patch_table.hpp"

namespace pulse::sync {

using namespace patch_bytes;

namespace {

constexpr std::uint64_t kMaxRank = 64;
constexpr std::uint64_t kMaxDtypes = 64;

}  // namespace

ParsedPatch parse_patch(const std::uint8_t* bytes, std::size_t size, const PatchLimits& limits,
                        const PublicKey* public_key) {
  PULSE_CHECK(size <= limits.max_patch_bytes, "patch is larger than the limit of " +
                                                  std::to_string(limits.max_patch_bytes) + " bytes");
  PULSE_CHECK(size >= 12 && std::memcmp(bytes, kMagic, 8) == 0, "not a PULSESync patch (bad magic)");
  Reader r{bytes, size, 8, "header"};
  ParsedPatch p;
  PatchHeader& h = p.header;
  h.format_version = r.get<std::uint16_t>();
  PULSE_CHECK(h.format_version != 1 && h.format_version != 2,
              "patch format version " + std::to_string(h.format_version) +
                  " is no longer read (this pulse reads version 3: its state digests are of 128-byte blocks); "
                  "encode the patch again from its base and target");
  PULSE_CHECK(h.format_version == kFormatVersion,
              "patch format version " + std::to_string(h.format_version) + " is not supported (expected 3)");
  PULSE_CHECK(size >= patch_fixed_header_bytes + patch_checksum_bytes, "patch is truncated (" + std::to_string(size) + " bytes)");
  const auto flags = r.get<std::uint16_t>();
  PULSE_CHECK((flags & ~7u) == 0, "patch has unknown flags");
  h.is_signed = flags & 1;
  h.changes_layout = flags & 2;
  h.changes_metadata = flags & 4;
  const auto values = r.get<std::uint8_t>(), indices = r.get<std::uint8_t>(), compressor = r.get<std::uint8_t>();
  PULSE_CHECK(values != 2 && indices != 2, "patch uses the expclass coding of an earlier pulse (coding id 2), which is "
                                           "no longer decoded; encode the patch again from its base and target");
  constexpr auto expclass = std::uint8_t(ValueCoding::exponent_class);
  constexpr auto expclass_history = std::uint8_t(ValueCoding::exponent_class_history);
  static_assert(std::uint8_t(IndexCoding::exponent_class) == expclass &&
                    std::uint8_t(IndexCoding::exponent_class_history) == expclass_history,
                "one id for both halves of each expclass coding");
  PULSE_CHECK(values <= expclass_history && indices <= expclass_history && compressor <= 2 && r.get<std::uint8_t>() == 0,
              "patch names an unknown coding or compressor");
  PULSE_CHECK((values >= expclass || indices >= expclass) ? values == indices : true,
              "patch uses an expclass coding for only one of indices and values");
  h.values = static_cast<ValueCoding>(values);
  h.indices = static_cast<IndexCoding>(indices);
  h.compressor = static_cast<Compressor>(compressor);
  h.base_version = r.get<std::uint64_t>();
  h.target_version = r.get<std::uint64_t>();
  r.get_bytes(h.base_layout.data(), 16);
  r.get_bytes(h.base_state.data(), 16);
  r.get_bytes(h.target_state.data(), 16);
  for (StreamSize* s : {&h.index_stream, &h.value_stream, &h.whole_stream}) {
    s->coded = r.get<std::uint64_t>();
    s->raw = r.get<std::uint64_t>();
    PULSE_CHECK(s->coded <= limits.max_stream_bytes && s->raw <= limits.max_stream_bytes,
                "patch declares a stream beyond the size limit");
  }
  const auto table_bytes = r.get<std::uint64_t>();
  PULSE_CHECK(table_bytes <= limits.max_entry_table_bytes, "patch declares an entry table beyond the size limit");

  // The file must be exactly what the header declares.
  const std::uint64_t trailer = patch_checksum_bytes + (h.is_signed ? patch_signature_bytes : 0);
  const std::uint64_t expected =
      patch_fixed_header_bytes + table_bytes + h.index_stream.coded + h.value_stream.coded + h.whole_stream.coded + trailer;
  PULSE_CHECK(expected == size, "patch is " + std::to_string(size) + " bytes, its header declares " +
                                    std::to_string(expected) + " (truncated or corrupt)");
  const std::size_t signed_part = size - (h.is_signed ? patch_signature_bytes : 0);
  const std::size_t checked_part = signed_part - patch_checksum_bytes;
  Digest stored;
  std::memcpy(stored.data(), bytes + checked_part, 16);
  PULSE_CHECK(digest_bytes(bytes, checked_part) == stored, "patch checksum mismatch (corrupt patch)");
  if (public_key) {
    PULSE_CHECK(h.is_signed, "patch is not signed but a public key was given");
    Signature sig;
    std::memcpy(sig.data(), bytes + signed_part, sig.size());
    PULSE_CHECK(verify_signature(*public_key, sig, bytes, signed_part), "patch signature does not verify with the given key");
  }

  TableReader t{Reader{bytes, patch_fixed_header_bytes + table_bytes, patch_fixed_header_bytes, "entry table"}};
  if (h.values == ValueCoding::exponent_class_history) {
    t.r.get_bytes(h.history.data(), 16);
    PULSE_CHECK(!h.changes_layout, "patch changes the layout, which its expclass-history coding cannot follow");
  }
  if (h.changes_layout) {
    const auto removed = t.count(limits.max_tensors, "removed tensors");
    for (std::uint64_t i = 0; i < removed; ++i) p.removed.push_back(t.string());
    const auto added = t.count(limits.max_tensors, "added tensors");
    for (std::uint64_t i = 0; i < added; ++i) {
      TensorLayout a{t.string(), t.string(), {}};
      const auto rank = t.count(kMaxRank, "dimensions");
      for (std::uint64_t d = 0; d < rank; ++d) {
        const std::uint64_t dim = t.varint();
        PULSE_CHECK(dim <= std::uint64_t(INT64_MAX), "patch adds tensor '" + a.name + "' with a dimension out of range");
        a.shape.push_back(std::int64_t(dim));
      }
      p.added.push_back(std::move(a));
    }
    PULSE_CHECK(removed + added > 0, "patch declares a layout change that changes nothing");
  }
  if (h.changes_metadata) {
    const auto n = t.count(limits.max_tensors, "metadata entries");
    for (std::uint64_t i = 0; i < n; ++i) {
      std::string key = t.string();
      PULSE_CHECK(p.metadata.emplace(std::move(key), t.string()).second, "patch names a metadata key twice");
    }
  }
  const auto dtypes = t.count(kMaxDtypes, "dtypes");
  std::uint64_t summary_changed = 0;
  for (std::uint64_t i = 0; i < dtypes; ++i) {
    DtypeSummary s{t.string()};
    for (std::uint64_t* v : {&s.tensors, &s.elements, &s.changed, &s.whole_bytes}) *v = t.varint();
    PULSE_CHECK(p.summary.empty() || p.summary.back().dtype < s.dtype, "patch dtype summary is not in order of dtype");
    PULSE_CHECK(s.changed <= limits.max_stream_bytes, "patch declares more changes than its streams can hold");
    summary_changed += s.changed;
    p.summary.push_back(std::move(s));
  }
  const auto num_entries = t.count(limits.max_tensors, "tensors");
  std::uint64_t fixed_index_bytes = 0;
  for (std::uint64_t i = 0; i < num_entries; ++i) {
    PatchEntry e;
    const auto kind = t.r.get<std::uint8_t>();
    PULSE_CHECK(kind <= 2, "patch entry " + std::to_string(i) + " has an unknown kind");
    e.kind = static_cast<EntryKind>(kind);
    if (e.kind == EntryKind::sparse) {
      e.count = t.varint();
      // Every change takes at least one byte of the index stream.
      PULSE_CHECK(e.count <= limits.max_stream_bytes, "patch entry " + std::to_string(i) + " declares too many changes");
      if (h.indices == IndexCoding::gap_fixed) {
        e.index_width = t.r.get<std::uint8_t>();
        PULSE_CHECK(e.index_width == 1 || e.index_width == 2 || e.index_width == 4 || e.index_width == 8,
                    "patch entry " + std::to_string(i) + " has an invalid index width");
        fixed_index_bytes += e.count * e.index_width;
      }
      h.total_changed += e.count;
      PULSE_CHECK(h.total_changed <= limits.max_stream_bytes, "patch declares more changes than its streams can hold");
    }
    p.entries.push_back(e);
  }
  PULSE_CHECK(summary_changed == h.total_changed, "patch entries do not add up to its dtype summary");

  // The part table: every part's segments and stream sizes, which must add up to the header's.
  // Tokens: (size, count) is a segment inside its entry; (0, k) ends k entries, each segment's
  // count the rest of its entry's. How many elements each segment holds follows from the
  // receiver's layout (PatchDecoder).
  std::vector<std::uint64_t> sparse_counts;
  for (const PatchEntry& e : p.entries)
    if (e.kind == EntryKind::sparse) sparse_counts.push_back(e.count);
  std::size_t entry = 0;           // the sparse entry the next segment lies in
  std::uint64_t entry_changes = 0;  // of its segments so far
  const auto num_parts = t.count(limits.max_stream_bytes, "parts");
  std::uint64_t part_changes = 0, segments = 0;
  StreamSize index_sum, value_sum;
  p.parts.reserve(num_parts);
  for (std::uint64_t i = 0; i < num_parts; ++i) {
    PatchPart part;
    const std::string which = "patch part " + std::to_string(i);
    const auto num_tokens = t.count(limits.max_stream_bytes, "segments");
    PULSE_CHECK(num_tokens > 0, which + " has no segment");
    std::uint64_t changes = 0, num_segments = 0;
    for (std::uint64_t k = 0; k < num_tokens; ++k) {
      const std::uint64_t size = t.varint(), n = t.varint();
      PULSE_CHECK(entry < sparse_counts.size(), which + " has segments beyond the sparse entries");
      if (size > 0) {
        PULSE_CHECK(n <= size && n <= sparse_counts[entry] - entry_changes,
                    which + " has a segment of more changes than elements, or than its entry declares");
        part.segments.push_back({size, n, false});
        entry_changes += n;
        changes += n;
        ++num_segments;
        continue;
      }
      PULSE_CHECK(n > 0 && n <= sparse_counts.size() - entry, which + " ends more entries than the patch has");
      for (std::uint64_t j = 0; j < n; ++j, ++entry, entry_changes = 0) {
        const std::uint64_t rest = sparse_counts[entry] - entry_changes;
        part.segments.push_back({0, rest, true});
        changes += rest;
        ++num_segments;
      }
    }
    for (std::uint64_t* v : {&part.index.coded, &part.index.raw, &part.value.coded, &part.value.raw}) {
      *v = t.varint();
      PULSE_CHECK(*v <= limits.max_stream_bytes, which + " declares a stream beyond the size limit");
    }
    // Raw sizes follow from the changes (exactly once the receiver's layout gives the element
    // widths): anything else is corrupt (or a decompression bomb).
    if (is_exponent_class(h.values)) {
      // A range code: at most 14 bits per binary decision (the least probability is 3 * 2^-15), a
      // change takes fewer than 140 decisions (gap and value: 64-bit Elias-gamma each, sign) and a
      // segment fewer than 256 + 130 besides (a flag per class, a count per changed class).
      const std::uint64_t bound = 16 + 256 * changes + 704 * num_segments;
      PULSE_CHECK((changes == 0) == (part.index.raw == 0) && part.index.raw <= bound &&
                      (changes == 0) == (part.value.raw == 0) && part.value.raw <= bound,
                  which + " index or value stream size disagrees with its segments");
    } else {
      if (h.indices != IndexCoding::gap_fixed)
        PULSE_CHECK(part.index.raw >= changes && part.index.raw <= 10 * changes,
                    which + " index stream size disagrees with its segments");
      PULSE_CHECK(part.value.raw >= changes && part.value.raw <= 5 * changes,
                  which + " value stream size disagrees with its segments");
    }
    for (auto [sum, s] : {std::pair{&index_sum, &part.index}, std::pair{&value_sum, &part.value}}) {
      sum->coded += s->coded;
      sum->raw += s->raw;
      PULSE_CHECK(sum->coded <= limits.max_stream_bytes && sum->raw <= limits.max_stream_bytes,
                  "patch parts declare streams beyond the size limit");
    }
    part_changes += changes;
    segments += num_segments;
    p.parts.push_back(std::move(part));
  }
  PULSE_CHECK(t.r.pos == t.r.size, "patch entry table has trailing bytes");
  PULSE_CHECK(entry == sparse_counts.size() && part_changes == h.total_changed,
              "patch parts do not end every sparse entry, or do not add up to its entries' changes");
  PULSE_CHECK(index_sum.coded == h.index_stream.coded && index_sum.raw == h.index_stream.raw &&
                  value_sum.coded == h.value_stream.coded && value_sum.raw == h.value_stream.raw,
              "patch parts' stream sizes do not add up to the header's");
  if (h.indices == IndexCoding::gap_fixed)
    PULSE_CHECK(h.index_stream.raw == fixed_index_bytes, "patch index stream size disagrees with its entries");
  (void)segments;

  p.index_stream = bytes + patch_fixed_header_bytes + table_bytes;
  p.value_stream = p.index_stream + h.index_stream.coded;
  p.whole_stream = p.value_stream + h.value_stream.coded;
  p.patch_bytes = size;
  p.table_bytes = table_bytes;
  return p;
}

}  // namespace pulse::sync
