#pragma once
// Absorption: an FP32 update u to a weight w cannot move bf16(w) when |u| is below half a BF16
// ulp of bf16(w). Histograms of |u| / half_ulp(bf16(w)) and of |w| in power-of-two bins show
// how far below (or above) that threshold the updates of a step fall. Bins come from the
// floats' exponent bits, so they are exact: no log2(), no division.
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.hpp"
#include "kernels/bf16.hpp"
#include "kernels/types.hpp"

namespace pulse {

// Bins [2^k, 2^(k+1)) for k in [k_min, k_max).
struct Log2Range {
  int k_min;
  int k_max;
};

// Every finite nonzero float lies in [2^-149, 2^128).
constexpr Log2Range all_float_binades{-149, 128};

struct Log2Histogram {
  Log2Range range{0, 0};
  std::vector<index_t> bins;  // bins[j]: values in [2^(range.k_min + j), 2^(range.k_min + j + 1))
  index_t zero = 0;           // exactly zero (either sign)
  index_t below = 0;          // nonzero and under 2^k_min
  index_t above = 0;          // at least 2^k_max
  index_t non_finite = 0;     // see the quantity's description

  index_t total() const {
    index_t sum = zero + below + above + non_finite;
    for (const index_t b : bins) sum += b;
    return sum;
  }
};

struct AbsorptionStats {
  // |u| / half_ulp(bf16(w)); non_finite: w or u is Inf/NaN, or bf16(w) rounds to infinity.
  Log2Histogram ratio;
  // |w|; non_finite: w is Inf/NaN.
  Log2Histogram weight;
  // |u| < half_ulp(bf16(w)) among the elements with a finite ratio, zero updates included.
  index_t absorbed = 0;
};

// floor(log2 |x|) for finite nonzero x, exact for subnormals too.
KOKKOS_INLINE_FUNCTION int floor_log2_abs(float x) {
  const std::uint32_t u = float_to_bits(x) & 0x7FFFFFFFu;
  const int e = static_cast<int>(u >> 23);
  if (e > 0) return e - 127;
  // Subnormal: |x| = m * 2^-149 with m < 2^23, and float(m) is exact and normal.
  return static_cast<int>(float_to_bits(static_cast<float>(u)) >> 23) - 127 - 149;
}

KOKKOS_INLINE_FUNCTION bool is_finite_bits(float x) { return (float_to_bits(x) & 0x7F800000u) != 0x7F800000u; }

namespace detail {

// Slot of a value in a histogram's block of counts: the bins, then zero, below, above,
// non_finite. k is floor(log2 |value|), read only for finite nonzero values.
KOKKOS_INLINE_FUNCTION int log2_slot(const Log2Range r, const bool finite, const bool zero, const int k) {
  const int num_bins = r.k_max - r.k_min;
  if (!finite) return num_bins + 3;
  if (zero) return num_bins;
  if (k < r.k_min) return num_bins + 1;
  if (k >= r.k_max) return num_bins + 2;
  return k - r.k_min;
}

inline Log2Histogram unpack_histogram(const Log2Range r, const index_t* counts) {
  const int num_bins = r.k_max - r.k_min;
  Log2Histogram h;
  h.range = r;
  h.bins.assign(counts, counts + num_bins);
  h.zero = counts[num_bins];
  h.below = counts[num_bins + 1];
  h.above = counts[num_bins + 2];
  h.non_finite = counts[num_bins + 3];
  return h;
}

inline void check_range(const Log2Range r, const char* what) {
  PULSE_CHECK(r.k_min < r.k_max && r.k_max - r.k_min <= 4096,
              std::string(what) + " histogram range [" + std::to_string(r.k_min) + ", " + std::to_string(r.k_max) +
                  ") is empty or has more than 4096 bins");
}

}  // namespace detail

// weights: FP32 weights before the step; updates: FP32 new - old. One pass; bins are counted
// with integer atomics, so the result is the same on every backend.
template <class ExecSpace, class WeightView, class UpdateView>
AbsorptionStats absorption_stats(const ExecSpace& space, const WeightView& weights, const UpdateView& updates,
                                 const Log2Range ratio_range = {-16, 16},
                                 const Log2Range weight_range = all_float_binades) {
  static_assert(std::is_same_v<typename WeightView::non_const_value_type, float>);
  static_assert(std::is_same_v<typename UpdateView::non_const_value_type, float>);
  static_assert(WeightView::rank == 1 && UpdateView::rank == 1);
  PULSE_CHECK(weights.extent(0) == updates.extent(0), "absorption: " + std::to_string(weights.extent(0)) +
                                                          " weights but " + std::to_string(updates.extent(0)) +
                                                          " updates");
  detail::check_range(ratio_range, "update/half-ulp");
  detail::check_range(weight_range, "|w|");
  const int ratio_slots = ratio_range.k_max - ratio_range.k_min + 4;
  const int weight_slots = weight_range.k_max - weight_range.k_min + 4;
  Kokkos::View<index_t*, typename ExecSpace::memory_space> counts("pulse::absorption::counts",
                                                                  ratio_slots + weight_slots);
  index_t absorbed = 0;
  Kokkos::parallel_reduce(
      "pulse::absorption::histogram",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<index_t>>(space, 0, weights.extent(0)),
      KOKKOS_LAMBDA(const index_t i, index_t& absorbed_sum) {
        const float w = weights(i), u = updates(i);
        const bool w_finite = is_finite_bits(w);
        const bool w_zero = (float_to_bits(w) & 0x7FFFFFFFu) == 0;
        Kokkos::atomic_add(&counts(ratio_slots + detail::log2_slot(weight_range, w_finite, w_zero,
                                                                   w_finite && !w_zero ? floor_log2_abs(w) : 0)),
                           index_t(1));

        const float half_ulp = bf16_half_ulp(float_to_bf16(w));  // a power of two when finite
        const bool r_finite = w_finite && is_finite_bits(u) && is_finite_bits(half_ulp);
        const bool u_zero = (float_to_bits(u) & 0x7FFFFFFFu) == 0;
        // |u| / 2^h has exponent floor(log2 |u|) - h: exact, and never under- or overflows.
        const int k = r_finite && !u_zero ? floor_log2_abs(u) - floor_log2_abs(half_ulp) : 0;
        Kokkos::atomic_add(&counts(detail::log2_slot(ratio_range, r_finite, u_zero, k)), index_t(1));
        absorbed_sum += r_finite && (u_zero || k < 0);
      },
      absorbed);

  std::vector<index_t> host(counts.extent(0));
  Kokkos::deep_copy(space, Kokkos::View<index_t*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(host.data(), host.size()),
                    counts);
  space.fence();
  AbsorptionStats stats;
  stats.ratio = detail::unpack_histogram(ratio_range, host.data());
  stats.weight = detail::unpack_histogram(weight_range, host.data() + ratio_slots);
  stats.absorbed = absorbed;
  return stats;
}

}  // namespace pulse
