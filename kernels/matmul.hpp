#pragma once
// Linear layer as torch.nn.Linear stores it: out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias[OC].
// The products go through pulse::gemm (OpenBLAS or cuBLAS); an empty bias view means no bias.
#include "kernels/gemm.hpp"

namespace pulse {

namespace detail {
template <class ExecSpace, class T>
using Matrix = Kokkos::View<T**, Kokkos::LayoutRight, typename ExecSpace::memory_space, Kokkos::MemoryUnmanaged>;

template <class ExecSpace, class Span>
auto as_matrix(const Span& x, index_t rows, index_t cols) {
  PULSE_CHECK(static_cast<index_t>(x.extent(0)) == rows * cols,
              "matmul: a view of " + std::to_string(x.extent(0)) + " elements is not " + std::to_string(rows) +
                  "x" + std::to_string(cols));
  return Matrix<ExecSpace, typename Span::value_type>(x.data(), rows, cols);
}

// out[N,OC] = bias[OC] in every row. The host path copies row by row (a 64-bit i % OC per
// element cost 8% of a step).
template <class ExecSpace>
void fill_with_bias(const ExecSpace& space, FloatSpan<ExecSpace> out, ConstFloatSpan<ExecSpace> bias, int N, int OC) {
  if constexpr (is_host_space<ExecSpace>) {
    if (takes_host_path(space)) {
      Kokkos::parallel_for(
          "pulse::matmul::bias", FlatPolicy<ExecSpace>(space, 0, N), [=](const index_t n) {
            for (index_t o = 0; o < OC; ++o) out(n * OC + o) = bias(o);
          });
      return;
    }
  }
  Kokkos::parallel_for(
      "pulse::matmul::bias", FlatPolicy<ExecSpace>(space, 0, index_t(N) * OC),
      KOKKOS_LAMBDA(const index_t i) { out(i) = bias(i % OC); });
}

}  // namespace detail

template <class ExecSpace>
void matmul_forward(const ExecSpace& space, FloatSpan<ExecSpace> out, ConstFloatSpan<ExecSpace> inp,
                    ConstFloatSpan<ExecSpace> weight, ConstFloatSpan<ExecSpace> bias, int N, int C, int OC) {
  const bool has_bias = bias.extent(0) != 0;
  // Start C at the bias and let the GEMM add the product to it (beta = 1): one pass fewer.
  if (has_bias) detail::fill_with_bias(space, out, bias, N, OC);
  gemm(space, Transpose::no, Transpose::yes, N, OC, C, 1.0f, detail::as_matrix<ExecSpace>(inp, N, C),
       detail::as_matrix<ExecSpace>(weight, OC, C), has_bias ? 1.0f : 0.0f, detail::as_matrix<ExecSpace>(out, N, OC));
}

// Accumulates dinp += dout @ weight, dweight += dout^T @ inp and dbias += column sums of dout
// (skipped when dbias is empty).
template <class ExecSpace>
void matmul_backward(const ExecSpace& space, FloatSpan<ExecSpace> dinp, FloatSpan<ExecSpace> dweight,
                     FloatSpan<ExecSpace> dbias, ConstFloatSpan<ExecSpace> dout, ConstFloatSpan<ExecSpace> inp,
                     ConstFloatSpan<ExecSpace> weight, int N, int C, int OC) {
  const auto dout_m = detail::as_matrix<ExecSpace>(dout, N, OC);
  gemm(space, Transpose::no, Transpose::no, N, C, OC, 1.0f, dout_m, detail::as_matrix<ExecSpace>(weight, OC, C), 1.0f,
       detail::as_matrix<ExecSpace>(dinp, N, C));
  gemm(space, Transpose::yes, Transpose::no, OC, C, N, 1.0f, dout_m, detail::as_matrix<ExecSpace>(inp, N, C), 1.0f,
       detail::as_matrix<ExecSpace>(dweight, OC, C));
  if (dbias.extent(0) != 0) {
    // One thread per output channel summing rows in order: no atomics, the same on every backend.
    Kokkos::parallel_for(
        "pulse::matmul::backward_bias", FlatPolicy<ExecSpace>(space, 0, OC), KOKKOS_LAMBDA(const index_t o) {
          float sum = 0.0f;
          for (index_t n = 0; n < N; ++n) sum += dout(n * OC + o);
          dbias(o) += sum;
        });
  }
}

}  // namespace pulse
