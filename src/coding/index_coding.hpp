#pragma once
// Coding of sorted element indices as gaps, shared by PULSESync patches and PULSELoCo payloads:
// the first index is coded relative to a base, every later one as the gap after its predecessor
// (gap = index - previous - 1 >= 0), either as LEB128 varints or in one fixed width.
#include <cstdint>
#include <string>
#include <vector>

#include "core/enum_names.hpp"
#include "core/index.hpp"

namespace pulse::sync {

enum class IndexCoding : std::uint8_t {
  gap_fixed = 0,   // gaps between sorted indices in the narrowest width per tensor
  gap_varint = 1,  // gaps as LEB128 varints
  // PULSESync patches only, together with ValueCoding::exponent_class (exponent_class_coding.hpp);
  // encode_gaps and decode_gaps refuse it. Id 2 was an earlier version of it.
  exponent_class = 3,
  exponent_class_history = 4,  // its variant with signs in contexts of a change history
};
inline constexpr NamedValue<IndexCoding> index_coding_names[] = {{IndexCoding::gap_fixed, "gap-fixed"},
                                                                 {IndexCoding::gap_varint, "gap-varint"},
                                                                 {IndexCoding::exponent_class, "expclass"},
                                                                 {IndexCoding::exponent_class_history, "expclass-history"}};

// Narrowest of 1, 2, 4, 8 bytes that holds max_gap.
int gap_width(std::uint64_t max_gap);

// The width gap_fixed would use for these indices (sorted, strictly increasing, >= base).
int fixed_gap_width(const index_t* sorted, std::size_t count, std::uint64_t base);

// Appends the gaps of count sorted indices to out; width is the fixed width (ignored for
// gap_varint).
void encode_gaps(IndexCoding coding, int width, const index_t* sorted, std::size_t count, std::uint64_t base,
                 std::vector<std::uint8_t>& out);

// Reads count indices starting at data[pos] (pos is advanced) into out, checking that each lies
// in [base, end) and that the stream holds the bytes. Errors name the stream ("patch") and the
// context (" in tensor 'x'").
template <class Index>
void decode_gaps(IndexCoding coding, int width, const std::uint8_t* data, std::size_t size, std::size_t& pos,
                 std::uint64_t count, std::uint64_t base, std::uint64_t end, Index* out, const char* stream,
                 const std::string& context);

}  // namespace pulse::sync
