#pragma once
// Typed collectives over rank-1 Kokkos Views (wrap other contiguous memory with as_view).
// Each one checks shapes and contiguity on every rank before the first MPI call (so a bad
// argument throws everywhere instead of deadlocking), fences Kokkos so pending kernels have
// written the buffers, and adds to the communicator's byte counters what this rank sends to and
// receives from OTHER ranks, as if the data went straight from the rank that holds it to each
// rank that needs it (a rank's own block never counts; a one-rank communicator counts nothing):
//   allgather(v)  sent: (p - 1) copies of this rank's block; received: the other ranks' blocks
//   alltoallv     sent: the blocks for the other ranks; received: the blocks from them
//   broadcast     the root sends p - 1 copies; every other rank receives one
//   allreduce     a reduce-scatter plus an allgather over balanced chunks (a ring allreduce, and
//                 what DiLoCo's exchange does by hand): a rank with chunk c of n elements sends
//                 and receives (n - c) + (p - 1) c elements, 2 (p - 1) / p n on average.
// These are the bytes that must cross the network under a bandwidth-optimal algorithm, not the
// messages MPI's own algorithm sends (a tree broadcast forwards, a small allreduce may double).
// Each call waits for the other ranks without spinning in sleep mode (comm/wait.hpp) and is timed
// in wait_totals().
// Views may live in any memory space. Host-accessible memory goes to MPI as it is; device
// memory goes to MPI directly only when pulse is configured with PULSE_CUDA_AWARE_MPI=ON,
// otherwise it is staged through a host buffer (pinned with CUDA or HIP): copied in before
// the MPI call, copied back after it for outputs.
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/mpi_type.hpp"
#include "comm/wait.hpp"
#include "core/error.hpp"
#include "kernels/types.hpp"
#include "pulse_config.hpp"

namespace pulse {

enum class ReduceOp { sum, max, min };

// Rank r's chunk of n elements split among `ranks`: [chunk_begin(n, ranks, r), chunk_begin(n,
// ranks, r + 1)), balanced to within one element (reduce-scatters and their byte counts).
inline index_t chunk_begin(index_t n, int ranks, int r) {
  const index_t base = n / ranks, extra = n % ranks;  // r * base + ..., without overflowing n * r
  return r * base + std::min<index_t>(r, extra);
}

inline MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  throw_error(__FILE__, __LINE__, "invalid ReduceOp " + std::to_string(static_cast<int>(op)));
}

// An unmanaged host view over n elements at data, for memory that Kokkos does not own.
template <class T>
Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> as_view(T* data, std::size_t n) {
  return Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(data, n);
}

namespace detail {

template <class View>
void check_buffer(const View& view, const char* collective) {
  static_assert(Kokkos::is_view<View>::value, "pulse collectives take Kokkos Views");
  static_assert(View::rank == 1, "pulse collectives take rank-1 Views; flatten or use as_view");
  PULSE_CHECK(view.span_is_contiguous(), std::string(collective) + ": view '" + view.label() +
                                             "' is not contiguous");
}

template <class InView, class OutView>
void check_pair(const InView& in, const OutView& out, const char* collective) {
  static_assert(std::is_same_v<typename InView::non_const_value_type, typename OutView::value_type>,
                "pulse collectives: output element type must be the non-const input type");
  check_buffer(in, collective);
  check_buffer(out, collective);
}

inline int mpi_count(std::size_t n, const char* collective) {
  PULSE_CHECK(n <= static_cast<std::size_t>(INT_MAX),
              std::string(collective) + ": " + std::to_string(n) +
                  " elements exceed MPI's int count; split the exchange");
  return static_cast<int>(n);
}

template <class View>
std::uint64_t bytes_of(const View& view) {
  return static_cast<std::uint64_t>(view.size()) * sizeof(typename View::value_type);
}

// An allreduce of `bytes` per rank, as reduce-scatter + allgather (see the top of this file):
// what this rank sends, and receives, to and from the others.
inline std::uint64_t allreduce_wire_bytes(const Communicator& comm, std::uint64_t elements, std::uint64_t element_size) {
  const std::uint64_t p = comm.size();
  const std::uint64_t chunk = chunk_begin(index_t(elements), comm.size(), comm.rank() + 1) -
                              chunk_begin(index_t(elements), comm.size(), comm.rank());
  return (elements - chunk + (p - 1) * chunk) * element_size;
}

// Host memory the device copies into fastest, for staging device views.
#if defined(KOKKOS_ENABLE_CUDA)
using StagingSpace = Kokkos::CudaHostPinnedSpace;
#elif defined(KOKKOS_ENABLE_HIP)
using StagingSpace = Kokkos::HIPHostPinnedSpace;
#else
using StagingSpace = Kokkos::HostSpace;
#endif

// PULSE_COMM_STAGE_ALL (a test hook) stages host views too, so the staging path runs in tests
// on machines without a GPU.
#ifndef PULSE_COMM_STAGE_ALL
#define PULSE_COMM_STAGE_ALL 0
#endif

template <class MemorySpace>
inline constexpr bool mpi_stages =
    PULSE_COMM_STAGE_ALL ||
    (!PULSE_CUDA_AWARE_MPI && !Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible);

// The memory handed to MPI for view: the view's own, or a host copy when it has to be staged.
// copy_in fills the copy from the view; copy_out writes it back (for receive buffers).
template <class View>
class MpiBuffer {
 public:
  using T = typename View::value_type;
  static constexpr bool staged = mpi_stages<typename View::memory_space>;

  MpiBuffer(const View& view, bool copy_in) : view_(view) {
    if constexpr (staged) {
      host_ = HostView(Kokkos::view_alloc(Kokkos::WithoutInitializing, "pulse::comm::staging"), view.size());
      if (copy_in) Kokkos::deep_copy(host_, view);
    }
  }
  T* data() const {
    if constexpr (staged) {
      return host_.data();
    } else {
      return view_.data();
    }
  }
  void copy_out() const {
    static_assert(!std::is_const_v<T>, "pulse collectives: cannot copy back into a const view");
    if constexpr (staged) Kokkos::deep_copy(view_, host_);
  }

 private:
  using HostView = Kokkos::View<typename View::non_const_value_type*, Kokkos::LayoutRight, StagingSpace>;
  View view_;
  HostView host_;
};

// MPI_Allreduce as the wait mode says (comm/wait.hpp). A floating-point sum keeps the blocking
// call, after a meeting of the ranks: its rounding depends on the order of the additions, which
// the nonblocking algorithm may change; min, max and integer sums are exact in any order.
template <class T>
void allreduce_call(const void* send, void* recv, int count, ReduceOp op, MPI_Comm comm) {
  const auto blocking = [&] { return MPI_Allreduce(send, recv, count, mpi_type<T>(), mpi_op(op), comm); };
  if (std::is_floating_point_v<T> && op == ReduceOp::sum) {
    wait_for_ranks(comm);
    check_mpi(blocking(), "MPI_Allreduce");
    return;
  }
  collective_call("MPI_Allreduce", blocking, [&](MPI_Request* request) {
    return MPI_Iallreduce(send, recv, count, mpi_type<T>(), mpi_op(op), comm, request);
  });
}

}  // namespace detail

// out[i] = op over ranks of in[i]; every rank gets the result.
template <class InView, class OutView>
void allreduce(const Communicator& comm, const InView& in, const OutView& out, ReduceOp op,
               Channel channel = Channel::control) {
  detail::check_pair(in, out, "allreduce");
  PULSE_CHECK(in.size() == out.size(), "allreduce: input has " + std::to_string(in.size()) +
                                           " elements, output " + std::to_string(out.size()));
  using T = typename OutView::value_type;
  const int count = detail::mpi_count(in.size(), "allreduce");
  Kokkos::fence();
  const WaitClock clock;
  const detail::MpiBuffer<InView> send(in, true);
  const detail::MpiBuffer<OutView> recv(out, false);
  detail::allreduce_call<T>(send.data(), recv.data(), count, op, comm.raw());
  recv.copy_out();
  const std::uint64_t wire = detail::allreduce_wire_bytes(comm, in.size(), sizeof(T));
  comm.count_bytes(channel, wire, wire);
}

// In place: inout[i] = op over ranks of inout[i].
template <class View>
void allreduce(const Communicator& comm, const View& inout, ReduceOp op,
               Channel channel = Channel::control) {
  detail::check_buffer(inout, "allreduce");
  using T = typename View::value_type;
  static_assert(!std::is_const_v<T>, "allreduce in place needs a writable view");
  const int count = detail::mpi_count(inout.size(), "allreduce");
  Kokkos::fence();
  const WaitClock clock;
  const detail::MpiBuffer<View> buffer(inout, true);
  detail::allreduce_call<T>(MPI_IN_PLACE, buffer.data(), count, op, comm.raw());
  buffer.copy_out();
  const std::uint64_t wire = detail::allreduce_wire_bytes(comm, inout.size(), sizeof(T));
  comm.count_bytes(channel, wire, wire);
}

// One value (a loss, a count) reduced over ranks.
template <class T>
T allreduce_value(const Communicator& comm, T value, ReduceOp op,
                  Channel channel = Channel::control) {
  T result{};
  const WaitClock clock;
  detail::allreduce_call<T>(&value, &result, 1, op, comm.raw());
  const std::uint64_t wire = detail::allreduce_wire_bytes(comm, 1, sizeof(T));
  comm.count_bytes(channel, wire, wire);
  return result;
}

// Every rank contributes in.size() elements (the same on all ranks); out holds rank r's block
// at [r * in.size(), (r + 1) * in.size()).
template <class InView, class OutView>
void allgather(const Communicator& comm, const InView& in, const OutView& out,
               Channel channel = Channel::control) {
  detail::check_pair(in, out, "allgather");
  PULSE_CHECK(out.size() == in.size() * static_cast<std::size_t>(comm.size()),
              "allgather: output has " + std::to_string(out.size()) + " elements, expected " +
                  std::to_string(in.size()) + " x " + std::to_string(comm.size()) + " ranks");
  using T = typename OutView::value_type;
  const int count = detail::mpi_count(in.size(), "allgather");
  detail::mpi_count(out.size(), "allgather");
  Kokkos::fence();
  const WaitClock clock;
  const detail::MpiBuffer<InView> send(in, true);
  const detail::MpiBuffer<OutView> recv(out, false);
  collective_call(
      "MPI_Allgather",
      [&] { return MPI_Allgather(send.data(), count, mpi_type<T>(), recv.data(), count, mpi_type<T>(), comm.raw()); },
      [&](MPI_Request* request) {
        return MPI_Iallgather(send.data(), count, mpi_type<T>(), recv.data(), count, mpi_type<T>(), comm.raw(),
                              request);
      });
  recv.copy_out();
  const std::uint64_t others = comm.size() - 1;
  comm.count_bytes(channel, others * detail::bytes_of(in), others * detail::bytes_of(in));
}

// Every rank contributes any number of elements (zero included). The counts are gathered
// first (counted on the same channel); a managed out is reallocated to the total when its
// size differs, an unmanaged one must already have it.
// Returns comm.size() + 1 offsets: rank r's elements are out[offsets[r], offsets[r + 1]).
template <class InView, class OutView>
std::vector<index_t> allgatherv(const Communicator& comm, const InView& in, OutView& out,
                                Channel channel = Channel::control) {
  detail::check_pair(in, out, "allgatherv");
  const std::int64_t my_count = static_cast<std::int64_t>(in.size());
  std::vector<std::int64_t> counts(comm.size());
  allgather(comm, as_view(&my_count, 1), as_view(counts.data(), counts.size()), channel);

  std::vector<index_t> offsets(comm.size() + 1, 0);
  for (int r = 0; r < comm.size(); ++r) offsets[r + 1] = offsets[r] + counts[r];
  const int total = detail::mpi_count(static_cast<std::size_t>(offsets.back()), "allgatherv");
  std::vector<int> mpi_counts(comm.size()), mpi_displs(comm.size());
  for (int r = 0; r < comm.size(); ++r) {
    mpi_counts[r] = static_cast<int>(counts[r]);
    mpi_displs[r] = static_cast<int>(offsets[r]);
  }
  if (out.size() != static_cast<std::size_t>(total)) {
    if constexpr (OutView::traits::is_managed) {
      Kokkos::realloc(out, total);
    } else {
      throw_error(__FILE__, __LINE__, "allgatherv: unmanaged output view '" + out.label() +
                                          "' has " + std::to_string(out.size()) +
                                          " elements, the ranks send " + std::to_string(total));
    }
  }

  using T = typename OutView::value_type;
  Kokkos::fence();
  const WaitClock clock;
  const detail::MpiBuffer<InView> send(in, true);
  const detail::MpiBuffer<OutView> recv(out, false);
  const int mine = mpi_counts[comm.rank()];
  collective_call(
      "MPI_Allgatherv",
      [&] {
        return MPI_Allgatherv(send.data(), mine, mpi_type<T>(), recv.data(), mpi_counts.data(), mpi_displs.data(),
                              mpi_type<T>(), comm.raw());
      },
      [&](MPI_Request* request) {
        return MPI_Iallgatherv(send.data(), mine, mpi_type<T>(), recv.data(), mpi_counts.data(), mpi_displs.data(),
                               mpi_type<T>(), comm.raw(), request);
      });
  recv.copy_out();
  comm.count_bytes(channel, std::uint64_t(comm.size() - 1) * detail::bytes_of(in),
                   detail::bytes_of(out) - detail::bytes_of(in));
  return offsets;
}

// MPI_Alltoallv on host memory: rank r gets send[send_displs[r], + send_counts[r]) of every rank,
// rank q's block at recv + recv_displs[q]. Counts and displacements in elements, one per rank.
template <class T>
void alltoallv(const Communicator& comm, const T* send, const std::vector<index_t>& send_counts,
               const std::vector<index_t>& send_displs, T* recv, const std::vector<index_t>& recv_counts,
               const std::vector<index_t>& recv_displs, Channel channel = Channel::control) {
  const int ranks = comm.size();
  PULSE_CHECK(send_counts.size() >= std::size_t(ranks) && send_displs.size() >= std::size_t(ranks) &&
                  recv_counts.size() >= std::size_t(ranks) && recv_displs.size() >= std::size_t(ranks),
              "alltoallv: counts and displacements need one entry per rank (" + std::to_string(ranks) + ")");
  std::vector<int> sc(ranks), sd(ranks), rc(ranks), rd(ranks);
  std::uint64_t sent = 0, received = 0;
  for (int r = 0; r < ranks; ++r) {
    sc[r] = detail::mpi_count(send_counts[r], "alltoallv");
    sd[r] = detail::mpi_count(send_displs[r], "alltoallv");
    rc[r] = detail::mpi_count(recv_counts[r], "alltoallv");
    rd[r] = detail::mpi_count(recv_displs[r], "alltoallv");
    if (r == comm.rank()) continue;  // the block a rank keeps never crosses the wire
    sent += std::uint64_t(send_counts[r]) * sizeof(T);
    received += std::uint64_t(recv_counts[r]) * sizeof(T);
  }
  const WaitClock clock;
  collective_call(
      "MPI_Alltoallv",
      [&] {
        return MPI_Alltoallv(send, sc.data(), sd.data(), mpi_type<T>(), recv, rc.data(), rd.data(), mpi_type<T>(),
                             comm.raw());
      },
      [&](MPI_Request* request) {
        return MPI_Ialltoallv(send, sc.data(), sd.data(), mpi_type<T>(), recv, rc.data(), rd.data(), mpi_type<T>(),
                              comm.raw(), request);
      });
  comm.count_bytes(channel, sent, received);
}

// MPI_Gatherv on host memory: root receives every rank's n elements (any count, zero included),
// rank r's at out[offsets[r], offsets[r + 1]) (out is resized on root; other ranks' is left
// alone). The counts are gathered first (MPI_Gather, counted on the same channel); a rank's own
// block is not counted. Returns the offsets on root, an empty vector elsewhere.
template <class T>
std::vector<index_t> gatherv(const Communicator& comm, const T* in, std::size_t n, std::vector<T>& out, int root,
                             Channel channel = Channel::control) {
  PULSE_CHECK(root >= 0 && root < comm.size(), "gatherv: root " + std::to_string(root) +
                                                   " is not a rank of a communicator of size " +
                                                   std::to_string(comm.size()));
  const int count = detail::mpi_count(n, "gatherv");
  const bool is_root = comm.rank() == root;
  std::vector<int> counts(is_root ? comm.size() : 0);
  const WaitClock clock;
  collective_call(
      "MPI_Gather", [&] { return MPI_Gather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, root, comm.raw()); },
      [&](MPI_Request* request) {
        return MPI_Igather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, root, comm.raw(), request);
      });
  std::vector<index_t> offsets;
  std::vector<int> displs;
  if (is_root) {
    offsets.assign(comm.size() + 1, 0);
    for (int r = 0; r < comm.size(); ++r) offsets[r + 1] = offsets[r] + counts[r];
    detail::mpi_count(std::size_t(offsets.back()), "gatherv");
    for (int r = 0; r < comm.size(); ++r) displs.push_back(int(offsets[r]));
    out.resize(std::size_t(offsets.back()));
  }
  T* const into = is_root ? out.data() : nullptr;
  collective_call(
      "MPI_Gatherv",
      [&] {
        return MPI_Gatherv(in, count, mpi_type<T>(), into, counts.data(), displs.data(), mpi_type<T>(), root,
                           comm.raw());
      },
      [&](MPI_Request* request) {
        return MPI_Igatherv(in, count, mpi_type<T>(), into, counts.data(), displs.data(), mpi_type<T>(), root,
                            comm.raw(), request);
      });
  const std::uint64_t others = std::uint64_t(comm.size() - 1);
  if (is_root)
    comm.count_bytes(channel, 0, others * sizeof(int) + (std::uint64_t(offsets.back()) - n) * sizeof(T));
  else
    comm.count_bytes(channel, sizeof(int) + std::uint64_t(n) * sizeof(T), 0);
  return offsets;
}

// Copies root's view into every rank's view; all views have the same size.
template <class View>
void broadcast(const Communicator& comm, const View& view, int root,
               Channel channel = Channel::control) {
  detail::check_buffer(view, "broadcast");
  using T = typename View::value_type;
  static_assert(!std::is_const_v<T>, "broadcast needs a writable view");
  PULSE_CHECK(root >= 0 && root < comm.size(), "broadcast: root " + std::to_string(root) +
                                                   " is not a rank of a communicator of size " +
                                                   std::to_string(comm.size()));
  const int count = detail::mpi_count(view.size(), "broadcast");
  const bool is_root = comm.rank() == root;
  Kokkos::fence();
  const WaitClock clock;
  const detail::MpiBuffer<View> buffer(view, is_root);
  collective_call(
      "MPI_Bcast", [&] { return MPI_Bcast(buffer.data(), count, mpi_type<T>(), root, comm.raw()); },
      [&](MPI_Request* request) { return MPI_Ibcast(buffer.data(), count, mpi_type<T>(), root, comm.raw(), request); });
  if (!is_root) buffer.copy_out();
  comm.count_bytes(channel, is_root ? std::uint64_t(comm.size() - 1) * detail::bytes_of(view) : 0,
                   is_root ? 0 : detail::bytes_of(view));
}

}  // namespace pulse
