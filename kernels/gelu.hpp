#pragma once
// GELU, tanh approximation (GPT-2; PyTorch's gelu(approximate="tanh")):
//   gelu(x) = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
#include "kernels/types.hpp"

namespace pulse {

namespace detail {
constexpr float gelu_scale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float gelu_cubic = 0.044715f;
}  // namespace detail

template <class ExecSpace>
void gelu_forward(const ExecSpace& space, FloatSpan<ExecSpace> out, ConstFloatSpan<ExecSpace> inp, index_t n) {
  Kokkos::parallel_for(
      "pulse::gelu::forward", FlatPolicy<ExecSpace>(space, 0, n), KOKKOS_LAMBDA(const index_t i) {
        const float x = inp(i);
        const float u = detail::gelu_scale * (x + detail::gelu_cubic * x * x * x);
        out(i) = 0.5f * x * (1.0f + tanhf(u));
      });
}

// Accumulates into dinp. sech^2 is taken as 1 - tanh^2, which cannot overflow as cosh can.
template <class ExecSpace>
void gelu_backward(const ExecSpace& space, FloatSpan<ExecSpace> dinp, ConstFloatSpan<ExecSpace> inp,
                   ConstFloatSpan<ExecSpace> dout, index_t n) {
  Kokkos::parallel_for(
      "pulse::gelu::backward", FlatPolicy<ExecSpace>(space, 0, n), KOKKOS_LAMBDA(const index_t i) {
        const float x = inp(i);
        const float th = tanhf(detail::gelu_scale * (x + detail::gelu_cubic * x * x * x));
        const float sech2 = 1.0f - th * th;
        const float local = 0.5f * (1.0f + th) +
                            0.5f * x * sech2 * detail::gelu_scale * (1.0f + 3.0f * detail::gelu_cubic * x * x);
        dinp(i) += local * dout(i);
      });
}

}  // namespace pulse
