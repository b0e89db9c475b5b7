#pragma once
// The PULSELoCo gate: an FP32 pseudo-gradient entry s(i) is sent only if applying it would change
// what the next BF16 forward pass sees, i.e. bf16(theta - s) differs from bf16(theta) in bits.
// Entries that do not fire stay in the error-feedback buffer.
#include <cstdint>
#include <type_traits>

#include "core/error.hpp"
#include "kernels/bf16.hpp"
#include "kernels/sparsity.hpp"
#include "kernels/types.hpp"

namespace pulse {

// theta - s is one rounded FP32 subtraction, never fused (the build passes -ffp-contract=off
// and --fmad=false), so host, device and PyTorch agree.
KOKKOS_INLINE_FUNCTION bool gate_fires(const float theta, const float s) {
  return float_to_bf16(theta) != float_to_bf16(theta - s);
}

namespace detail {

template <class ThetaView, class SView>
void check_gate_inputs(const ThetaView& theta, const SView& s) {
  static_assert(std::is_same_v<typename ThetaView::non_const_value_type, float>);
  static_assert(std::is_same_v<typename SView::non_const_value_type, float>);
  static_assert(ThetaView::rank == 1 && SView::rank == 1);
  PULSE_CHECK(theta.extent(0) == s.extent(0), "gate: " + std::to_string(theta.extent(0)) + " weights but " +
                                                  std::to_string(s.extent(0)) + " pseudo-gradient entries");
}

}  // namespace detail

// mask_out(i) = 1 where the gate fires, else 0; returns the number fired.
template <class ExecSpace, class ThetaView, class SView, class MaskView>
index_t gate_mask(const ExecSpace& space, const ThetaView& theta, const SView& s, const MaskView& mask_out) {
  detail::check_gate_inputs(theta, s);
  static_assert(std::is_same_v<typename MaskView::value_type, std::uint8_t>);
  PULSE_CHECK(mask_out.extent(0) == theta.extent(0), "gate mask holds " + std::to_string(mask_out.extent(0)) +
                                                         " entries for " + std::to_string(theta.extent(0)) +
                                                         " weights");
  index_t fired = 0;
  Kokkos::parallel_reduce(
      "pulse::gate::mask", FlatPolicy<ExecSpace>(space, 0, theta.extent(0)),
      KOKKOS_LAMBDA(const index_t i, index_t& count) {
        const bool fire = gate_fires(theta(i), s(i));
        mask_out(i) = fire;
        count += fire;
      },
      fired);
  return fired;
}

// Sorted indices where the gate fires and the FP32 s values to send there. Capacity contract
// as compact_if: returns the true count, writes at most the outputs' extent.
template <class ExecSpace, class ThetaView, class SView, class IndexView, class ValueView>
index_t compact_fired(const ExecSpace& space, const ThetaView& theta, const SView& s, const IndexView& indices_out,
                      const ValueView& values_out) {
  detail::check_gate_inputs(theta, s);
  static_assert(std::is_same_v<typename ValueView::value_type, float>);
  return compact_if(
      space, "pulse::gate::compact", static_cast<index_t>(theta.extent(0)),
      KOKKOS_LAMBDA(const index_t i) { return gate_fires(theta(i), s(i)); },
      KOKKOS_LAMBDA(const index_t i) { return s(i); }, indices_out, values_out);
}

}  // namespace pulse
