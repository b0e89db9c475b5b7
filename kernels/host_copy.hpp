#pragma once
// Copies between host std::vectors and Kokkos views in any memory space: small tables
// (offsets, masks, thresholds) going to the device and results coming back.
#include <string>
#include <vector>

#include "kernels/types.hpp"

namespace pulse {

template <class Mem = DefaultMem, class T>
Kokkos::View<T*, Mem> to_device(const std::vector<T>& host, const std::string& label = "pulse::to_device") {
  Kokkos::View<T*, Mem> device(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), host.size());
  Kokkos::deep_copy(device, Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(host.data(), host.size()));
  return device;
}

template <class View>
std::vector<typename View::non_const_value_type> to_host(const View& view) {
  using T = typename View::non_const_value_type;
  static_assert(View::rank == 1);
  std::vector<T> host(view.extent(0));
  Kokkos::deep_copy(Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(host.data(), host.size()), view);
  return host;
}

}  // namespace pulse
