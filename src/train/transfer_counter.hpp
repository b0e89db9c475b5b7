#pragma once
// Bytes a step moves between host and device memory. Copies made through these helpers are
// counted by what a device build moves over the bus, also on a host build where the default
// memory space is host memory and the copy is a plain memcpy (or nothing), so /steps/d2h_bytes
// and /steps/h2d_bytes read the same on both.
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/host_copy.hpp"

namespace pulse {

struct TransferCounter {
  std::uint64_t d2h_bytes = 0;  // device -> host
  std::uint64_t h2d_bytes = 0;  // host -> device

  template <class View>
  std::vector<typename View::non_const_value_type> to_host(const View& view) {
    d2h_bytes += view.extent(0) * sizeof(typename View::non_const_value_type);
    return pulse::to_host(view);
  }
  template <class T>
  Kokkos::View<T*, DefaultMem> to_device(const std::vector<T>& host, const std::string& label = "pulse::to_device") {
    h2d_bytes += host.size() * sizeof(T);
    return pulse::to_device(host, label);
  }
  // Host data that an API copies to the device itself (a rollout batch, a token table).
  void uploaded(std::uint64_t bytes) { h2d_bytes += bytes; }
  void downloaded(std::uint64_t bytes) { d2h_bytes += bytes; }
};

}  // namespace pulse
