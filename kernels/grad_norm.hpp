#pragma once
// Gradient-norm clipping as torch.nn.utils.clip_grad_norm_ (PyTorch 1.13) does it:
//   norm_t = ||g_t||_2 per tensor, total = ||(norm_0, norm_1, ...)||_2,
//   coef = min(1, max_norm * (1 / (total + 1e-6))), then every gradient is multiplied by coef
// (pulse folds that multiply into the AdamW pass through AdamWScalars::grad_scale).
// Sums of squares accumulate in double, each segment in index order and segments in order,
// so the result is the same on every backend and close to correctly rounded; PyTorch sums in
// FP32 lanes, so its norm can differ from ours in the last bit.
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/segments.hpp"
#include "kernels/sparsity.hpp"

namespace pulse {

struct GradNorm {
  std::vector<float> per_tensor;  // in the precision of the gradients (BF16 values for bf16)
  float total = 0.0f;
  std::vector<index_t> small;     // per threshold asked for: elements with |g| <= tau (count_small's)
};

// The most thresholds grad_norm counts in its pass.
inline constexpr std::size_t grad_norm_max_thresholds = 4;

namespace detail {

// Up to grad_norm_max_thresholds thresholds; the unused ones -inf, which no |g| is at or below.
struct SmallThresholds {
  float tau[grad_norm_max_thresholds];
};

// Per segment k: partial(k) = the sum of squares in index order and, with Count, small(k, j) =
// the count of |g| <= tau[j]. The counts ride on the sum's serial chain of double additions, which
// bounds the loop, so the gradient is read once for both.
template <bool Count, class ExecSpace, class Mem, class GradView>
void grad_norm_partials(const ExecSpace& space, const TensorSegments<Mem>& segs, const GradView& grad,
                        const SmallThresholds& taus, const Kokkos::View<accum_t*, Mem>& partial,
                        const Kokkos::View<index_t* [grad_norm_max_thresholds], Mem>& small) {
  using value_type = typename GradView::non_const_value_type;
  const auto segments = segs.segments;
  // One segment per iteration, summed in order: a fixed order on every backend.
  Kokkos::parallel_for(
      "pulse::grad_norm::segments", Kokkos::RangePolicy<ExecSpace>(space, 0, segments.extent(0)),
      KOKKOS_LAMBDA(const index_t k) {
        accum_t sum = 0;
        index_t c[grad_norm_max_thresholds] = {};
        for (index_t i = segments(k).begin; i < segments(k).end; ++i) {
          // Read outside if constexpr: nvcc rejects an extended lambda whose first use of a
          // captured view is inside it.
          const value_type gi = grad(i);
          float g;
          if constexpr (std::is_same_v<value_type, float>) g = gi;
          else g = bf16_to_float(gi);
          sum += accum_t(g) * accum_t(g);
          if (Count) {
            const float a = abs_bits(g);
            for (std::size_t j = 0; j < grad_norm_max_thresholds; ++j) c[j] += a <= taus.tau[j] ? 1 : 0;
          }
        }
        partial(k) = sum;
        if (Count)
          for (std::size_t j = 0; j < grad_norm_max_thresholds; ++j) small(k, j) = c[j];
      });
}

}  // namespace detail

// thresholds (FP32 gradients only, at most grad_norm_max_thresholds): also count the elements
// with |g| <= tau for each, in the same pass (GradNorm::small).
template <class ExecSpace, class Mem, class GradView>
GradNorm grad_norm(const ExecSpace& space, const TensorSegments<Mem>& segs, const GradView& grad,
                   Precision precision, const std::vector<float>& thresholds = {}) {
  using value_type = typename GradView::non_const_value_type;
  static_assert(std::is_same_v<value_type, float> || std::is_same_v<value_type, bf16_bits>);
  PULSE_CHECK(grad.extent(0) == std::size_t(segs.num_elements), "grad_norm: gradient size differs from the tensor table");
  constexpr bool fp32 = std::is_same_v<value_type, float>;
  PULSE_CHECK(thresholds.empty() || fp32, "grad_norm: thresholds on an FP32 gradient only");
  PULSE_CHECK(thresholds.size() <= grad_norm_max_thresholds,
              "grad_norm: at most " + std::to_string(grad_norm_max_thresholds) + " thresholds");
  detail::SmallThresholds taus;
  for (std::size_t j = 0; j < grad_norm_max_thresholds; ++j) {
    taus.tau[j] = j < thresholds.size() ? thresholds[j] : -INFINITY;
    PULSE_CHECK(!std::isnan(taus.tau[j]), "gradient threshold is NaN");
  }
  const auto segments = segs.segments;
  const std::size_t num_segments = segments.extent(0);
  Kokkos::View<accum_t*, Mem> partial(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "pulse::grad_norm::partial"),
                                      num_segments);
  Kokkos::View<index_t* [grad_norm_max_thresholds], Mem> small(
      Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "pulse::grad_norm::small"),
      thresholds.empty() ? 0 : num_segments);
  if (thresholds.empty()) detail::grad_norm_partials<false>(space, segs, grad, taus, partial, small);
  else detail::grad_norm_partials<true>(space, segs, grad, taus, partial, small);
  auto partial_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), partial);
  auto segments_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), segments);
  std::vector<accum_t> sum_sq(segs.num_tensors, 0.0);
  for (std::size_t k = 0; k < segments_host.extent(0); ++k) sum_sq[segments_host(k).tensor] += partial_host(k);

  auto to_precision = [precision](accum_t x) {
    const float f = static_cast<float>(x);
    return precision == Precision::bf16 ? round_to_bf16(f) : f;
  };
  GradNorm out;
  if (!thresholds.empty()) {
    auto small_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), small);
    out.small.assign(thresholds.size(), 0);
    for (std::size_t k = 0; k < num_segments; ++k)
      for (std::size_t j = 0; j < thresholds.size(); ++j) out.small[j] += small_host(k, j);
  }
  accum_t total_sq = 0;
  for (accum_t s : sum_sq) {
    out.per_tensor.push_back(to_precision(std::sqrt(s)));
    total_sq += accum_t(out.per_tensor.back()) * out.per_tensor.back();
  }
  out.total = to_precision(std::sqrt(total_sq));
  return out;
}

// clip_grad_norm_'s coefficient from the total norm, op by op in the gradients' precision.
inline float clip_coefficient(float total_norm, double max_norm, Precision precision) {
  auto r = [precision](float x) { return precision == Precision::bf16 ? round_to_bf16(x) : x; };
  const float shifted = r(total_norm + r(static_cast<float>(1e-6)));
  const float coef = r(r(1.0f / shifted) * r(static_cast<float>(max_norm)));
  return coef > 1.0f ? 1.0f : coef;  // NaN stays NaN, as torch.clamp keeps it
}

}  // namespace pulse
