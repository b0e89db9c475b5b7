#pragma once
// Tensor segments: the flat parameter buffer cut at tensor boundaries into pieces of at most
// max_length elements. One team per segment lets a single kernel pass over the whole buffer
// still know which tensor each element belongs to (per-tensor weight decay, per-tensor counts).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
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
// Host backends can be sent down the device paths too, so that those paths run (and are checked
// bit for bit against the host paths) without a GPU: a process-wide setting, initially on when
// the environment variable PULSE_FORCE_DEVICE_PATHS is set and not "0".
namespace detail {
inline bool forced_by_environment(const char* value) { return value != nullptr && std::strcmp(value, "0") != 0; }

inline std::atomic<bool>& device_paths_forced_setting() {
  static std::atomic<bool> forced(forced_by_environment(std::getenv("PULSE_FORCE_DEVICE_PATHS")));
  return forced;
}
}  // namespace detail

inline bool device_paths_forced() { return detail::device_paths_forced_setting().load(std::memory_order_relaxed); }
inline void set_device_paths_forced(bool forced) {
  detail::device_paths_forced_setting().store(forced, std::memory_order_relaxed);
}

// Host execution spaces are those that can reach host memory (a CUDA build with UVM has a
// host-accessible memory space, but its kernels still run on the device).
template <class ExecSpace>
constexpr bool is_host_space = Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible;

// Whether a launch on this space takes the host path. Read on the host once per launch and
// captured by value: a kernel never reads the setting itself. Host branches sit under
// `if constexpr (is_host_space<ExecSpace>)`, so device code holds none.
template <class ExecSpace>
bool takes_host_path(const ExecSpace&) {
  if constexpr (is_host_space<ExecSpace>)
    return !device_paths_forced();
  else
    return false;
}

// host_path: takes_host_path(space), passed along to the kernel's segment_sum or segment_stage.
// Devices size their teams with Kokkos::AUTO. On a host backend's device path AUTO would mean one
// thread per team (Kokkos::OpenMP's choice), so a team there takes every thread of the space:
// the team reductions then really combine several members' partial sums.
template <class ExecSpace, class Mem>
Kokkos::TeamPolicy<ExecSpace> segment_policy(const ExecSpace& space, const TensorSegments<Mem>& segs,
                                             [[maybe_unused]] const bool host_path) {
  const auto league = static_cast<int>(segs.segments.extent(0));
  if constexpr (is_host_space<ExecSpace>) {
    if (host_path) return Kokkos::TeamPolicy<ExecSpace>(space, league, 1);
    const int largest = Kokkos::TeamPolicy<ExecSpace>(space, league, 1)
                            .team_size_max([](const typename Kokkos::TeamPolicy<ExecSpace>::member_type&) {},
                                           Kokkos::ParallelForTag());
    return Kokkos::TeamPolicy<ExecSpace>(space, league, std::min(space.concurrency(), largest));
  } else {
    return Kokkos::TeamPolicy<ExecSpace>(space, league, Kokkos::AUTO);
  }
}

// Calls body(i) for every element of the segment, by the whole team, and returns the sum of
// what it returns (an integer count, so the result is the same on every backend). host_path:
// as given to segment_policy.
template <class ExecSpace, class Team, class Body>
KOKKOS_INLINE_FUNCTION index_t segment_sum(const Team& team, const Segment& seg, [[maybe_unused]] const bool host_path,
                                           const Body& body) {
  index_t sum = 0;
  if constexpr (is_host_space<ExecSpace>) {
    if (host_path) {
      for (index_t i = seg.begin; i < seg.end; ++i) sum += body(i);
      return sum;
    }
  }
  Kokkos::parallel_reduce(
      Kokkos::TeamThreadRange(team, seg.begin, seg.end), [&](const index_t i, index_t& acc) { acc += body(i); }, sum);
  return sum;
}

// A whole buffer as one tensor.
template <class MemSpace = DefaultMem>
TensorSegments<MemSpace> make_segments(index_t num_elements) {
  return make_segments<MemSpace>(std::vector<index_t>{0, num_elements});
}

}  // namespace pulse
