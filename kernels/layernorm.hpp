#pragma once
// LayerNorm over the last dimension (PyTorch's layer_norm, eps 1e-5): for each of N rows of C,
//   out = (x - mean) * rstd * weight + bias,  rstd = 1 / sqrt(var + eps), var biased.
// The forward keeps mean and rstd per row [N] for the backward, as llm.c does.
#include "kernels/types.hpp"

namespace pulse {

constexpr float layernorm_eps = 1e-5f;

template <class ExecSpace>
void layernorm_forward(const ExecSpace& space, FloatSpan<ExecSpace> out, FloatSpan<ExecSpace> mean,
                       FloatSpan<ExecSpace> rstd, ConstFloatSpan<ExecSpace> inp, ConstFloatSpan<ExecSpace> weight,
                       ConstFloatSpan<ExecSpace> bias, index_t N, int C) {
  Kokkos::parallel_for(
      "pulse::layernorm::forward", FlatPolicy<ExecSpace>(space, 0, N), KOKKOS_LAMBDA(const index_t r) {
        const index_t o = r * C;
        float m = 0.0f;
        for (int c = 0; c < C; ++c) m += inp(o + c);
        m /= C;
        // Two passes: the variance of centred values does not cancel catastrophically.
        float var = 0.0f;
        for (int c = 0; c < C; ++c) {
          const float d = inp(o + c) - m;
          var += d * d;
        }
        const float s = 1.0f / sqrtf(var / C + layernorm_eps);
        for (int c = 0; c < C; ++c) out(o + c) = (inp(o + c) - m) * s * weight(c) + bias(c);
        mean(r) = m;
        rstd(r) = s;
      });
}

// Accumulates into dinp, dweight and dbias. The input gradient is one thread per row; the
// weight and bias gradients are one thread per channel summing rows in order (no atomics).
template <class ExecSpace>
void layernorm_backward(const ExecSpace& space, FloatSpan<ExecSpace> dinp, FloatSpan<ExecSpace> dweight,
                        FloatSpan<ExecSpace> dbias, ConstFloatSpan<ExecSpace> dout, ConstFloatSpan<ExecSpace> inp,
                        ConstFloatSpan<ExecSpace> weight, ConstFloatSpan<ExecSpace> mean,
                        ConstFloatSpan<ExecSpace> rstd, index_t N, int C) {
  Kokkos::parallel_for(
      "pulse::layernorm::backward_input", FlatPolicy<ExecSpace>(space, 0, N), KOKKOS_LAMBDA(const index_t r) {
        const index_t o = r * C;
        const float m = mean(r), s = rstd(r);
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        for (int c = 0; c < C; ++c) {
          const float dnorm = weight(c) * dout(o + c);
          dnorm_mean += dnorm;
          dnorm_norm_mean += dnorm * (inp(o + c) - m) * s;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
        for (int c = 0; c < C; ++c) {
          const float norm = (inp(o + c) - m) * s;
          const float dnorm = weight(c) * dout(o + c);
          dinp(o + c) += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
      });
  Kokkos::parallel_for(
      "pulse::layernorm::backward_params", FlatPolicy<ExecSpace>(space, 0, C), KOKKOS_LAMBDA(const index_t c) {
        float dw = 0.0f, db = 0.0f;
        for (index_t r = 0; r < N; ++r) {
          const float d = dout(r * C + c);
          dw += (inp(r * C + c) - mean(r)) * rstd(r) * d;
          db += d;
        }
        dweight(c) += dw;
        dbias(c) += db;
      });
}

}  // namespace pulse
