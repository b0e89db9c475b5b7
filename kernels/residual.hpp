#pragma once
// Residual connection: out = a + b; the gradient flows unchanged into both branches.
#include "kernels/types.hpp"

namespace pulse {

template <class ExecSpace>
void residual_forward(const ExecSpace& space, FloatSpan<ExecSpace> out, ConstFloatSpan<ExecSpace> a,
                      ConstFloatSpan<ExecSpace> b, index_t n) {
  Kokkos::parallel_for(
      "pulse::residual::forward", FlatPolicy<ExecSpace>(space, 0, n),
      KOKKOS_LAMBDA(const index_t i) { out(i) = a(i) + b(i); });
}

// Accumulates dout into da and db.
template <class ExecSpace>
void residual_backward(const ExecSpace& space, FloatSpan<ExecSpace> da, FloatSpan<ExecSpace> db,
                       ConstFloatSpan<ExecSpace> dout, index_t n) {
  Kokkos::parallel_for(
      "pulse::residual::backward", FlatPolicy<ExecSpace>(space, 0, n), KOKKOS_LAMBDA(const index_t i) {
        da(i) += dout(i);
        db(i) += dout(i);
      });
}

}  // namespace pulse
