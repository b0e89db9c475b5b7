#include "sync/patch_summary.hpp"

#include <cstring>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "coding/parallel.hpp"
#include "io/safetensors.hpp"
#include "sync/streamed_state.hpp"

namespace pulse::sync {

double sparsity_percent(std::uint64_t changed, std::uint64_t elements) {
  return elements ? 100.0 * (1.0 - double(changed) / double(elements)) : 100.0;
}

namespace {

nlohmann::json stream_json(const StreamSize& s) { return {{"coded", s.coded}, {"raw", s.raw}}; }

// Bytes [offset, offset + bytes) of tensor i of a state, in memory or read into buffer.
using PieceReader = std::function<const std::byte*(std::size_t i, std::uint64_t offset, std::size_t bytes, ByteBuffer& buffer)>;

StateDiff diff_with(const std::vector<TensorRef>& a, const PieceReader& read_a, const std::vector<TensorRef>& b,
                    const PieceReader& read_b, bool metadata_changed, unsigned threads) {
  std::map<std::string, std::size_t> a_by_name, b_by_name;
  for (std::size_t i = 0; i < a.size(); ++i) a_by_name[a[i].name] = i;
  for (std::size_t j = 0; j < b.size(); ++j) b_by_name[b[j].name] = j;
  StateDiff diff;
  diff.metadata_changed = metadata_changed;
  for (const TensorRef& t : a)
    if (!b_by_name.count(t.name)) {
      TensorDiff d;
      d.name = t.name, d.dtype = t.dtype, d.status = TensorDiff::Status::removed;
      diff.tensors.push_back(d);
    }
  const std::size_t first = diff.tensors.size();
  std::vector<std::size_t> a_index(b.size());  // of each compared tensor of B
  for (std::size_t j = 0; j < b.size(); ++j) {
    TensorDiff d;
    d.name = b[j].name, d.dtype = b[j].dtype;
    const auto it = a_by_name.find(b[j].name);
    if (it == a_by_name.end())
      d.status = TensorDiff::Status::added;
    else if (a[it->second].dtype != b[j].dtype || a[it->second].shape != b[j].shape)
      d.status = TensorDiff::Status::redeclared;
    else
      a_index[j] = it->second;
    diff.tensors.push_back(d);
  }
  parallel_for(threads, b.size(), [&](std::size_t j) {
    TensorDiff& d = diff.tensors[first + j];
    if (d.status != TensorDiff::Status::compared) return;
    const std::size_t i = a_index[j];
    const std::size_t bits = io::dtype_bits(io::parse_dtype(d.dtype));
    d.element_wise = bits % 8 == 0;
    const std::size_t width = d.element_wise ? bits / 8 : 1;  // packed below a byte: compared as bytes
    d.elements = d.element_wise ? a[i].bytes / width : 0;
    // In pieces (whole elements each): two of them in memory, whatever the tensor's size.
    thread_local ByteBuffer a_buffer, b_buffer;
    for (std::uint64_t offset = 0; offset < a[i].bytes; offset += StreamedState::kPieceBytes) {
      const std::size_t length = std::size_t(std::min<std::uint64_t>(StreamedState::kPieceBytes, a[i].bytes - offset));
      const std::byte* t = read_a(i, offset, length, a_buffer);
      const std::byte* u = read_b(j, offset, length, b_buffer);
      if (std::memcmp(t, u, length) == 0) continue;
      d.differs = true;
      if (d.element_wise)
        for (std::size_t k = 0; k < length / width; ++k) d.changed += std::memcmp(t + width * k, u + width * k, width) != 0;
    }
  });
  std::map<std::string, DtypeDiff> by_dtype;
  for (const TensorDiff& d : diff.tensors) {
    if (d.status != TensorDiff::Status::compared) continue;
    DtypeDiff& total = by_dtype[d.dtype];
    total.dtype = d.dtype, total.element_wise = d.element_wise;
    total.elements += d.elements, total.changed += d.changed, total.differing_tensors += d.differs;
  }
  for (auto& [dtype, total] : by_dtype) diff.totals.push_back(total);
  return diff;
}

PieceReader in_memory(const std::vector<TensorRef>& tensors) {
  return [&tensors](std::size_t i, std::uint64_t offset, std::size_t, ByteBuffer&) { return tensors[i].data + offset; };
}

PieceReader streamed(const StreamedState& state) {
  return [&state](std::size_t i, std::uint64_t offset, std::size_t bytes, ByteBuffer& buffer) {
    return state.read_piece(i, offset, bytes, buffer);
  };
}

const char* status_name(TensorDiff::Status s) {
  return s == TensorDiff::Status::added ? "added" : s == TensorDiff::Status::removed ? "removed" : "re-declared";
}

}  // namespace

std::string describe_patch(const ParsedPatch& p) {
  const PatchHeader& h = p.header;
  std::size_t kinds[3] = {0, 0, 0};
  for (const auto& e : p.entries) ++kinds[static_cast<int>(e.kind)];
  nlohmann::json summary = nlohmann::json::array(), added = nlohmann::json::array();
  for (const auto& s : p.summary) {
    nlohmann::json row = {{"dtype", s.dtype}, {"tensors", s.tensors}, {"elements", s.elements}, {"whole_bytes", s.whole_bytes}};
    if (is_sparse_dtype(s.dtype)) row["changed"] = s.changed, row["sparsity_percent"] = sparsity_percent(s.changed, s.elements);
    summary.push_back(row);
  }
  for (const auto& t : p.added) added.push_back({{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}});
  nlohmann::json out = {
      {"format_version", h.format_version},
      {"bytes", p.patch_bytes},
      {"signed", h.is_signed},
      {"base_version", h.base_version},
      {"target_version", h.target_version},
      {"base_state", to_hex(h.base_state)},
      {"target_state", to_hex(h.target_state)},
      {"values", value_coding_name(h.values)},
      {"indices", index_coding_name(h.indices)},
      {"compressor", compressor_name(h.compressor)},
      {"streams", {{"index", stream_json(h.index_stream)}, {"value", stream_json(h.value_stream)}, {"whole", stream_json(h.whole_stream)}}},
      {"table_bytes", p.table_bytes},
      {"entries", {{"tensors", p.entries.size()}, {"sparse", kinds[int(EntryKind::sparse)]}, {"same", kinds[int(EntryKind::same)]},
                   {"whole", kinds[int(EntryKind::whole)]}}},
      {"total_changed", h.total_changed},
      {"summary", summary},
      {"removed", p.removed},
      {"added", added}};
  if (h.changes_metadata) out["metadata"] = p.metadata;
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);  // names need not be UTF-8
}

StateDiff diff_states(const StreamedState& a, const StreamedState& b, unsigned threads) {
  return diff_with(a.tensors(), streamed(a), b.tensors(), streamed(b), a.metadata() != b.metadata(), threads);
}

StateDiff diff_states(const std::vector<TensorRef>& a, const std::vector<TensorRef>& b, const Metadata& a_metadata,
                      const Metadata& b_metadata, unsigned threads) {
  return diff_with(a, in_memory(a), b, in_memory(b), a_metadata != b_metadata, threads);
}

std::string diff_json(const StateDiff& diff) {
  nlohmann::json tensors = nlohmann::json::array(), totals = nlohmann::json::object();
  for (const TensorDiff& t : diff.tensors) {
    if (t.status != TensorDiff::Status::compared)
      tensors.push_back({{"name", t.name}, {"dtype", t.dtype}, {"status", status_name(t.status)}});
    else if (!t.element_wise)
      tensors.push_back({{"name", t.name}, {"dtype", t.dtype}, {"differs", t.differs}});
    else
      tensors.push_back({{"name", t.name}, {"dtype", t.dtype}, {"elements", t.elements}, {"changed", t.changed},
                         {"sparsity_percent", sparsity_percent(t.changed, t.elements)}});
  }
  for (const DtypeDiff& t : diff.totals) {
    if (!t.element_wise)
      totals[t.dtype] = {{"differing_tensors", t.differing_tensors}};
    else
      totals[t.dtype] = {{"elements", t.elements}, {"changed", t.changed}, {"sparsity_percent", sparsity_percent(t.changed, t.elements)}};
  }
  return nlohmann::json{{"tensors", tensors}, {"totals", totals}, {"metadata_changed", diff.metadata_changed}}
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace pulse::sync
