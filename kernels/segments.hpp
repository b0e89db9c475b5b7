#pragma once
// Tensor segments: the flat parameter buffer cut at tensor boundaries into pieces of at most
// max_length elements. One team per segment lets a single kernel pass over the whole buffer
// still know which tensor each element belongs to (per-tensor weight decay, per-tensor counts).
#include <algorithm>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "kernels/types.hpp"

namespace pulse {

struct Segment {
  index_t begin;  // first flat index
  index_t end;    // one past the last flat index
  int tensor;     // position in the tensor table
};

template <class MemSpace = DefaultMem>
struct TensorSegments {
  Kokkos::View<const Segment*, MemSpace> segments;
  int num_tensors = 0;
  index_t num_elements = 0;
};

constexpr index_t default_segment_length = index_t(1) << 15;

// offsets: num_tensors + 1 non-decreasing flat offsets, offsets[0] == 0. Empty tensors get no
// segment but keep their place in per-tensor results.
template <class MemSpace = DefaultMem>
TensorSegments<MemSpace> make_segments(const std::vector<index_t>& offsets,
                                       index_t max_length = default_segment_length) {
  PULSE_CHECK(!offsets.empty() && offsets.front() == 0, "tensor offsets must start at 0");
  PULSE_CHECK(max_length > 0, "segment length must be positive, got " + std::to_string(max_length));
  std::vector<Segment> host;
  for (std::size_t t = 0; t + 1 < offsets.size(); ++t) {
    PULSE_CHECK(offsets[t + 1] >= offsets[t], "tensor offsets decrease at tensor " + std::to_string(t));
    for (index_t b = offsets[t]; b < offsets[t + 1]; b += max_length)
      host.push_back({b, std::min(b + max_length, offsets[t + 1]), static_cast<int>(t)});
  }
  Kokkos::View<Segment*, MemSpace> device(Kokkos::view_alloc(Kokkos::WithoutInitializing, "pulse::segments"),
                                          host.size());
  Kokkos::deep_copy(device, Kokkos::View<const Segment*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                                host.data(), host.size()));
  return {device, static_cast<int>(offsets.size()) - 1, offsets.back()};
}

// Host backends run one thread per segment over a plain loop, which the compiler vectorises,
// and scan blocks of elements; devices run a team per segment and scan element by element.
// A build with the CMake option PULSE_FORCE_DEVICE_PATHS sends host backends down the device
// paths too, so that those paths run (and are checked bit for bit) in CI, without a GPU.
#ifdef PULSE_FORCE_DEVICE_PATHS
inline constexpr bool force_device_paths = true;
#else
inline constexpr bool force_device_paths = false;
#endif

// Host execution spaces are those that can reach host memory (a CUDA build with UVM has a
// host-accessible memory space, but its kernels still run on the device).
template <class ExecSpace>
constexpr bool is_host_space = Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible;

template <class ExecSpace>
constexpr bool takes_host_path = !force_device_paths && is_host_space<ExecSpace>;

// Devices size their teams with Kokkos::AUTO. Forced onto a host backend, AUTO would mean one
// thread per team (Kokkos::OpenMP's choice), so a team there takes every thread of the space:
// the team reductions then really combine several members' partial sums.
template <class ExecSpace, class Mem>
Kokkos::TeamPolicy<ExecSpace> segment_policy(const ExecSpace& space, const TensorSegments<Mem>& segs) {
  const auto league = static_cast<int>(segs.segments.extent(0));
  if constexpr (takes_host_path<ExecSpace>)
    return Kokkos::TeamPolicy<ExecSpace>(space, league, 1);
  else if constexpr (is_host_space<ExecSpace>) {
    const int largest = Kokkos::TeamPolicy<ExecSpace>(space, league, 1)
                            .team_size_max([](const typename Kokkos::TeamPolicy<ExecSpace>::member_type&) {},
                                           Kokkos::ParallelForTag());
    return Kokkos::TeamPolicy<ExecSpace>(space, league, std::min(space.concurrency(), largest));
  } else
    return Kokkos::TeamPolicy<ExecSpace>(space, league, Kokkos::AUTO);
}

// Calls body(i) for every element of the segment, by the whole team, and returns the sum of
// what it returns (an integer count, so the result is the same on every backend).
template <class ExecSpace, class Team, class Body>
KOKKOS_INLINE_FUNCTION index_t segment_sum(const Team& team, const Segment& seg, const Body& body) {
  index_t sum = 0;
  if constexpr (takes_host_path<ExecSpace>) {
    for (index_t i = seg.begin; i < seg.end; ++i) sum += body(i);
  } else {
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, seg.begin, seg.end), [&](const index_t i, index_t& acc) { acc += body(i); },
        sum);
  }
  return sum;
}

// A whole buffer as one tensor.
template <class MemSpace = DefaultMem>
TensorSegments<MemSpace> make_segments(index_t num_elements) {
  return make_segments<MemSpace>(std::vector<index_t>{0, num_elements});
}

}  // namespace pulse
