// BF16 cast, ulp and key against an independent scalar reference: the cast is checked for all
// 2^32 float bit patterns (and on a large unaligned output, the streamed path) on every backend
// (tests/support/backends.hpp), the BF16 quantities for all 2^16 BF16 patterns.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/bf16.hpp"
#include "support/backends.hpp"

namespace {

using pulse::bf16_bits;

float value_of(bf16_bits b) {
  const std::uint32_t u = std::uint32_t(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// Round to nearest, ties to even, decided by comparing distances to the two BF16 neighbours in
// double (exact here), not by the bias trick the kernel uses.
bf16_bits reference_cast(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  if (std::isnan(x)) return 0x7FC0;
  const bf16_bits down = static_cast<bf16_bits>(u >> 16);  // toward zero
  if (std::isinf(x)) return down;
  const double lo = std::fabs(double(value_of(down)));
  // The neighbour away from zero; above the largest finite BF16 it is 2^128 (rounds to inf).
  const double hi = (down & 0x7FFF) == 0x7F7F ? std::ldexp(1.0, 128)
                                              : std::fabs(double(value_of(static_cast<bf16_bits>(down + 1))));
  const double ax = std::fabs(double(x));
  if (ax - lo < hi - ax) return down;
  if (ax - lo > hi - ax) return static_cast<bf16_bits>(down + 1);
  return (down & 1) ? static_cast<bf16_bits>(down + 1) : down;
}

// Each chunk's reference is computed once (it costs far more than the cast) and checked against
// every backend.
TEST(Bf16Cast, AllFloatBitPatternsMatchReferenceOnEveryBackend) {
  constexpr std::uint64_t chunk = std::uint64_t(1) << 24;
  using HostView = Kokkos::View<std::uint32_t*, Kokkos::HostSpace>;
  const HostView in_host("in", chunk);
  const Kokkos::View<bf16_bits*, Kokkos::HostSpace> want("want", chunk), out_host("out", chunk);
  std::uint64_t mismatches = 0;
  for (std::uint64_t base = 0; base < (std::uint64_t(1) << 32); base += chunk) {
    for (std::uint64_t i = 0; i < chunk; ++i) {
      in_host(i) = static_cast<std::uint32_t>(base + i);
      want(i) = reference_cast(in_host(i));
    }
    pulse::test::Backends::for_each([&](auto backend) {
      using Mem = typename decltype(backend)::Mem;
      // The output starts as the complement of the reference, so an element left unwritten fails.
      for (std::uint64_t i = 0; i < chunk; ++i) out_host(i) = static_cast<bf16_bits>(~want(i));
      const auto in = Kokkos::create_mirror_view_and_copy(Mem(), in_host);  // in_host itself on a host space
      const auto out = Kokkos::create_mirror_view_and_copy(Mem(), out_host);
      const Kokkos::View<const float*, Mem, Kokkos::MemoryUnmanaged> as_float(reinterpret_cast<const float*>(in.data()),
                                                                              chunk);
      pulse::cast_to_bf16(typename decltype(backend)::ExecSpace(), as_float, out);
      Kokkos::deep_copy(out_host, out);
      for (std::uint64_t i = 0; i < chunk; ++i) {
        if (out_host(i) != want(i) && ++mismatches <= 5)
          ADD_FAILURE() << std::hex << "bits 0x" << in_host(i) << ": kernel 0x" << out_host(i) << ", reference 0x"
                        << want(i);
      }
    });
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(Bf16Cast, HandDerivedCases) {
  auto cast = [](std::uint32_t u) {
    float x;
    std::memcpy(&x, &u, 4);
    return pulse::float_to_bf16(x);
  };
  EXPECT_EQ(cast(0x3F800000), 0x3F80);  // 1.0
  EXPECT_EQ(cast(0x3F808000), 0x3F80);  // 1 + 2^-8: tie, keep even
  EXPECT_EQ(cast(0x3F818000), 0x3F82);  // 1 + 3*2^-8: tie, round up to even
  EXPECT_EQ(cast(0x3F808001), 0x3F81);  // just above the tie
  EXPECT_EQ(cast(0x80000000), 0x8000);  // -0 keeps its sign
  EXPECT_EQ(cast(0x00000000), 0x0000);
  EXPECT_EQ(cast(0x7F7FFFFF), 0x7F80);  // FLT_MAX rounds to +inf
  EXPECT_EQ(cast(0xFF7F8000), 0xFF80);  // tie above the largest BF16 goes to -inf (even)
  EXPECT_EQ(cast(0x7F7F7FFF), 0x7F7F);
  EXPECT_EQ(cast(0x00018000), 0x0002);  // subnormal tie rounds to even
  EXPECT_EQ(cast(0x00008000), 0x0000);
  EXPECT_EQ(cast(0x007FFFFF), 0x0080);  // largest subnormal rounds up to the smallest normal
  EXPECT_EQ(cast(0x7F800000), 0x7F80);
  EXPECT_EQ(cast(0xFF800000), 0xFF80);
  EXPECT_EQ(cast(0x7F800001), 0x7FC0);  // signalling NaN -> canonical quiet NaN
  EXPECT_EQ(cast(0xFFC12345), 0x7FC0);  // negative NaN with payload -> canonical NaN
}

// Large outputs take the streamed path on x86 hosts (non-temporal stores from a 64-byte boundary
// with AVX-512, else a 16-byte one, in groups of four streams): an output that starts off that
// boundary and ends inside a group gets the reference's bits, and nothing around it is written.
// So does the device code path's plain loop.
template <class B>
using Bf16Cast = pulse::test::OnBackend<B>;
TYPED_TEST_SUITE(Bf16Cast, pulse::test::BackendTypes, pulse::test::BackendNames);

TYPED_TEST(Bf16Cast, LargeUnalignedOutputMatchesReference) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  const std::size_t n = std::size_t(pulse::streamed_cast_elements) + 4099, skip = 3, total = n + skip + 2;
  Kokkos::View<std::uint32_t*, Mem> in("in", total);
  Kokkos::View<bf16_bits*, Mem> out("out", total);
  auto in_host = Kokkos::create_mirror_view(in);
  for (std::size_t i = 0; i < total; ++i) in_host(i) = static_cast<std::uint32_t>(i * 2654435761u);
  Kokkos::deep_copy(in, in_host);
  Kokkos::deep_copy(out, bf16_bits(0xABCD));
  const Kokkos::View<const float*, Mem, Kokkos::MemoryUnmanaged> in_range(
      reinterpret_cast<const float*>(in.data()) + skip, n);
  pulse::cast_to_bf16(space, in_range, Kokkos::subview(out, std::make_pair(skip, skip + n)));
  auto out_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < total; ++i) {
    const bf16_bits expected = i >= skip && i < skip + n ? reference_cast(in_host(i)) : bf16_bits(0xABCD);
    if (out_host(i) != expected && ++mismatches <= 5)
      ADD_FAILURE() << "element " << i << ": 0x" << std::hex << out_host(i) << ", expected 0x" << expected;
  }
  EXPECT_EQ(mismatches, 0u);
}

// The AdamW element's per-op rounding: round_to_bf16 gives the cast's bits in the high half, and
// bf16_of_rounded takes them back without rounding again, for every float bit pattern.
TEST(Bf16Round, AgreesWithTheCastForAllFloatBitPatterns) {
  std::uint64_t mismatches = 0;
  for (std::uint64_t u = 0; u < (std::uint64_t(1) << 32); ++u) {
    const std::uint32_t bits = static_cast<std::uint32_t>(u);
    float x, rounded;
    std::memcpy(&x, &bits, 4);
    const bf16_bits cast = pulse::float_to_bf16(x);
    rounded = pulse::round_to_bf16(x);
    std::uint32_t r;
    std::memcpy(&r, &rounded, 4);
    mismatches += (r != std::uint32_t(cast) << 16) + (pulse::bf16_of_rounded(rounded) != cast);
  }
  EXPECT_EQ(mismatches, 0u);
}

// The rounding ORs the kept bit into bit 0 (bf16.hpp): the same bits as adding it, for every float
// bit pattern, NaNs included (the BF16 AdamW step's host rounding keeps their payloads).
TEST(Bf16Round, KeptBitOredIsTheSameAsAddedForAllFloatBitPatterns) {
  std::uint64_t mismatches = 0;
  for (std::uint64_t u = 0; u < (std::uint64_t(1) << 32); ++u) {
    const std::uint32_t bits = static_cast<std::uint32_t>(u);
    float x;
    std::memcpy(&x, &bits, 4);
    mismatches += pulse::rounded_bf16_bits_keeping_nan(x) != ((bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u);
  }
  EXPECT_EQ(mismatches, 0u);
}

// Every BF16 bit pattern, in order. A free function: nvcc does not allow a device lambda in
// TEST's body (a private member function).
template <class Space, class Mem = typename Space::memory_space>
Kokkos::View<bf16_bits*, Mem> all_bf16_patterns(const Space& space) {
  Kokkos::View<bf16_bits*, Mem> all("all", 65536);
  Kokkos::parallel_for("fill", Kokkos::RangePolicy<Space>(space, 0, 65536),
                       KOKKOS_LAMBDA(int i) { all(i) = static_cast<bf16_bits>(i); });
  return all;
}

TYPED_TEST(Bf16Cast, WidenIsExactAndRoundTrips) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  const Kokkos::View<bf16_bits*, Mem> all = all_bf16_patterns(space);
  Kokkos::View<float*, Mem> wide("wide", 65536);
  Kokkos::View<bf16_bits*, Mem> back("back", 65536);
  pulse::cast_to_float(space, all, wide);
  pulse::cast_to_bf16(space, wide, back);
  auto wide_h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), wide);
  auto back_h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), back);
  for (int i = 0; i < 65536; ++i) {
    std::uint32_t u;
    std::memcpy(&u, &wide_h(i), 4);
    ASSERT_EQ(u, std::uint32_t(i) << 16);
    const bool nan = std::isnan(wide_h(i));
    ASSERT_EQ(back_h(i), nan ? 0x7FC0 : i) << "pattern " << i;
  }
}

TEST(Bf16Ulp, MatchesDistanceToNextValueForAllPatterns) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const bf16_bits bits = static_cast<bf16_bits>(b);
    const float x = value_of(bits);
    const float ulp = pulse::bf16_ulp(bits), half = pulse::bf16_half_ulp(bits);
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(ulp) && std::isnan(half));
      continue;
    }
    if (std::isinf(x)) {
      EXPECT_TRUE(std::isinf(ulp) && ulp > 0);
      continue;
    }
    const bf16_bits mag = bits & 0x7FFF;
    const double next = mag == 0x7F7F ? std::ldexp(1.0, 128) : double(value_of(static_cast<bf16_bits>(mag + 1)));
    const double expected = next - std::fabs(double(x));
    ASSERT_EQ(double(ulp), expected) << "pattern " << b;
    ASSERT_EQ(double(half), expected / 2) << "pattern " << b;
  }
  EXPECT_EQ(pulse::bf16_ulp(0x3F80), std::ldexp(1.0f, -7));       // 1.0
  EXPECT_EQ(pulse::bf16_half_ulp(0x3F80), std::ldexp(1.0f, -8));
  EXPECT_EQ(pulse::bf16_ulp(0x0000), std::ldexp(1.0f, -133));     // zero: subnormal spacing
  EXPECT_EQ(pulse::bf16_half_ulp(0x8001), std::ldexp(1.0f, -134));
}

TEST(Bf16Key, MonotoneAndInvertible) {
  std::vector<int> order;  // non-NaN patterns sorted by key
  for (int b = 0; b < 65536; ++b) {
    const bf16_bits bits = static_cast<bf16_bits>(b);
    ASSERT_EQ(pulse::bf16_from_key(pulse::bf16_key(bits)), bits);
    ASSERT_EQ(pulse::bf16_key(pulse::bf16_from_key(bits)), bits);
    if (!std::isnan(value_of(bits))) order.push_back(b);
  }
  std::sort(order.begin(), order.end(), [](int a, int b) {
    return pulse::bf16_key(static_cast<bf16_bits>(a)) < pulse::bf16_key(static_cast<bf16_bits>(b));
  });
  for (std::size_t i = 1; i < order.size(); ++i) {
    const float lo = value_of(static_cast<bf16_bits>(order[i - 1]));
    const float hi = value_of(static_cast<bf16_bits>(order[i]));
    ASSERT_TRUE(lo < hi || (lo == 0 && hi == 0 && std::signbit(lo) && !std::signbit(hi)))
        << std::hex << order[i - 1] << " then " << order[i];
    // Adjacent values in float order have adjacent keys.
    ASSERT_EQ(pulse::bf16_key(static_cast<bf16_bits>(order[i])),
              pulse::bf16_key(static_cast<bf16_bits>(order[i - 1])) + 1);
  }
}

}  // namespace
