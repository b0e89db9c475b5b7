#pragma once
// Gradient-norm clipping as torch.nn.utils.clip_grad_norm_ (PyTorch 1.13) does it:
//   norm_t = ||g_t||_2 per tensor, total = ||(norm_0, norm_1, ...)||_2,
//   coef = min(1, max_norm * (1 / (total + 1e-6))), then every gradient is multiplied by coef
// (pulse folds that multiply into the AdamW pass through AdamWScalars::grad_scale).
// Sums of squares accumulate in double, each segment in index order and segments in order,
// so the result is the same on every backend and close to correctly rounded; PyTorch sums in
// FP32 lanes, so its norm can differ from ours in the last bit.
#include <cmath>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/segments.hpp"

namespace pulse {

struct GradNorm {
  std::vector<float> per_tensor;  // in the precision of the gradients (BF16 values for bf16)
  float total = 0.0f;
};

template <class ExecSpace, class Mem, class GradView>
GradNorm grad_norm(const ExecSpace& space, const TensorSegments<Mem>& segs, const GradView& grad,
                   Precision precision) {
  using value_type = typename GradView::non_const_value_type;
  static_assert(std::is_same_v<value_type, float> || std::is_same_v<value_type, bf16_bits>);
  PULSE_CHECK(grad.extent(0) == std::size_t(segs.num_elements), "grad_norm: gradient size differs from the tensor table");
  const auto segments = segs.segments;
  Kokkos::View<accum_t*, Mem> partial(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "pulse::grad_norm::partial"),
                                      segments.extent(0));
  // One segment per iteration, summed in order: a fixed order on every backend.
  Kokkos::parallel_for(
      "pulse::grad_norm::segments", Kokkos::RangePolicy<ExecSpace>(space, 0, segments.extent(0)),
      KOKKOS_LAMBDA(const index_t k) {
        accum_t sum = 0;
        for (index_t i = segments(k).begin; i < segments(k).end; ++i) {
          // Read outside if constexpr: nvcc rejects an extended lambda whose first use of a
          // captured view is inside it.
          const value_type gi = grad(i);
          float g;
          if constexpr (std::is_same_v<value_type, float>) g = gi;
          else g = bf16_to_float(gi);
          sum += accum_t(g) * accum_t(g);
        }
        partial(k) = sum;
      });
  auto partial_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), partial);
  auto segments_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), segments);
  std::vector<accum_t> sum_sq(segs.num_tensors, 0.0);
  for (std::size_t k = 0; k < segments_host.extent(0); ++k) sum_sq[segments_host(k).tensor] += partial_host(k);

  auto to_precision = [precision](accum_t x) {
    const float f = static_cast<float>(x);
    return precision == Precision::bf16 ? round_to_bf16(f) : f;
  };
  GradNorm out;
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
