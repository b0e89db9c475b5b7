#pragma once
// The exponent-class coding of a patch's sparse changes (FORMAT.md, value and index coding 3):
// positions and values are coded in contexts the receiver computes from the weights it holds.
// Whether an element changes depends on its magnitude (its half-ulp against the update), so the
// elements of a tensor are grouped by the exponent field of their old value; within a class the
// changed elements are coded by their rank among the class's elements, as gaps, and their values
// as key differences, all with adaptive models per class (range_coder.hpp) that the tensors of
// one patch share. Nothing but the streams is needed to decode (no tables, no earlier patches).
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/types.hpp"
#include "sync/range_coder.hpp"
#include "sync/sparse_format.hpp"

namespace pulse::sync {

// Adaptive models of one exponent class; a patch holds one per class value (256). The sign of
// a key difference is a coin toss on training steps (measured: 1.000 bits), so it is coded at
// even odds and has no model.
struct ExponentClassModel {
  BitModel any[2];      // does the class hold a change in this tensor; by: did the class before
  IntegerModel gap;     // ranks skipped before each change
  IntegerModel step;    // |key difference| - 1
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
  // Codes one tensor's changes: their sorted indices, and the new and old bits of each.
  void add(const SparseFormat& format, const std::byte* old_data, const index_t* indices, const std::uint32_t* new_bits,
           const std::uint32_t* old_bits, std::size_t count);
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
  // Decodes one tensor's `count` changes against its old data (n elements): their sorted
  // indices and new values (format.bytes each). Throws pulse::Error naming `context` on
  // anything out of range; writes nothing to old_data.
  void decode(const SparseFormat& format, const std::byte* old_data, std::uint64_t n, std::uint64_t count,
              std::uint64_t* indices, std::uint8_t* new_values, const std::string& context);
  // Throws unless both streams were read to their last byte.
  void check_consumed() const;

 private:
  ExponentClassModels models_;
  std::vector<RangeDecoder> indices_, values_;  // none when the patch has no changes
};

}  // namespace pulse::sync
