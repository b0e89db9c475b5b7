#pragma once
// The exponent-class coding of a patch's sparse changes (FORMAT.md, value and index coding 3):
// positions and values are coded in contexts the receiver computes from the weights it holds.
// Whether an element changes depends on its magnitude (its half-ulp against the update), so the
// elements of a tensor are grouped by the exponent field of their old value; within a class the
// changed elements are coded by their rank among the class's elements, as gaps, and their values
// as key differences, all with adaptive models per class (range_coder.hpp) that the tensors of
// one patch share. Nothing but the streams is needed to decode (no tables, no earlier patches),
// except in its history variant (coding id 4): there the sign of each change is coded in the
// context of its element's change history (change_history.hpp), which sender and receiver keep.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/index.hpp"
#include "sync/change_history.hpp"
#include "coding/range_coder.hpp"
#include "sync/sparse_format.hpp"

namespace pulse::sync {

// Adaptive models of one exponent class; a patch holds one per class value (256). Without a
// history the sign of a key difference is a coin toss on training steps (measured: 1.000 bits),
// so it is coded at even odds; with one it follows the element's last change (`sign`).
struct ExponentClassModel {
  BitModel any[2];      // does the class hold a change in this tensor; by: did the class before
  IntegerModel gap;     // ranks skipped before each change
  IntegerModel step;    // |key difference| - 1
  // History variant: by ChangeHistory::sign_context (context 0, never changed, is even odds).
  BitModel sign[ChangeHistory::kSignContexts];
};

// The rank of each change of a tensor among the elements of its exponent class, counted in one
// pass over the tensor's old elements. Changes may come in pieces, in index order, so a caller
// that scans a tensor in chunks ranks each chunk's changes while its elements are in cache.
class ExponentClassRanker {
 public:
  // The tensor's old elements (n) stay in place while the ranker is used.
  ExponentClassRanker(const SparseFormat& format, const std::byte* old_data, std::uint64_t n);
  // Appends the ranks of the next changes: sorted indices above the previous ones, old bits of each.
  void rank(const index_t* indices, const std::uint32_t* old_bits, std::size_t count, std::vector<std::uint64_t>& ranks);

 private:
  SparseFormat format_;
  const std::byte* data_;
  std::vector<std::uint64_t> counts_;  // per class, in lanes (exponent_class_coding.cpp)
  std::uint64_t counted_ = 0;          // elements counted so far
  std::vector<unsigned> hot_;          // 16-bit elements: the classes counted by blocks (AVX2)
};

// The models of a patch: one per class, and the class counts, shared by all classes in contexts
// of the count of the class before (in one tensor, neighbouring classes hold similar counts).
struct ExponentClassModels {
  static constexpr unsigned kCountContexts = 65;  // bit length of the previous class's count
  std::vector<ExponentClassModel> classes;
  std::vector<IntegerModel> counts;  // changes of a class - 1
  ExponentClassModels();
};

class ExponentClassEncoder {
 public:
  ExponentClassEncoder();
  // Codes one tensor's changes: the new and old bits and the rank (ExponentClassRanker) of
  // each, in index order. With `history` (the tensor's bytes of a ChangeHistory) the history
  // variant: the signs in index order (`indices`), in contexts of the history.
  void add(const SparseFormat& format, const std::uint64_t* ranks, const std::uint32_t* new_bits,
           const std::uint32_t* old_bits, std::size_t count, const index_t* indices = nullptr,
           const std::uint8_t* history = nullptr);
  // The index and value streams (empty when no change was coded).
  std::vector<std::uint8_t> finish_indices();
  std::vector<std::uint8_t> finish_values();

 private:
  ExponentClassModels models_;
  RangeEncoder indices_, values_;
  bool coded_ = false;
};

class ExponentClassDecoder {
 public:
  // `changes` is the patch's total; a patch without changes has empty streams.
  ExponentClassDecoder(const std::uint8_t* index_stream, std::size_t index_size, const std::uint8_t* value_stream,
                       std::size_t value_size, std::uint64_t changes);
  // Progress of the pass over a tensor's old elements: every change below element `end` is
  // among the first `found`. Called at most every kPassChunk elements, while they are in cache,
  // and last with end = n (unless the tensor has no change).
  using Passed = std::function<void(std::uint64_t end, std::uint64_t found)>;
  static constexpr std::uint64_t kPassChunk = std::uint64_t(1) << 16;

  // Decodes one tensor's `count` changes against its old data (n elements): their sorted
  // indices and new values (format.bytes each). Throws pulse::Error naming `context` on
  // anything out of range; writes nothing to old_data. `history`: the tensor's bytes of the
  // ChangeHistory the patch was coded against (history variant), else nullptr.
  void decode(const SparseFormat& format, const std::byte* old_data, std::uint64_t n, std::uint64_t count,
              std::uint64_t* indices, std::uint8_t* new_values, const std::string& context, const Passed& passed = {},
              const std::uint8_t* history = nullptr);
  // Throws unless both streams were read to their last byte.
  void check_consumed() const;

 private:
  ExponentClassModels models_;
  std::vector<RangeDecoder> indices_, values_;  // none when the patch has no changes
};

}  // namespace pulse::sync
