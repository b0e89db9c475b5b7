// MPI tests of pulse::Communicator and every collective, run at np 1, 2 and 4. Each rank
// computes the expected result on its own from rank-dependent inputs.
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/collectives.hpp"
#include "comm/communicator.hpp"
#include "comm/mpi_type.hpp"
#include "comm/wait.hpp"
#include "core/error.hpp"

namespace {

using HostView = Kokkos::View<double*, Kokkos::HostSpace>;

// An input that differs across ranks and elements and is not monotone in the rank, so that
// sum, max and min give different answers (and the rank holding the max varies with i).
template <class T>
T input(int rank, int i) {
  return static_cast<T>((rank * 5 + i * 3) % 7 + 1);
}

template <class T>
Kokkos::View<T*, Kokkos::HostSpace> rank_input(int rank, int n) {
  Kokkos::View<T*, Kokkos::HostSpace> v("input", n);
  for (int i = 0; i < n; ++i) v(i) = input<T>(rank, i);
  return v;
}

template <class T>
T expected(pulse::ReduceOp op, int size, int i) {
  T result = input<T>(0, i);
  for (int r = 1; r < size; ++r) {
    const T x = input<T>(r, i);
    if (op == pulse::ReduceOp::sum) result += x;
    if (op == pulse::ReduceOp::max) result = x > result ? x : result;
    if (op == pulse::ReduceOp::min) result = x < result ? x : result;
  }
  return result;
}

const pulse::ReduceOp all_ops[] = {pulse::ReduceOp::sum, pulse::ReduceOp::max,
                                   pulse::ReduceOp::min};

std::string op_name(pulse::ReduceOp op) {
  return op == pulse::ReduceOp::sum ? "sum" : op == pulse::ReduceOp::max ? "max" : "min";
}

}  // namespace

TEST(MpiType, MatchesElementSize) {
  auto size_of = [](MPI_Datatype t) {
    int s = 0;
    MPI_Type_size(t, &s);
    return s;
  };
  EXPECT_EQ(pulse::mpi_type<float>(), MPI_FLOAT);
  EXPECT_EQ(pulse::mpi_type<const double>(), MPI_DOUBLE);
  EXPECT_EQ(size_of(pulse::mpi_type<float>()), 4);
  EXPECT_EQ(size_of(pulse::mpi_type<double>()), 8);
  EXPECT_EQ(size_of(pulse::mpi_type<std::int32_t>()), 4);
  EXPECT_EQ(size_of(pulse::mpi_type<std::int64_t>()), 8);
  EXPECT_EQ(size_of(pulse::mpi_type<std::uint8_t>()), 1);
  EXPECT_EQ(size_of(pulse::mpi_type<std::uint16_t>()), 2);
  EXPECT_EQ(size_of(pulse::mpi_type<std::uint32_t>()), 4);
  EXPECT_EQ(size_of(pulse::mpi_type<std::uint64_t>()), 8);
  EXPECT_EQ(size_of(pulse::mpi_type<char>()), 1);
  EXPECT_EQ(size_of(pulse::mpi_type<std::byte>()), 1);
}

TEST(Communicator, DuplicatesWorld) {
  int world_rank = 0, world_size = 0, compare = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  pulse::Communicator comm;
  EXPECT_EQ(comm.rank(), world_rank);
  EXPECT_EQ(comm.size(), world_size);
  EXPECT_NE(comm.raw(), MPI_COMM_WORLD);
  MPI_Comm_compare(comm.raw(), MPI_COMM_WORLD, &compare);
  EXPECT_EQ(compare, MPI_CONGRUENT);
  const pulse::Communicator copy = comm;
  EXPECT_EQ(copy.raw(), comm.raw());
  EXPECT_EQ(std::string(pulse::channel_name(pulse::Channel::patches)), "patches");
}

TEST(Communicator, SplitGroupsByColorAndOrdersByKey) {
  pulse::Communicator world;
  const int color = world.rank() % 2;
  // A descending key reverses the order of the ranks inside each half.
  pulse::Communicator half = world.split(color, world.size() - world.rank());
  const int members = (world.size() + 1 - color) / 2;  // ranks with this parity
  EXPECT_EQ(half.size(), members);
  EXPECT_EQ(half.rank(), members - 1 - world.rank() / 2);
  // The new communicator works and reaches only its own half.
  const int sum = pulse::allreduce_value(half, world.rank(), pulse::ReduceOp::sum);
  int expected_sum = 0;
  for (int r = color; r < world.size(); r += 2) expected_sum += r;
  EXPECT_EQ(sum, expected_sum);
  EXPECT_THROW(world.split(-1, 0), pulse::Error);
}

TEST(Communicator, MpiErrorsBecomePulseErrors) {
  EXPECT_NO_THROW(pulse::check_mpi(MPI_SUCCESS, "MPI_Bcast"));
  try {
    pulse::check_mpi(MPI_ERR_COUNT, "MPI_Bcast");
    FAIL() << "no exception";
  } catch (const pulse::Error& e) {
    EXPECT_NE(std::string(e.what()).find("MPI_Bcast failed"), std::string::npos) << e.what();
  }
  // An invalid root passed straight to MPI comes back as a return code, not an abort.
  pulse::Communicator comm;
  int x = 0;
  EXPECT_THROW(pulse::check_mpi(MPI_Bcast(&x, 1, MPI_INT, comm.size(), comm.raw()), "MPI_Bcast"),
               pulse::Error);
}

// Outlives MPI_Finalize; its deleter must then skip MPI_Comm_free (which would abort).
TEST(Communicator, MayOutliveMpiFinalize) {
  static std::optional<pulse::Communicator> survivor;
  survivor.emplace();
  EXPECT_EQ(survivor->size(), pulse::Communicator().size());
}

template <class T>
class AllreduceTyped : public ::testing::Test {};
using ReduceTypes = ::testing::Types<float, double, std::int32_t, std::int64_t, std::uint8_t,
                                     std::uint16_t, std::uint32_t, std::uint64_t>;
TYPED_TEST_SUITE(AllreduceTyped, ReduceTypes);

TYPED_TEST(AllreduceTyped, EveryOpOutOfPlaceInPlaceAndScalar) {
  using T = TypeParam;
  pulse::Communicator comm;
  const int n = 13;
  for (pulse::ReduceOp op : all_ops) {
    auto in = rank_input<T>(comm.rank(), n);
    Kokkos::View<T*, Kokkos::HostSpace> out("out", n);
    pulse::allreduce(comm, in, out, op);
    pulse::allreduce(comm, in, op);  // in place
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(out(i), expected<T>(op, comm.size(), i)) << op_name(op) << " i=" << i;
      EXPECT_EQ(in(i), expected<T>(op, comm.size(), i)) << "in place " << op_name(op) << " i=" << i;
    }
    EXPECT_EQ(pulse::allreduce_value(comm, input<T>(comm.rank(), 4), op),
              expected<T>(op, comm.size(), 4))
        << op_name(op);
  }
}

TEST(Allgather, BlocksInRankOrder) {
  pulse::Communicator comm;
  const int n = 3;
  Kokkos::View<std::int64_t*, Kokkos::HostSpace> in("in", n), out("out", n * comm.size());
  for (int i = 0; i < n; ++i) in(i) = 100 * comm.rank() + i;
  pulse::allgather(comm, in, out);
  for (int r = 0; r < comm.size(); ++r)
    for (int i = 0; i < n; ++i) EXPECT_EQ(out(r * n + i), 100 * r + i) << "r=" << r << " i=" << i;
  Kokkos::View<std::int64_t*, Kokkos::HostSpace> too_small("small", n * comm.size() - 1);
  EXPECT_THROW(pulse::allgather(comm, in, too_small), pulse::Error);
}

namespace {
// Unequal counts with zeros: 3, 0, 2, 4 at ranks 0..3.
int gatherv_count(int rank) { return (rank * 7 + 3) % 5; }
}  // namespace

TEST(Allgatherv, UnequalCountsIncludingZero) {
  pulse::Communicator comm;
  const int n = gatherv_count(comm.rank());
  Kokkos::View<float*, Kokkos::HostSpace> in("in", n), out("out", 1);
  for (int i = 0; i < n; ++i) in(i) = 1000.0f * comm.rank() + i;
  const std::vector<pulse::index_t> offsets = pulse::allgatherv(comm, in, out);

  ASSERT_EQ(offsets.size(), static_cast<std::size_t>(comm.size() + 1));
  EXPECT_EQ(offsets[0], 0);
  for (int r = 0; r < comm.size(); ++r) EXPECT_EQ(offsets[r + 1] - offsets[r], gatherv_count(r));
  ASSERT_EQ(static_cast<pulse::index_t>(out.extent(0)), offsets.back());
  for (int r = 0; r < comm.size(); ++r)
    for (int i = 0; i < gatherv_count(r); ++i)
      EXPECT_EQ(out(offsets[r] + i), 1000.0f * r + i) << "r=" << r << " i=" << i;
}

TEST(Allgatherv, EveryRankSendsNothing) {
  pulse::Communicator comm;
  Kokkos::View<std::uint16_t*, Kokkos::HostSpace> in("in", 0), out("out", 5);
  const auto offsets = pulse::allgatherv(comm, in, out);
  EXPECT_EQ(offsets, std::vector<pulse::index_t>(comm.size() + 1, 0));
  EXPECT_EQ(out.extent(0), 0u);
}

TEST(Allgatherv, UnmanagedOutputMustFit) {
  pulse::Communicator comm;
  const std::uint8_t mine[2] = {std::uint8_t(comm.rank()), 7};
  std::vector<std::uint8_t> storage(2 * comm.size());
  auto out = pulse::as_view(storage.data(), storage.size());
  pulse::allgatherv(comm, pulse::as_view(mine, 2), out);
  for (int r = 0; r < comm.size(); ++r) {
    EXPECT_EQ(storage[2 * r], r);
    EXPECT_EQ(storage[2 * r + 1], 7);
  }
  auto short_out = pulse::as_view(storage.data(), storage.size() - 1);
  EXPECT_THROW(pulse::allgatherv(comm, pulse::as_view(mine, 2), short_out), pulse::Error);
}

TEST(Broadcast, FromLastRank) {
  pulse::Communicator comm;
  const int root = comm.size() - 1;  // not rank 0 whenever there are two ranks or more
  Kokkos::View<std::int32_t*, Kokkos::HostSpace> v("v", 5);
  for (int i = 0; i < 5; ++i) v(i) = comm.rank() == root ? 10 * i + 7 : -1;
  pulse::broadcast(comm, v, root);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(v(i), 10 * i + 7) << i;
  EXPECT_THROW(pulse::broadcast(comm, v, comm.size()), pulse::Error);
  EXPECT_THROW(pulse::broadcast(comm, v, -1), pulse::Error);
}

// The last rank reaches the broadcast 300 ms after the others: they wait in it without holding
// the core (sleep mode, the default), get the root's values, and wait_totals() holds the wait.
TEST(Wait, EarlyRanksSleepUntilTheLastArrives) {
  pulse::Communicator comm;
  ASSERT_EQ(pulse::wait_mode(), pulse::WaitMode::sleep) << "run without PULSE_MPI_WAIT=spin";
  const int late = comm.size() - 1;
  comm.barrier();
  const pulse::WaitTotals before = pulse::wait_totals();
  if (comm.rank() == late) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  Kokkos::View<std::int64_t*, Kokkos::HostSpace> v("v", 3);
  for (int i = 0; i < 3; ++i) v(i) = comm.rank() == late ? 11 * i + 5 : -1;
  pulse::broadcast(comm, v, late);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(v(i), 11 * i + 5) << i;
  const double waited = pulse::wait_totals().seconds - before.seconds;
  const double cpu = pulse::wait_totals().cpu_seconds - before.cpu_seconds;
  EXPECT_GE(cpu, 0.0);
  EXPECT_LE(cpu, waited + 1e-3) << "one thread's CPU time within its wall time";
  if (comm.rank() != late) {
    EXPECT_GE(waited, 0.25);
    // Spinning would take the whole wait (or the share a loaded machine gives): asleep, a few percent.
    EXPECT_LT(cpu, 0.3 * waited) << "waited " << waited << " s using " << cpu << " s of CPU";
  }
}

TEST(ByteCounters, CountWhatEachRankSendsToOtherRanks) {
  using pulse::Channel;
  pulse::Communicator comm;
  const std::uint64_t p = comm.size(), others = p - 1;
  const int n = 6;
  HostView a("a", n), b("b", n * comm.size());

  // allreduce: reduce-scatter + allgather over balanced chunks of the 6 elements.
  pulse::allreduce(comm, a, pulse::ReduceOp::sum, Channel::gradients);
  const std::uint64_t chunk = pulse::chunk_begin(n, p, comm.rank() + 1) - pulse::chunk_begin(n, p, comm.rank());
  EXPECT_EQ(comm.bytes_sent(Channel::gradients), 8 * (n - chunk + others * chunk));
  EXPECT_EQ(comm.bytes_received(Channel::gradients), 8 * (n - chunk + others * chunk));
  std::uint64_t mine = comm.bytes_sent(Channel::gradients), all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);  // uncounted
  EXPECT_EQ(all, 2 * others * n * 8) << "a ring allreduce moves 2 (p - 1) n elements in all";

  pulse::allgather(comm, a, b, Channel::pseudo_gradients);
  EXPECT_EQ(comm.bytes_sent(Channel::pseudo_gradients), 6u * 8 * others);
  EXPECT_EQ(comm.bytes_received(Channel::pseudo_gradients), 6u * 8 * others);

  // allgatherv: one int64 count each, then the payload.
  Kokkos::View<float*, Kokkos::HostSpace> in("in", gatherv_count(comm.rank())), out("out", 0);
  pulse::allgatherv(comm, in, out, Channel::patches);
  std::uint64_t total = 0;
  for (int r = 0; r < comm.size(); ++r) total += gatherv_count(r);
  EXPECT_EQ(comm.bytes_sent(Channel::patches), others * (8u + 4u * gatherv_count(comm.rank())));
  EXPECT_EQ(comm.bytes_received(Channel::patches), others * 8u + 4u * (total - gatherv_count(comm.rank())));

  // broadcast: the root sends a copy to each other rank, the others receive one.
  pulse::broadcast(comm, a, 0, Channel::weights);
  EXPECT_EQ(comm.bytes_sent(Channel::weights), comm.rank() == 0 ? 48u * others : 0u);
  EXPECT_EQ(comm.bytes_received(Channel::weights), comm.rank() == 0 ? 0u : 48u);

  // Nothing leaked into the default channel; copies share counters, split ones do not.
  EXPECT_EQ(comm.bytes_sent(Channel::control), 0u);
  pulse::Communicator copy = comm;
  pulse::Communicator sub = comm.split(0, comm.rank());
  EXPECT_EQ(pulse::allreduce_value(copy, 1.5f, pulse::ReduceOp::max), 1.5f);
  const std::uint64_t one = pulse::chunk_begin(1, p, comm.rank() + 1) - pulse::chunk_begin(1, p, comm.rank());
  EXPECT_EQ(comm.bytes_sent(Channel::control), 4 * (1 - one + others * one));
  EXPECT_EQ(sub.bytes_sent(Channel::control), 0u);

  comm.reset_counters();
  for (int c = 0; c < pulse::num_channels; ++c) {
    EXPECT_EQ(comm.bytes_sent(Channel(c)), 0u) << c;
    EXPECT_EQ(comm.bytes_received(Channel(c)), 0u) << c;
  }
}

TEST(Collectives, RejectNonContiguousViews) {
  pulse::Communicator comm;
  Kokkos::View<double**, Kokkos::LayoutRight, Kokkos::HostSpace> matrix("matrix", 4, 3);
  auto column = Kokkos::subview(matrix, Kokkos::ALL, 1);  // stride 3: not contiguous
  static_assert(std::is_same_v<decltype(column)::array_layout, Kokkos::LayoutStride>);
  HostView out("out", 4), gathered("gathered", 4 * comm.size());
  try {
    pulse::allreduce(comm, column, out, pulse::ReduceOp::sum);
    FAIL() << "no exception";
  } catch (const pulse::Error& e) {
    EXPECT_NE(std::string(e.what()).find("not contiguous"), std::string::npos) << e.what();
  }
  EXPECT_THROW(pulse::allreduce(comm, column, pulse::ReduceOp::min), pulse::Error);
  EXPECT_THROW(pulse::allgather(comm, column, gathered), pulse::Error);
  EXPECT_THROW(pulse::allgatherv(comm, column, gathered), pulse::Error);
  EXPECT_THROW(pulse::broadcast(comm, column, 0), pulse::Error);
  EXPECT_EQ(comm.bytes_sent(pulse::Channel::control), 0u);  // nothing reached MPI
  HostView short_out("short", 3);
  EXPECT_THROW(pulse::allreduce(comm, out, short_out, pulse::ReduceOp::sum), pulse::Error);
}

TEST(Collectives, StageOnlyWhatMpiCannotReach) {
  constexpr bool stage_all = PULSE_COMM_STAGE_ALL;
  constexpr bool device_is_host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, pulse::DefaultMem>::accessible;
  EXPECT_EQ(pulse::detail::mpi_stages<Kokkos::HostSpace>, stage_all);
  EXPECT_EQ(pulse::detail::mpi_stages<pulse::DefaultMem>,
            stage_all || (!device_is_host && !PULSE_CUDA_AWARE_MPI));
}

// Views in the default memory space (device memory on a GPU build), filled and read through
// host mirrors so the test needs no kernels.
TEST(Collectives, DefaultMemorySpaceViews) {
  pulse::Communicator comm;
  const int n = 6;
  Kokkos::View<double*, pulse::DefaultMem> v("v", n), sum("sum", n);
  auto v_h = Kokkos::create_mirror_view(v);
  for (int i = 0; i < n; ++i) v_h(i) = input<double>(comm.rank(), i);
  Kokkos::deep_copy(v, v_h);
  pulse::allreduce(comm, v, sum, pulse::ReduceOp::sum);
  pulse::allreduce(comm, v, pulse::ReduceOp::max);
  auto sum_h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), sum);
  Kokkos::deep_copy(v_h, v);
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(sum_h(i), expected<double>(pulse::ReduceOp::sum, comm.size(), i)) << i;
    EXPECT_EQ(v_h(i), expected<double>(pulse::ReduceOp::max, comm.size(), i)) << i;
  }

  Kokkos::View<std::int32_t*, pulse::DefaultMem> mine("mine", gatherv_count(comm.rank())), all("all", 0);
  auto mine_h = Kokkos::create_mirror_view(mine);
  for (int i = 0; i < gatherv_count(comm.rank()); ++i) mine_h(i) = 100 * comm.rank() + i;
  Kokkos::deep_copy(mine, mine_h);
  const auto offsets = pulse::allgatherv(comm, mine, all);
  auto all_h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), all);
  for (int r = 0; r < comm.size(); ++r)
    for (int i = 0; i < gatherv_count(r); ++i) EXPECT_EQ(all_h(offsets[r] + i), 100 * r + i) << r << " " << i;

  Kokkos::View<std::uint16_t*, pulse::DefaultMem> bits("bits", 4);
  auto bits_h = Kokkos::create_mirror_view(bits);
  for (int i = 0; i < 4; ++i) bits_h(i) = comm.rank() == 0 ? std::uint16_t(0x8000 + i) : std::uint16_t(0);
  Kokkos::deep_copy(bits, bits_h);
  pulse::broadcast(comm, bits, 0);
  Kokkos::deep_copy(bits_h, bits);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(bits_h(i), 0x8000 + i) << i;
}
