#include "measure/patch_size.hpp"


#include <algorithm>
#include <map>
#include <numeric>

#include "core/error.hpp"
#include "sync/compress.hpp"

namespace pulse::measure {

namespace {

// FORMAT.md: magic, version, flags, codings, versions, three digests, three stream sizes and the
// table's size; then the table, the streams and the checksum.
constexpr std::uint64_t kFixedHeaderBytes = 8 + 2 + 2 + 4 + 8 + 8 + 3 * 16 + 3 * 16 + 8;
constexpr std::uint64_t kChecksumBytes = 16;
constexpr std::uint8_t kSparseEntry = 0;

void put_string(std::vector<std::uint8_t>& out, const std::string& s) {
  sync::put_varint(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

// The stream as encode_patch compresses it (an empty stream stays empty).
std::uint64_t compressed_bytes(const std::vector<std::uint8_t>& raw, int level) {
  return sync::compress(sync::Compressor::zstd, level, raw).size();
}

}  // namespace

void UnitPatchSize::add_tensor(const std::string& name, const std::string& dtype, std::uint64_t numel) {
  PULSE_CHECK(dtype == "BF16" || dtype == "F16" || dtype == "F32", "patch size of a " + dtype + " tensor");
  if (used_ == tensors_.size()) tensors_.emplace_back();
  Tensor& t = tensors_[used_++];
  t.name = name;
  t.dtype = dtype;
  t.numel = numel;
  t.changed = t.next_index = 0;
  t.element_bytes = dtype == "F32" ? 4 : 2;
  t.index_bytes.clear();
  t.value_bytes.clear();
}

std::uint64_t UnitPatchSize::bytes(int level) {
  // encode_patch writes the entries, and their streams, in name order.
  std::vector<std::size_t> order(used_);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return tensors_[a].name < tensors_[b].name; });
  struct Summary {
    std::uint64_t tensors = 0, elements = 0, changed = 0;
  };
  std::map<std::string, Summary> by_dtype;
  index_stream_.clear();
  value_stream_.clear();
  for (const std::size_t i : order) {
    const Tensor& t = tensors_[i];
    index_stream_.insert(index_stream_.end(), t.index_bytes.begin(), t.index_bytes.end());
    value_stream_.insert(value_stream_.end(), t.value_bytes.begin(), t.value_bytes.end());
    Summary& s = by_dtype[t.dtype];
    s.tensors += 1, s.elements += t.numel, s.changed += t.changed;
  }
  // The table: the per-dtype summary, then one entry per tensor.
  table_.clear();
  sync::put_varint(table_, by_dtype.size());
  for (const auto& [dtype, s] : by_dtype) {
    put_string(table_, dtype);
    for (const std::uint64_t v : {s.tensors, s.elements, s.changed, std::uint64_t(0)}) sync::put_varint(table_, v);
  }
  sync::put_varint(table_, used_);
  for (const std::size_t i : order) {
    table_.push_back(kSparseEntry);
    sync::put_varint(table_, tensors_[i].changed);
  }
  return kFixedHeaderBytes + table_.size() + compressed_bytes(index_stream_, level) +
         compressed_bytes(value_stream_, level) + kChecksumBytes;
}

}  // namespace pulse::measure
