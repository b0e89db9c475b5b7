#pragma once
// How the patch format sees an element of a sparse-coded dtype: its width, its monotone integer
// key (so a change is an exact key difference) and its exponent class (the context of the
// exponent-class coding: whether an element changes depends on its magnitude).
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "core/element_word.hpp"

namespace pulse::sync {

struct SparseFormat {
  unsigned bytes;
  bool sign_magnitude;
  unsigned mantissa_bits;  // the exponent field starts here
  unsigned exponent_bits;
  std::uint64_t sign() const { return std::uint64_t(1) << (8 * bytes - 1); }
  std::uint64_t mask() const { return (std::uint64_t(1) << (8 * bytes)) - 1; }
  // The key of a sign-magnitude float is its monotone integer order (as bf16_key); F8_E8M0 has
  // no sign, its bits are its key.
  // Negative: ~bits & mask() (bits ^ mask()); positive: bits | sign() (bits ^ sign()). Without
  // a branch on the sign, which the random signs of changes would mispredict.
  std::uint64_t key(std::uint64_t bits) const {
    if (!sign_magnitude) return bits;
    const std::uint64_t negative = (bits >> (8 * bytes - 1)) & 1;
    return bits ^ (sign() | (mask() & (0 - negative)));
  }
  std::uint64_t from_key(std::uint64_t key) const {
    if (!sign_magnitude) return key;
    return key & sign() ? key ^ sign() : ~key & mask();
  }
  unsigned max_varint_bytes() const { return bytes == 1 ? 2 : bytes == 2 ? 3 : 5; }  // of zigzag(+-mask)
  unsigned classes() const { return 1u << exponent_bits; }
  unsigned exponent_class(std::uint64_t bits) const {
    return unsigned(bits >> mantissa_bits) & (classes() - 1);
  }
};

inline std::optional<SparseFormat> sparse_format(const std::string& dtype) {
  if (dtype == "BF16") return SparseFormat{2, true, 7, 8};
  if (dtype == "F16") return SparseFormat{2, true, 10, 5};
  if (dtype == "F32") return SparseFormat{4, true, 23, 8};
  if (dtype == "F8_E5M2" || dtype == "F8_E5M2FNUZ") return SparseFormat{1, true, 2, 5};
  if (dtype == "F8_E4M3" || dtype == "F8_E4M3FNUZ") return SparseFormat{1, true, 3, 4};
  if (dtype == "F8_E8M0") return SparseFormat{1, false, 0, 8};
  return std::nullopt;
}

// Element i of `bytes` bytes, little-endian (hosts as safetensors), and its inverse: copies of
// the width's constant size (one of a variable size is a library call per element).
inline std::uint64_t load_value(const std::byte* data, std::uint64_t i, unsigned bytes) {
  return with_element_word(bytes, "load_value", [&](auto word) {
    std::memcpy(&word, data + bytes * i, sizeof word);
    return std::uint64_t(word);
  });
}

// Writes the low `bytes` bytes of v as element i.
inline void store_value(std::byte* data, std::uint64_t i, unsigned bytes, std::uint64_t v) {
  with_element_word(bytes, "store_value", [&](auto word) {
    word = decltype(word)(v);
    std::memcpy(data + bytes * i, &word, sizeof word);
  });
}

}  // namespace pulse::sync
