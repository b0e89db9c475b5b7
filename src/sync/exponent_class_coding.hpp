#pragma once
// The exponent-class coding of a patch's sparse changes (FORMAT.md, value and index coding 2):
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

// Adaptive models of one exponent class; a patch holds one per class value (256).
struct ExponentClassModel {
  BitModel any;         // does the class hold a change in this tensor
  IntegerModel count;   // its changes - 1
  IntegerModel gap;     // ranks skipped before each change
  BitModel sign;        // key difference < 0
  IntegerModel step;    // |key difference| - 1
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
  std::vector<ExponentClassModel> models_;
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
  std::vector<ExponentClassModel> models_;
  std::vector<RangeDecoder> indices_, values_;  // none when the patch has no changes
};

}  // namespace pulse::sync
