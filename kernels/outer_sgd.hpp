#pragma once
// The outer optimizer of DiLoCo / PULSELoCo: SGD with Nesterov momentum on the FP32 global
// weights, bit for bit what torch.optim.SGD(nesterov=True, foreach=False) of PyTorch 1.13 does
// with the averaged pseudo-gradient g as .grad:
//   buf = g                      (first step: PyTorch clones the gradient)
//   buf = mu * buf + g           (later steps: mul_ then add_, two roundings)
//   d   = fmaf(buf, mu, g)       (add(buf, alpha=mu): PyTorch's vector kernel fuses)
//   p   = fmaf(d, -lr, p)        (add_(d, alpha=-lr))
// The average g = sum / trainers is one FP32 division, as sum.div_(trainers).
#include <cmath>
#include <type_traits>

#include "core/error.hpp"
#include "kernels/types.hpp"

namespace pulse {

struct OuterSgdScalars {
  float lr;
  float momentum;
  float trainers;  // the divisor of the summed pseudo-gradient
  bool nesterov;
  bool first_step;
};

KOKKOS_INLINE_FUNCTION void outer_sgd_element(const OuterSgdScalars& s, const float summed, float& theta,
                                              float& buf) {
  const float g = summed / s.trainers;
  buf = s.first_step ? g : s.momentum * buf + g;
  const float d = s.nesterov ? fmaf(buf, s.momentum, g) : buf;
  theta = fmaf(d, -s.lr, theta);
}

// theta and momentum are updated in place from the rank-order sum of the trainers'
// pseudo-gradients (the same values on every trainer, so every trainer gets the same theta).
template <class ExecSpace, class ThetaView, class MomentumView, class SumView>
void outer_sgd(const ExecSpace& space, const OuterSgdScalars& scalars, const ThetaView& theta,
               const MomentumView& momentum, const SumView& summed) {
  static_assert(std::is_same_v<typename ThetaView::value_type, float>);
  static_assert(std::is_same_v<typename MomentumView::value_type, float>);
  static_assert(std::is_same_v<typename SumView::non_const_value_type, float>);
  PULSE_CHECK(theta.extent(0) == momentum.extent(0) && theta.extent(0) == summed.extent(0),
              "outer SGD: " + std::to_string(theta.extent(0)) + " weights, " + std::to_string(momentum.extent(0)) +
                  " momentum entries, " + std::to_string(summed.extent(0)) + " pseudo-gradient entries");
  PULSE_CHECK(scalars.trainers >= 1, "outer SGD: averaging over " + std::to_string(scalars.trainers) + " trainers");
  Kokkos::parallel_for(
      "pulse::outer_sgd", FlatPolicy<ExecSpace>(space, 0, theta.extent(0)),
      KOKKOS_LAMBDA(const index_t i) { outer_sgd_element(scalars, summed(i), theta(i), momentum(i)); });
}

}  // namespace pulse
