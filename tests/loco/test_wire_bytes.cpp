// The byte counters against MPI's own view (issue 28 item 6), at np 1/2/3/4. This test binary
// defines MPI_Allreduce, MPI_Allgather, MPI_Allgatherv, MPI_Alltoallv and MPI_Bcast and their
// nonblocking forms itself (the MPI profiling interface): each forwards to PMPI_* and adds, per MPI communicator, the bytes
// its arguments address to OTHER ranks, read from the counts, datatypes, root and rank that
// pulse handed to MPI. Every collective pulse runs (the typed collectives, the DiLoCo and
// PULSELoCo exchanges, the outer step) must count exactly those bytes on its Communicator: the
// own block is never counted, one rank counts nothing, an allgather's block counts once per
// other rank. An allreduce has no per-peer arguments; it is counted as the reduce-scatter plus
// allgather that performs it with the least traffic (a ring allreduce), here from its count.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "comm/collectives.hpp"
#include "kernels/host_copy.hpp"
#include "loco/exchange.hpp"
#include "loco/outer_sync.hpp"

namespace {

struct Tap {
  std::uint64_t sent = 0, received = 0, calls = 0;
};
std::map<MPI_Comm, Tap> taps;  // only this test's single thread calls MPI

int rank_of(MPI_Comm comm) {
  int r = 0;
  PMPI_Comm_rank(comm, &r);
  return r;
}
int size_of(MPI_Comm comm) {
  int p = 1;
  PMPI_Comm_size(comm, &p);
  return p;
}
std::uint64_t type_bytes(MPI_Datatype type) {
  int size = 0;
  PMPI_Type_size(type, &size);
  return std::uint64_t(size);
}
void tap(MPI_Comm comm, std::uint64_t sent, std::uint64_t received) {
  Tap& t = taps[comm];
  t.sent += sent, t.received += received, ++t.calls;
}

// The bytes each collective addresses to other ranks, from its arguments.
void tap_alltoallv(const int sendcounts[], MPI_Datatype sendtype, const int recvcounts[], MPI_Datatype recvtype,
                   MPI_Comm comm) {
  std::uint64_t sent = 0, received = 0;
  for (int r = 0; r < size_of(comm); ++r)
    if (r != rank_of(comm)) sent += sendcounts[r] * type_bytes(sendtype), received += recvcounts[r] * type_bytes(recvtype);
  tap(comm, sent, received);
}
void tap_allgather(int sendcount, MPI_Datatype sendtype, int recvcount, MPI_Datatype recvtype, MPI_Comm comm) {
  const std::uint64_t others = size_of(comm) - 1;
  tap(comm, others * sendcount * type_bytes(sendtype), others * recvcount * type_bytes(recvtype));
}
void tap_allgatherv(int sendcount, MPI_Datatype sendtype, const int recvcounts[], MPI_Datatype recvtype,
                    MPI_Comm comm) {
  std::uint64_t received = 0;
  for (int r = 0; r < size_of(comm); ++r)
    if (r != rank_of(comm)) received += recvcounts[r] * type_bytes(recvtype);
  tap(comm, std::uint64_t(size_of(comm) - 1) * sendcount * type_bytes(sendtype), received);
}
void tap_bcast(int count, MPI_Datatype type, int root, MPI_Comm comm) {
  const std::uint64_t bytes = count * type_bytes(type);
  if (rank_of(comm) == root)
    tap(comm, std::uint64_t(size_of(comm) - 1) * bytes, 0);
  else
    tap(comm, 0, bytes);
}
// Reduce-scatter: the count split into p chunks, the first count % p one longer; this rank sends
// every chunk but its own to that chunk's owner and gets its own chunk from the p - 1 others.
// Allgather: the reverse.
void tap_allreduce(int count, MPI_Datatype type, MPI_Comm comm) {
  const std::uint64_t p = size_of(comm), r = rank_of(comm), n = count;
  const std::uint64_t mine = n / p + (r < n % p ? 1 : 0);
  const std::uint64_t elements = (n - mine) + (p - 1) * mine;
  tap(comm, elements * type_bytes(type), elements * type_bytes(type));
}

}  // namespace

// Each collective in its blocking form (PULSE_MPI_WAIT=spin, and floating-point sums) and its
// nonblocking form (sleep mode, the default: comm/wait.hpp).
extern "C" {

// A freed communicator's handle may come back for the next one: its tally goes with it.
int MPI_Comm_free(MPI_Comm* comm) {
  taps.erase(*comm);
  return PMPI_Comm_free(comm);
}

int MPI_Alltoallv(const void* sendbuf, const int sendcounts[], const int sdispls[], MPI_Datatype sendtype,
                  void* recvbuf, const int recvcounts[], const int rdispls[], MPI_Datatype recvtype, MPI_Comm comm) {
  tap_alltoallv(sendcounts, sendtype, recvcounts, recvtype, comm);
  return PMPI_Alltoallv(sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts, rdispls, recvtype, comm);
}
int MPI_Ialltoallv(const void* sendbuf, const int sendcounts[], const int sdispls[], MPI_Datatype sendtype,
                   void* recvbuf, const int recvcounts[], const int rdispls[], MPI_Datatype recvtype, MPI_Comm comm,
                   MPI_Request* request) {
  tap_alltoallv(sendcounts, sendtype, recvcounts, recvtype, comm);
  return PMPI_Ialltoallv(sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts, rdispls, recvtype, comm,
                         request);
}

int MPI_Allgather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, int recvcount,
                  MPI_Datatype recvtype, MPI_Comm comm) {
  tap_allgather(sendcount, sendtype, recvcount, recvtype, comm);
  return PMPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
}
int MPI_Iallgather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, int recvcount,
                   MPI_Datatype recvtype, MPI_Comm comm, MPI_Request* request) {
  tap_allgather(sendcount, sendtype, recvcount, recvtype, comm);
  return PMPI_Iallgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm, request);
}

int MPI_Allgatherv(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, const int recvcounts[],
                   const int displs[], MPI_Datatype recvtype, MPI_Comm comm) {
  tap_allgatherv(sendcount, sendtype, recvcounts, recvtype, comm);
  return PMPI_Allgatherv(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, comm);
}
int MPI_Iallgatherv(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, const int recvcounts[],
                    const int displs[], MPI_Datatype recvtype, MPI_Comm comm, MPI_Request* request) {
  tap_allgatherv(sendcount, sendtype, recvcounts, recvtype, comm);
  return PMPI_Iallgatherv(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, comm, request);
}

int MPI_Bcast(void* buffer, int count, MPI_Datatype type, int root, MPI_Comm comm) {
  tap_bcast(count, type, root, comm);
  return PMPI_Bcast(buffer, count, type, root, comm);
}
int MPI_Ibcast(void* buffer, int count, MPI_Datatype type, int root, MPI_Comm comm, MPI_Request* request) {
  tap_bcast(count, type, root, comm);
  return PMPI_Ibcast(buffer, count, type, root, comm, request);
}

int MPI_Allreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  tap_allreduce(count, type, comm);
  return PMPI_Allreduce(sendbuf, recvbuf, count, type, op, comm);
}
int MPI_Iallreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                   MPI_Request* request) {
  tap_allreduce(count, type, comm);
  return PMPI_Iallreduce(sendbuf, recvbuf, count, type, op, comm, request);
}

}  // extern "C"

namespace {

using pulse::Channel;
using pulse::Communicator;
using pulse::index_t;

std::uint64_t counted(const Communicator& comm, bool sent) {
  std::uint64_t b = 0;
  for (int c = 0; c < pulse::num_channels; ++c)
    b += sent ? comm.bytes_sent(Channel(c)) : comm.bytes_received(Channel(c));
  return b;
}

// The Communicator's counters equal what MPI was handed for the other ranks; with two ranks
// or more, the tap saw traffic (the comparison is not of two zeros). Every byte sent is
// received somewhere: the sums over ranks agree.
void expect_matches_tap(const Communicator& comm, const char* what) {
  const Tap t = taps[comm.raw()];
  EXPECT_GT(t.calls, 0u) << what;
  EXPECT_EQ(counted(comm, true), t.sent) << what;
  EXPECT_EQ(counted(comm, false), t.received) << what;
  if (comm.size() == 1) EXPECT_EQ(t.sent + t.received, 0u) << what << ": one rank sends to no one";
  std::uint64_t mine[2] = {t.sent, t.received}, all[2] = {0, 0};
  PMPI_Allreduce(mine, all, 2, MPI_UINT64_T, MPI_SUM, comm.raw());
  EXPECT_EQ(all[0], all[1]) << what;
  if (comm.size() > 1) EXPECT_GT(all[0], 0u) << what;
}

TEST(WireBytes, Collectives) {
  Communicator comm;
  const int p = comm.size(), me = comm.rank();
  Kokkos::View<double*, Kokkos::HostSpace> a("a", 7), gathered("gathered", 7 * p);
  pulse::allreduce(comm, a, pulse::ReduceOp::sum, Channel::gradients);
  pulse::allreduce(comm, a, Kokkos::View<double*, Kokkos::HostSpace>("out", 7), pulse::ReduceOp::max);
  pulse::allreduce_value(comm, 3, pulse::ReduceOp::sum);
  pulse::allgather(comm, a, gathered, Channel::pseudo_gradients);
  Kokkos::View<float*, Kokkos::HostSpace> in("in", 3 * me + 1), out("out", 0);
  pulse::allgatherv(comm, in, out, Channel::patches);
  for (int root = 0; root < p; ++root) pulse::broadcast(comm, a, root, Channel::weights);
  // alltoallv: to rank r, (me + 2 r) % 5 elements.
  std::vector<index_t> sc(p), sd(p), rc(p), rd(p);
  for (int r = 0; r < p; ++r) sc[r] = (me + 2 * r) % 5, rc[r] = (r + 2 * me) % 5;
  for (int r = 1; r < p; ++r) sd[r] = sd[r - 1] + sc[r - 1], rd[r] = rd[r - 1] + rc[r - 1];
  std::vector<std::int32_t> send(sd[p - 1] + sc[p - 1]), recv(rd[p - 1] + rc[p - 1]);
  pulse::alltoallv(comm, send.data(), sc, sd, recv.data(), rc, rd, Channel::control);
  expect_matches_tap(comm, "typed collectives");

  // A communicator split off counts on its own, as MPI sees it.
  Communicator half = comm.split(me % 2, me);
  pulse::allreduce(half, a, pulse::ReduceOp::sum, Channel::gradients);
  expect_matches_tap(half, "split communicator");
}

std::vector<float> random_vector(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

TEST(WireBytes, LocoExchanges) {
  Communicator comm;
  const index_t n = 5003;  // not a multiple of 2, 3 or 4: uneven chunks
  const auto dense = random_vector(std::size_t(n), 7 + comm.rank());
  std::vector<float> sum(static_cast<std::size_t>(n));
  pulse::loco::dense_sum(comm, dense.data(), n, sum.data(), Channel::pseudo_gradients);
  // Sparse: a different density on every rank.
  std::vector<index_t> indices;
  std::vector<float> values;
  for (index_t i = 0; i < n; i += 3 + comm.rank()) indices.push_back(i), values.push_back(dense[std::size_t(i)]);
  const std::uint64_t payload = pulse::loco::sparse_allgather_sum(comm, indices.data(), values.data(), indices.size(),
                                                                  n, sum.data(), Channel::pseudo_gradients);
  pulse::loco::sparse_reduce_scatter_sum(comm, indices.data(), values.data(), indices.size(), n, sum.data(),
                                         Channel::pseudo_gradients);
  expect_matches_tap(comm, "DiLoCo and PULSELoCo exchanges");

  // The allgather alone: its int64 count and payload go to each of the p - 1 other trainers.
  Communicator fresh;
  pulse::loco::sparse_allgather_sum(fresh, indices.data(), values.data(), indices.size(), n, sum.data(),
                                    Channel::pseudo_gradients);
  EXPECT_EQ(fresh.bytes_sent(Channel::pseudo_gradients), std::uint64_t(fresh.size() - 1) * (8 + payload));
  expect_matches_tap(fresh, "PULSELoCo allgather");
}

TEST(WireBytes, OuterSteps) {
  using pulse::loco::OuterSync;
  using pulse::loco::SparseExchange;
  using pulse::loco::TrainerSync;
  const std::size_t n = 4001;
  const auto theta0 = random_vector(n, 99);
  struct Case {
    TrainerSync mode;
    SparseExchange exchange;
    const char* name;
  };
  for (const Case& c : {Case{TrainerSync::diloco, SparseExchange::allgather, "diloco"},
                        Case{TrainerSync::pulseloco, SparseExchange::allgather, "pulseloco allgather"},
                        Case{TrainerSync::pulseloco, SparseExchange::sparse_allreduce, "pulseloco sparse-allreduce"}}) {
    Communicator comm;
    OuterSync sync(c.mode, comm, pulse::to_device(theta0), pulse::loco::OuterHyper{}, c.exchange, 1.0);
    const std::uint64_t before = taps[comm.raw()].sent;
    auto moved = random_vector(n, 5 + comm.rank());
    for (std::size_t i = 0; i < n; ++i) moved[i] = theta0[i] + 0.01f * moved[i];
    auto local = pulse::to_device(moved);
    const pulse::loco::OuterStats stats = sync.outer_step(local);
    EXPECT_EQ(stats.bytes_sent, taps[comm.raw()].sent - before) << c.name;
    if (c.mode == TrainerSync::pulseloco) {
      EXPECT_GT(stats.density, 0.0) << c.name;
      EXPECT_LT(stats.density, 1.0) << c.name;
    }
    expect_matches_tap(comm, c.name);
  }
}

}  // namespace
