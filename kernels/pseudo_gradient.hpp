#pragma once
// Pseudo-gradients of DiLoCo / PULSELoCo: how far H inner steps moved a trainer away from the
// global weights, delta = theta_g - theta_l, and PULSELoCo's error feedback, which carries
// what the gate did not send into the next outer step: s = e + delta; e = s; e[fired] = 0.
#include <type_traits>

#include "core/error.hpp"
#include "kernels/types.hpp"

namespace pulse {

namespace detail {

template <class A, class B, class C>
void check_pseudo_gradient_views(const A& theta_global, const B& theta_local, const C& out) {
  static_assert(std::is_same_v<typename A::non_const_value_type, float>);
  static_assert(std::is_same_v<typename B::non_const_value_type, float>);
  static_assert(std::is_same_v<typename C::value_type, float>);
  PULSE_CHECK(theta_global.extent(0) == theta_local.extent(0) && theta_global.extent(0) == out.extent(0),
              "pseudo-gradient: " + std::to_string(theta_global.extent(0)) + " global weights, " +
                  std::to_string(theta_local.extent(0)) + " local weights, " + std::to_string(out.extent(0)) +
                  " outputs");
}

}  // namespace detail

// delta(i) = theta_global(i) - theta_local(i), one rounded FP32 subtraction.
template <class ExecSpace, class GlobalView, class LocalView, class DeltaView>
void pseudo_gradient(const ExecSpace& space, const GlobalView& theta_global, const LocalView& theta_local,
                     const DeltaView& delta) {
  detail::check_pseudo_gradient_views(theta_global, theta_local, delta);
  Kokkos::parallel_for(
      "pulse::pseudo_gradient", FlatPolicy<ExecSpace>(space, 0, delta.extent(0)),
      KOKKOS_LAMBDA(const index_t i) { delta(i) = theta_global(i) - theta_local(i); });
}

// error(i) = error(i) + (theta_global(i) - theta_local(i)): the error buffer becomes s.
template <class ExecSpace, class GlobalView, class LocalView, class ErrorView>
void add_pseudo_gradient(const ExecSpace& space, const GlobalView& theta_global, const LocalView& theta_local,
                         const ErrorView& error) {
  detail::check_pseudo_gradient_views(theta_global, theta_local, error);
  Kokkos::parallel_for(
      "pulse::pseudo_gradient::feedback", FlatPolicy<ExecSpace>(space, 0, error.extent(0)),
      KOKKOS_LAMBDA(const index_t i) { error(i) = error(i) + (theta_global(i) - theta_local(i)); });
}

// error(sent(k)) = +0 for the first count sent indices: what was sent leaves the buffer.
template <class ExecSpace, class IndexView, class ErrorView>
void clear_sent(const ExecSpace& space, const IndexView& sent, const index_t count, const ErrorView& error) {
  static_assert(std::is_same_v<typename IndexView::non_const_value_type, index_t>);
  PULSE_CHECK(count >= 0 && count <= static_cast<index_t>(sent.extent(0)),
              "clear_sent: " + std::to_string(count) + " indices of " + std::to_string(sent.extent(0)));
  Kokkos::parallel_for(
      "pulse::pseudo_gradient::clear_sent", FlatPolicy<ExecSpace>(space, 0, count),
      KOKKOS_LAMBDA(const index_t k) { error(sent(k)) = 0.0f; });
}

}  // namespace pulse
