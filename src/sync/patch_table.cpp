#include "sync/patch_table.hpp"

#include <algorithm>
#include <map>

#include "sync/change_history.hpp"

#include "io/safetensors.hpp"

namespace pulse::sync::patch_bytes {

std::uint64_t numel_of(const std::vector<std::int64_t>& shape) {
  std::uint64_t n = 1;
  for (std::int64_t d : shape) {
    PULSE_CHECK(d >= 0, "negative dimension in a tensor shape");
    PULSE_CHECK(d == 0 || n <= UINT64_MAX / std::uint64_t(d), "tensor shape overflows");
    n *= std::uint64_t(d);
  }
  return n;
}

namespace {

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

void put_string(std::vector<std::uint8_t>& out, const std::string& s) {
  put_varint(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

}  // namespace

std::uint64_t layout_bytes(const std::string& name, const std::string& dtype, const std::vector<std::int64_t>& shape) {
  std::size_t bytes = 0;
  PULSE_CHECK(io::tensor_bytes(io::parse_dtype(dtype), numel_of(shape), bytes),
              "tensor '" + name + "' of " + dtype + shape_string(shape) + " does not fill whole bytes");
  return bytes;
}

const Digest& known_digest(const StateDigests& known, const std::string& name) {
  const auto it = known.tensors.find(name);
  PULSE_CHECK(it != known.tensors.end(), "the digests given for the base do not cover tensor '" + name + "'");
  return it->second;
}

std::vector<DtypeSummary> summarize(const std::vector<TensorLayout>& layout, const std::vector<std::uint64_t>& bytes,
                                    const std::vector<PatchEntry>& entries) {
  std::map<std::string, DtypeSummary> by_dtype;
  for (std::size_t i = 0; i < layout.size(); ++i) {
    DtypeSummary& s = by_dtype[layout[i].dtype];
    s.dtype = layout[i].dtype;
    s.tensors += 1;
    s.elements += numel_of(layout[i].shape);
    if (entries[i].kind == EntryKind::sparse) s.changed += entries[i].count;
    if (entries[i].kind == EntryKind::whole) s.whole_bytes += bytes[i];
  }
  std::vector<DtypeSummary> out;
  for (auto& [dtype, s] : by_dtype) out.push_back(std::move(s));
  return out;
}

std::vector<std::uint8_t> tables(const EncodeOptions& options, const PatchContent& c) {
  const bool changes_layout = !c.removed.empty() || !c.added.empty();
  const bool changes_metadata = c.target_metadata != nullptr;
  std::vector<std::uint8_t> table;
  if (options.history) table.insert(table.end(), options.history->digest().begin(), options.history->digest().end());
  if (changes_layout) {
    put_varint(table, c.removed.size());
    for (const auto& name : c.removed) put_string(table, name);
    put_varint(table, c.added.size());
    for (const auto& t : c.added) {
      put_string(table, t.name);
      put_string(table, t.dtype);
      put_varint(table, t.shape.size());
      for (std::int64_t d : t.shape) put_varint(table, std::uint64_t(d));
    }
  }
  if (changes_metadata) {
    put_varint(table, c.target_metadata->size());
    for (const auto& [key, value] : *c.target_metadata) {
      put_string(table, key);
      put_string(table, value);
    }
  }
  const auto summary = summarize(c.target_layout, c.target_bytes, c.entries);
  put_varint(table, summary.size());
  for (const auto& s : summary) {
    put_string(table, s.dtype);
    for (std::uint64_t v : {s.tensors, s.elements, s.changed, s.whole_bytes}) put_varint(table, v);
  }
  put_varint(table, c.entries.size());
  for (const auto& e : c.entries) {
    table.push_back(static_cast<std::uint8_t>(e.kind));
    if (e.kind != EntryKind::sparse) continue;
    put_varint(table, e.count);
    if (options.indices == IndexCoding::gap_fixed) table.push_back(e.index_width);
  }
  // The part table as tokens (FORMAT.md "Part table"): a segment inside its entry is its size and
  // count; the segments that end their entries (every empty sparse tensor has one) are runs of
  // `0, k`, their sizes and counts implied, so a patch of whole tensors costs a few bytes.
  std::vector<std::uint64_t> sparse_numel;  // of the sparse entries, in order
  for (std::size_t k = 0; k < c.entries.size(); ++k)
    if (c.entries[k].kind == EntryKind::sparse) sparse_numel.push_back(numel_of(c.target_layout[k].shape));
  std::vector<PatchPart> parts;
  for (const EncodedPart& p : c.parts) parts.push_back(p.part);
  if (parts.empty() && !sparse_numel.empty()) parts.emplace_back();  // empty sparse tensors only
  std::size_t entry = 0;
  std::uint64_t covered = 0;
  put_varint(table, parts.size());
  for (std::size_t i = 0; i < parts.size(); ++i) {
    std::vector<std::uint64_t> tokens;
    const auto end_entry = [&] {
      if (tokens.size() >= 2 && tokens[tokens.size() - 2] == 0) ++tokens.back();
      else tokens.insert(tokens.end(), {0, 1});
      ++entry;
      covered = 0;
    };
    for (const PatchSegment& s : parts[i].segments) {
      while (entry < sparse_numel.size() && sparse_numel[entry] == 0) end_entry();
      PULSE_CHECK(entry < sparse_numel.size() && s.elements > 0 && covered + s.elements <= sparse_numel[entry],
                  "internal: patch segments do not tile the sparse entries");
      if (covered + s.elements == sparse_numel[entry]) {
        end_entry();
      } else {
        tokens.insert(tokens.end(), {s.elements, s.count});
        covered += s.elements;
      }
    }
    if (i + 1 == parts.size())
      while (entry < sparse_numel.size() && sparse_numel[entry] == 0) end_entry();
    put_varint(table, tokens.size() / 2);  // tokens: (size, count) or (0, k)
    for (std::uint64_t v : tokens) put_varint(table, v);
    for (std::uint64_t v : {parts[i].index.coded, parts[i].index.raw, parts[i].value.coded, parts[i].value.raw})
      put_varint(table, v);
  }
  PULSE_CHECK(entry == sparse_numel.size() && covered == 0, "internal: patch segments do not tile the sparse entries");
  return table;
}

std::vector<std::uint8_t> write_patch(const EncodeOptions& options, const PatchContent& c) {
  const bool changes_layout = !c.removed.empty() || !c.added.empty();
  const bool changes_metadata = c.target_metadata != nullptr;
  const std::vector<std::uint8_t> table = tables(options, c);
  const auto coded_whole = compress(options.compressor, options.level, c.whole_stream);
  StreamSize index, value;
  for (const EncodedPart& p : c.parts) {
    index.coded += p.part.index.coded;
    index.raw += p.part.index.raw;
    value.coded += p.part.value.coded;
    value.raw += p.part.value.raw;
  }
  Writer w;
  w.put_bytes(kMagic, 8);
  w.put<std::uint16_t>(kFormatVersion);
  w.put<std::uint16_t>((options.signing_key ? 1 : 0) | (changes_layout ? 2 : 0) | (changes_metadata ? 4 : 0));
  w.put<std::uint8_t>(static_cast<std::uint8_t>(options.values));
  w.put<std::uint8_t>(static_cast<std::uint8_t>(options.indices));
  w.put<std::uint8_t>(static_cast<std::uint8_t>(options.compressor));
  w.put<std::uint8_t>(0);
  w.put<std::uint64_t>(options.base_version);
  w.put<std::uint64_t>(options.target_version);
  w.put_bytes(c.base_layout.data(), 16);
  w.put_bytes(c.base_state.data(), 16);
  w.put_bytes(c.target_state.data(), 16);
  for (const StreamSize& s : {index, value, StreamSize{coded_whole.size(), c.whole_stream.size()}}) {
    w.put<std::uint64_t>(s.coded);
    w.put<std::uint64_t>(s.raw);
  }
  w.put<std::uint64_t>(table.size());
  w.out.reserve(w.out.size() + table.size() + index.coded + value.coded + coded_whole.size() + patch_checksum_bytes +
                patch_signature_bytes);
  w.put_bytes(table.data(), table.size());
  for (const EncodedPart& p : c.parts) w.put_bytes(p.index_coded.data(), p.index_coded.size());
  for (const EncodedPart& p : c.parts) w.put_bytes(p.value_coded.data(), p.value_coded.size());
  w.put_bytes(coded_whole.data(), coded_whole.size());
  const Digest checksum = digest_bytes(w.out.data(), w.out.size());
  w.put_bytes(checksum.data(), 16);
  if (options.signing_key) {
    const Signature sig = sign(*options.signing_key, w.out.data(), w.out.size());
    w.put_bytes(sig.data(), sig.size());
  }
  return std::move(w.out);
}

std::uint64_t segment_elements(std::uint64_t part_elements, unsigned width) {
  const std::uint64_t block = kDigestBlockBytes / width;
  return std::max(block, part_elements / block * block);
}

}  // namespace pulse::sync::patch_bytes
