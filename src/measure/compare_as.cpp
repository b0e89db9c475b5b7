#include "measure/compare_as.hpp"

#include <cstring>

#include "core/error.hpp"
#include "kernels/bf16.hpp"

namespace pulse::measure {

std::string compare_as_name(CompareAs as) {
  switch (as) {
    case CompareAs::bf16: return "bf16";
    case CompareAs::f16: return "f16";
    case CompareAs::raw: break;
  }
  return "raw";
}

CompareAs parse_compare_as(const std::string& name) {
  if (name == "bf16") return CompareAs::bf16;
  if (name == "f16") return CompareAs::f16;
  if (name == "raw") return CompareAs::raw;
  throw Error("--as " + name + ": not bf16, f16 or raw");
}

std::uint16_t float_to_f16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const std::uint16_t sign = std::uint16_t((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7E00u;     // NaN
  if (a >= 0x477FF000u) return sign | 0x7C00u;    // 65520 and above (and inf) round to inf
  if (a >= 0x38800000u)                           // normal: rebias the exponent by 127 - 15 and round
    return std::uint16_t(sign | ((a - 0x38000000u + 0x0FFFu + ((a >> 13) & 1u)) >> 13));
  if (a <= 0x33000000u) return sign;              // at most 2^-25, half the smallest subnormal: zero
  // Subnormal: the significand (implicit bit included) in units of 2^-24, rounded to nearest even.
  const std::uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  const unsigned shift = 126u - (a >> 23);        // 14..24
  const std::uint32_t q = m >> shift, rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  return std::uint16_t(sign | (q + (rest > half || (rest == half && (q & 1u)))));
}

template <std::uint16_t (*cast)(float)>
void cast_each(const std::byte* f32, std::size_t n, std::byte* out) {
  for (std::size_t i = 0; i < n; ++i) {
    float x;
    std::memcpy(&x, f32 + 4 * i, 4);
    const std::uint16_t h = cast(x);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

void cast_block(CompareAs as, const std::byte* f32, std::size_t n, std::byte* out) {
  PULSE_CHECK(as != CompareAs::raw, "cast_block: raw is no cast");
  if (as == CompareAs::bf16)
    cast_each<float_to_bf16>(f32, n, out);
  else
    cast_each<float_to_f16>(f32, n, out);
}

}  // namespace pulse::measure
