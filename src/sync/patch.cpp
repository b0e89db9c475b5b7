#include "sync/patch.hpp"

#include "core/error.hpp"
#include "sync/change_history.hpp"
#include "sync/patch_table.hpp"
#include "sync/sparse_format.hpp"

// The patch code by concern: patch_table.* (the bytes: header, entry and part tables),
// part_coding.* (one part's streams), patch_encode.cpp, patch_parse.cpp, patch_decode.cpp
// (decoding and applying). Here: names, options, digests of a state, sizes.

namespace pulse::sync {

bool operator==(const DtypeSummary& a, const DtypeSummary& b) {
  return a.dtype == b.dtype && a.tensors == b.tensors && a.elements == b.elements && a.changed == b.changed &&
         a.whole_bytes == b.whole_bytes;
}

bool is_sparse_dtype(const std::string& dtype) { return sparse_format(dtype).has_value(); }

ValueCoding parse_value_coding(const std::string& name) {
  if (const auto v = value_named(value_coding_names, name)) return *v;
  throw_error(__FILE__, __LINE__, "unknown value coding '" + name + "' (" + names_text(value_coding_names) + ")");
}
IndexCoding parse_index_coding(const std::string& name) {
  if (const auto i = value_named(index_coding_names, name)) return *i;
  throw_error(__FILE__, __LINE__, "unknown index coding '" + name + "' (" + names_text(index_coding_names) + ")");
}

EncodeOptions exponent_class_options() {
  EncodeOptions options;
  options.values = ValueCoding::exponent_class;
  options.indices = IndexCoding::exponent_class;
  options.compressor = Compressor::none;  // range-coded streams do not compress further
  return options;
}

EncodeOptions exponent_class_history_options(const ChangeHistory& history) {
  EncodeOptions options = exponent_class_options();
  options.values = ValueCoding::exponent_class_history;
  options.indices = IndexCoding::exponent_class_history;
  options.history = &history;
  return options;
}

StateDigests compute_digests(const std::vector<TensorRef>& state, const Metadata& metadata, unsigned threads) {
  StateDigests out;
  std::vector<Digest> digests;
  for (const auto& t : state) {
    digests.push_back(tensor_digest(t, threads));
    out.tensors[t.name] = digests.back();
  }
  out.state = state_digest(state, digests, metadata);
  return out;
}

std::uint64_t patch_segment_elements(const EncodeOptions& options, unsigned width) {
  return patch_bytes::segment_elements(options.part_elements, width);
}

std::uint64_t sparse_patch_bytes(const EncodeOptions& options, const std::vector<TensorLayout>& layout,
                                 const std::vector<std::vector<SegmentStreams>>& segments) {
  using namespace patch_bytes;
  PULSE_CHECK(options.indices != IndexCoding::gap_fixed && !options.signing_key && segments.size() == layout.size(),
              "internal: sparse_patch_bytes takes unsigned, variable-width patches, segments per tensor");
  PatchContent c;
  c.target_layout = layout;
  c.target_bytes.assign(layout.size(), 0);  // only tensors carried whole use them
  std::uint64_t filled = 0;
  std::vector<std::uint8_t> index, value;
  auto close = [&] {
    if (c.parts.empty()) return;
    EncodedPart& p = c.parts.back();
    p.part.index = {compress(options.compressor, options.level, index).size(), index.size()};
    p.part.value = {compress(options.compressor, options.level, value).size(), value.size()};
    index.clear();
    value.clear();
  };
  // As encode_patch groups them (plan_parts), without the streams' bytes in the parts.
  std::uint64_t coded = 0;
  for (std::size_t i = 0; i < layout.size(); ++i) {
    const auto format = sparse_format(layout[i].dtype);
    PULSE_CHECK(format.has_value(), "internal: sparse_patch_bytes of a tensor not coded sparsely");
    const std::uint64_t n = numel_of(layout[i].shape), step = segment_elements(options.part_elements, format->bytes);
    PULSE_CHECK(segments[i].size() <= (n + step - 1) / step, "internal: sparse_patch_bytes: more segments than the tensor has");
    PatchEntry e{EntryKind::sparse, 0, 0};
    for (std::uint64_t begin = 0, s = 0; begin < n; begin += step, ++s) {
      const std::uint64_t elements = std::min(step, n - begin);
      if (c.parts.empty() || (filled > 0 && filled + elements > options.part_elements)) {
        close();
        c.parts.emplace_back();
        filled = 0;
      }
      const SegmentStreams* streams = s < segments[i].size() ? &segments[i][s] : nullptr;
      const std::uint64_t count = streams ? streams->count : 0;
      c.parts.back().part.segments.push_back({elements, count});
      if (streams) {
        index.insert(index.end(), streams->index.begin(), streams->index.end());
        value.insert(value.end(), streams->value.begin(), streams->value.end());
      }
      filled += elements;
      e.count += count;
    }
    c.entries.push_back(e);
  }
  close();
  for (const EncodedPart& p : c.parts) coded += p.part.index.coded + p.part.value.coded;
  return patch_fixed_header_bytes + tables(options, c).size() + coded + patch_checksum_bytes;
}

}  // namespace pulse::sync
