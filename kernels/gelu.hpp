#pragma once
// GELU, tanh approximation (GPT-2; PyTorch's gelu(approximate="tanh")):
//   gelu(x) = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
// tanh is pulse's own (detail::gelu_tanh), in plain float arithmetic, so host loops vectorise
// (libm's tanhf is a call per element: 23% of a tiny SFT step, measured with perf) and every
// CPU and backend computes the same bits.
#include <cstdint>
#include <cstring>

#include "kernels/types.hpp"

namespace pulse {

namespace detail {
constexpr float gelu_scale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float gelu_cubic = 0.044715f;

// tanh(u) = sign(u) (1 - e) / (1 + e) with e = exp(-2|u|) = 2^k exp(r), k = round(-2|u| / ln 2),
// r = -2|u| - k ln 2 (ln 2 in two parts, so k * hi is exact), |r| <= ln2/2, and exp(r) by its
// Taylor polynomial to r^7 (truncation below 1e-8 relative). |u| >= 9 gives 1 (tanh(9) rounds
// to 1 in float). Absolute error 8.9e-8 on a 1e-4 grid over [-20, 20] against tanh in double
// (libm's tanhf: 9.7e-8), which is what 1 + tanh and 1 - tanh^2 need; test_model_layers checks
// it. NaN gives 1, but GELU's factor x carries the NaN on.
KOKKOS_INLINE_FUNCTION float gelu_tanh(float u) {
  const float abs_u = u < 0 ? -u : u;
  const float x = -2.0f * (abs_u < 9.0f ? abs_u : 9.0f);  // in [-18, 0]
  // Round to nearest by adding and subtracting 1.5 * 2^23 (floorf does not vectorise here).
  const float kf = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - kf * 0.693145751953125f) - kf * 1.42860682030941723e-6f;
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const std::int32_t exponent_bits = (static_cast<std::int32_t>(kf) + 127) << 23;  // 2^k, k in [-26, 0]
  float two_to_k;
  std::memcpy(&two_to_k, &exponent_bits, sizeof two_to_k);
  const float e = p * two_to_k;
  const float th = (1.0f - e) / (1.0f + e);
  return u < 0 ? -th : th;
}
}  // namespace detail

template <class ExecSpace>
void gelu_forward(const ExecSpace& space, FloatSpan<ExecSpace> out, ConstFloatSpan<ExecSpace> inp, index_t n) {
  Kokkos::parallel_for(
      "pulse::gelu::forward", FlatPolicy<ExecSpace>(space, 0, n), KOKKOS_LAMBDA(const index_t i) {
        const float x = inp(i);
        const float u = detail::gelu_scale * (x + detail::gelu_cubic * x * x * x);
        out(i) = 0.5f * x * (1.0f + detail::gelu_tanh(u));
      });
}

// Accumulates into dinp. sech^2 is taken as 1 - tanh^2, which cannot overflow as cosh can.
template <class ExecSpace>
void gelu_backward(const ExecSpace& space, FloatSpan<ExecSpace> dinp, ConstFloatSpan<ExecSpace> inp,
                   ConstFloatSpan<ExecSpace> dout, index_t n) {
  Kokkos::parallel_for(
      "pulse::gelu::backward", FlatPolicy<ExecSpace>(space, 0, n), KOKKOS_LAMBDA(const index_t i) {
        const float x = inp(i);
        const float th = detail::gelu_tanh(detail::gelu_scale * (x + detail::gelu_cubic * x * x * x));
        const float sech2 = 1.0f - th * th;
        const float local = 0.5f * (1.0f + th) +
                            0.5f * x * sech2 * detail::gelu_scale * (1.0f + 3.0f * detail::gelu_cubic * x * x);
        dinp(i) += local * dout(i);
      });
}

}  // namespace pulse
