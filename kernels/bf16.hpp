#pragma once
// BF16 <-> FP32 conversion and the BF16 quantities the sparsity science is built on.
// Rounding is round-to-nearest-even on the bit pattern, exactly as PyTorch's c10::BFloat16
// (round_to_nearest_even); every NaN becomes the canonical quiet NaN 0x7FC0.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#if defined(__SSE2__)
#include <immintrin.h>  // non-temporal stores (every x86-64 CPU has SSE2) and prefetches
#endif

#include "kernels/segments.hpp"
#include "kernels/types.hpp"

namespace pulse {

constexpr bf16_bits bf16_canonical_nan = 0x7FC0;

KOKKOS_INLINE_FUNCTION std::uint32_t float_to_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

KOKKOS_INLINE_FUNCTION float bits_to_float(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// x rounded to BF16, as FP32 bits (low half 0), a NaN's as they come. Adding 0x7FFF plus the
// lowest kept bit rounds to nearest, ties to even; a carry out of the mantissa correctly bumps
// the exponent (and the largest finite values to infinity). A NaN whose low 16 bits are 0 is left
// as it is (adding at most 0x8000 to them carries nothing out); another may round to a zero.
// The kept bit is ORed into bit 0 rather than added: the sum differs only when bit 0 is already
// set, and then the low half is not 0x8000, the one value where adding 1 more decides the carry.
// Same bits for every x (tests/kernels/test_bf16.cpp), one operation less on AVX-512 (vpternlogd
// does the mask and the OR), where the BF16 AdamW step is bound by its roundings.
KOKKOS_INLINE_FUNCTION std::uint32_t rounded_bf16_bits_keeping_nan(float x) {
  const std::uint32_t u = float_to_bits(x);
  return ((u | ((u >> 16) & 1u)) + 0x7FFFu) & 0xFFFF0000u;
}

// The same with every NaN (x != x: one compare) the canonical one; a select, not a branch, so
// loops over arrays vectorise.
KOKKOS_INLINE_FUNCTION std::uint32_t rounded_bf16_bits(float x) {
  return x != x ? std::uint32_t(bf16_canonical_nan) << 16 : rounded_bf16_bits_keeping_nan(x);
}

KOKKOS_INLINE_FUNCTION bf16_bits float_to_bf16(float x) { return static_cast<bf16_bits>(rounded_bf16_bits(x) >> 16); }

KOKKOS_INLINE_FUNCTION float bf16_to_float(bf16_bits b) {
  return bits_to_float(static_cast<std::uint32_t>(b) << 16);
}

// Round an FP32 value to the nearest BF16 value, kept in FP32 (PyTorch's per-op rounding).
KOKKOS_INLINE_FUNCTION float round_to_bf16(float x) { return bits_to_float(rounded_bf16_bits(x)); }

// The BF16 bits of a value round_to_bf16 returned: its high half (it is already rounded, and a
// NaN already canonical), without rounding again.
KOKKOS_INLINE_FUNCTION bf16_bits bf16_of_rounded(float rounded) {
  return static_cast<bf16_bits>(float_to_bits(rounded) >> 16);
}

// round_to_bf16 without the NaN select, for chains of operations on a host CPU (pure-BF16 AdamW
// rounds eight times per element). A NaN whose low 16 bits are 0 stays a NaN, not canonical. On a
// CPU every NaN an operation returns is one of its NaN operands (quieted) or the default NaN, whose
// low 16 bits are 0, so operations on BF16 values, on results of this rounding and on FP32 scalars
// whose NaNs are canonical (canonical_nan_of) give no other NaNs; the final results are made
// canonical by bf16_of_rounded_canonical. Not for devices: CUDA's default NaN is 0x7FFFFFFF.
KOKKOS_INLINE_FUNCTION float round_to_bf16_keeping_nan(float x) { return bits_to_float(rounded_bf16_bits_keeping_nan(x)); }

// The BF16 bits of a value round_to_bf16_keeping_nan returned: its high half, a NaN canonical.
KOKKOS_INLINE_FUNCTION bf16_bits bf16_of_rounded_canonical(float rounded) {
  return rounded != rounded ? bf16_canonical_nan : bf16_of_rounded(rounded);
}

// x itself, or the canonical NaN when x is a NaN (with any payload).
KOKKOS_INLINE_FUNCTION float canonical_nan_of(float x) { return x != x ? bf16_to_float(bf16_canonical_nan) : x; }

// Whether dividing BF16 values by b and rounding to BF16 can multiply by b's reciprocal instead:
// b a BF16 value in [2^-126, 1]. Then round_to_bf16(a * (1.0f / b)) == round_to_bf16(a / b) for
// every BF16 a (tests/kernels/test_adamw.cpp checks all of them): a quotient of 8-bit significands
// is never a midpoint between BF16 values (9 bits, the last one set) and otherwise lies at least
// 2^-17 of itself from every one, while the product is within 2^-23 of the quotient (two FP32
// roundings, 1.0f / b normal); b <= 1 keeps the quotient at least as far from zero as a.
KOKKOS_INLINE_FUNCTION bool bf16_reciprocal_is_exact(float b) {
  return b >= bits_to_float(0x00800000u) && b <= 1.0f && (float_to_bits(b) & 0xFFFFu) == 0;
}

KOKKOS_INLINE_FUNCTION int bf16_biased_exponent(bf16_bits b) { return (b >> 7) & 0xFF; }

// 2^p as an FP32 value for p in [-149, 127], built from bits (exact, no libm).
KOKKOS_INLINE_FUNCTION float exp2_exact(int p) {
  return p >= -126 ? bits_to_float(static_cast<std::uint32_t>(p + 127) << 23)
                   : bits_to_float(1u << (p + 149));
}

// Distance from |x| to the next BF16 value away from zero (zeros and subnormals share the
// smallest normal's spacing, 2^-133). +inf for infinities, NaN for NaNs.
KOKKOS_INLINE_FUNCTION float bf16_ulp(bf16_bits b) {
  const int e = bf16_biased_exponent(b);
  if (e == 0xFF) return (b & 0x7F) ? bf16_to_float(bf16_canonical_nan) : bits_to_float(0x7F800000u);
  return exp2_exact((e == 0 ? 1 : e) - 127 - 7);
}

// Half an ulp: an update smaller than this is absorbed when added to the value.
KOKKOS_INLINE_FUNCTION float bf16_half_ulp(bf16_bits b) {
  const int e = bf16_biased_exponent(b);
  if (e == 0xFF) return bf16_ulp(b);
  return exp2_exact((e == 0 ? 1 : e) - 127 - 8);
}

// Monotone integer key: a < b as floats (with -0 < +0) iff key(a) < key(b). NaNs sort
// outside the infinities. Differences of keys count BF16 steps between two values.
KOKKOS_INLINE_FUNCTION std::uint16_t bf16_key(bf16_bits b) {
  return static_cast<std::uint16_t>((b & 0x8000u) ? (~b & 0xFFFFu) : (b | 0x8000u));
}

KOKKOS_INLINE_FUNCTION bf16_bits bf16_from_key(std::uint16_t k) {
  return static_cast<bf16_bits>((k & 0x8000u) ? (k & 0x7FFFu) : (~k & 0xFFFFu));
}

// ---- array kernels ----

// Outputs from this many elements on are written past the caches on x86 hosts (below).
inline constexpr index_t streamed_cast_elements = index_t(1) << 22;

#if defined(__SSE2__)
namespace detail {

// The widest non-temporal store: with AVX-512 a whole cache line, which leaves the core as one
// write (16-byte stores fill a line's write-combining buffer in four), and only then does
// prefetching the reads ahead pay (with 16-byte stores it was slower).
#if defined(__AVX512F__)
inline constexpr index_t streamed_store_bytes = 64;
inline constexpr index_t streamed_prefetch_elements = 256;  // per stream: 1 KiB, 16 lines ahead
inline void stream_store(void* to, const void* from) {
  _mm512_stream_si512(static_cast<__m512i*>(to), _mm512_load_si512(from));
}
#else
inline constexpr index_t streamed_store_bytes = 16;
inline constexpr index_t streamed_prefetch_elements = 0;
inline void stream_store(void* to, const void* from) {
  _mm_stream_si128(static_cast<__m128i*>(to), _mm_load_si128(static_cast<const __m128i*>(from)));
}
#endif

// to[i] = convert(from[i]) for i < n, the output written with non-temporal stores, as a large
// memcpy writes: a plain store first reads the output's cache line from memory (write-allocate),
// a third more traffic. Each group of 16384 elements is read as four streams 16 KiB apart, as
// glibc's large memcpy reads four pages at a time: one core keeps more reads in flight than along
// one stream. A step converts 64 elements of each stream into a buffer in L1 (a loop the compiler
// vectorises), then streams them out from an address aligned to the store's width. Only where the
// output is cached differs from a plain loop.
template <class ExecSpace, class Convert>
void streamed_convert(const ExecSpace& space, const float* from, bf16_bits* to, const index_t n,
                      const Convert& convert) {
  constexpr index_t store_elements = streamed_store_bytes / index_t(sizeof(bf16_bits));
  const index_t head = std::min<index_t>(
      n, (streamed_store_bytes - reinterpret_cast<std::uintptr_t>(to) % streamed_store_bytes) % streamed_store_bytes /
             index_t(sizeof(bf16_bits)));
  constexpr index_t streams = 4, stream_length = 4096, step = 64;
  const index_t num_groups = (n - head + streams * stream_length - 1) / (streams * stream_length);
  Kokkos::parallel_for(
      "pulse::bf16::cast_to_bf16", FlatPolicy<ExecSpace>(space, 0, num_groups), [=](const index_t g) {
        const index_t begin = head + g * streams * stream_length;
        const index_t length = std::min(streams * stream_length, n - begin);
        const index_t per_stream = length / streams / step * step;  // stream_length but in a short last group
        alignas(64) bf16_bits buffer[streams * step];
        for (index_t j = 0; j < per_stream; j += step) {
          if constexpr (streamed_prefetch_elements > 0)
            for (index_t s = 0; s < streams; ++s)
              for (index_t k = 0; k < step; k += 16)  // a line of floats each
                _mm_prefetch(reinterpret_cast<const char*>(
                                 from + std::min(begin + s * per_stream + j + streamed_prefetch_elements + k, n - 1)),
                             _MM_HINT_T0);
          for (index_t s = 0; s < streams; ++s)
            for (index_t k = 0; k < step; ++k) buffer[s * step + k] = convert(from[begin + s * per_stream + j + k]);
          for (index_t s = 0; s < streams; ++s)
            for (index_t k = 0; k < step; k += store_elements)
              stream_store(to + begin + s * per_stream + j + k, buffer + s * step + k);
        }
        for (index_t i = begin + streams * per_stream; i < begin + length; ++i) to[i] = convert(from[i]);
        if (g == 0)
          for (index_t i = 0; i < head; ++i) to[i] = convert(from[i]);
        _mm_sfence();  // the streamed stores are visible before the kernel ends
      });
}

}  // namespace detail
#endif

template <class ExecSpace, class FloatView, class Bf16View>
void cast_to_bf16(const ExecSpace& space, const FloatView& in, const Bf16View& out) {
  static_assert(std::is_same_v<typename FloatView::non_const_value_type, float>);
  static_assert(std::is_same_v<typename Bf16View::value_type, bf16_bits>);
  const index_t n = static_cast<index_t>(in.extent(0));
#if defined(__SSE2__)
  if constexpr (is_host_space<ExecSpace>) {
    if (n >= streamed_cast_elements && in.span_is_contiguous() && out.span_is_contiguous() && takes_host_path(space)) {
      detail::streamed_convert(space, in.data(), out.data(), n, [](const float x) { return float_to_bf16(x); });
      return;
    }
  }
#endif
  Kokkos::parallel_for(
      "pulse::bf16::cast_to_bf16", FlatPolicy<ExecSpace>(space, 0, n),
      KOKKOS_LAMBDA(const index_t i) { out(i) = float_to_bf16(in(i)); });
}

template <class ExecSpace, class Bf16View, class FloatView>
void cast_to_float(const ExecSpace& space, const Bf16View& in, const FloatView& out) {
  static_assert(std::is_same_v<typename Bf16View::non_const_value_type, bf16_bits>);
  static_assert(std::is_same_v<typename FloatView::value_type, float>);
  Kokkos::parallel_for(
      "pulse::bf16::cast_to_float", FlatPolicy<ExecSpace>(space, 0, in.extent(0)),
      KOKKOS_LAMBDA(const index_t i) { out(i) = bf16_to_float(in(i)); });
}

}  // namespace pulse
