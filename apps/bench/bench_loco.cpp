// Outer-step cost of DiLoCo and PULSELoCo vs the gate's density, per exchange:
//   mpirun -np 2 pulse-bench-loco   (rank 0 reports)
// Args: {density in per mille, exchange} with exchange 0 = PULSELoCo allgather,
// 1 = PULSELoCo sparse allreduce (dense above 25%), 2 = DiLoCo dense. Each iteration's time is
// the slowest rank's outer_step; bytes are this step's Channel::pseudo_gradients bytes, the
// maximum over ranks.
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <cmath>
#include <random>
#include <vector>

#include "mpi_benchmarks.hpp"
#include "comm/collectives.hpp"
#include "kernels/host_copy.hpp"
#include "loco/outer_sync.hpp"

namespace {

using pulse::index_t;
using pulse::loco::OuterSync;
using pulse::loco::SparseExchange;
using pulse::loco::TrainerSync;

constexpr index_t kElements = index_t(1) << 21;

// Local weights whose pseudo-gradient fires the gate on a `density` fraction of elements (a
// move of a quarter of the weight) and is exactly zero elsewhere (so nothing else fires).
std::vector<float> local_weights(const std::vector<float>& global, double density, std::mt19937& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<float> local = global;
  for (auto& w : local)
    if (u(rng) < density) w += std::fabs(w) * 0.25f + 0.01f;
  return local;
}

void BM_OuterStep(benchmark::State& state) {
  const pulse::Communicator comm(MPI_COMM_WORLD);
  const double density = state.range(0) / 1000.0;
  const int which = static_cast<int>(state.range(1));
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> theta0(kElements);
  for (auto& t : theta0) t = normal(rng);
  rng.seed(7 + comm.rank());
  OuterSync sync(which == 2 ? TrainerSync::diloco : TrainerSync::pulseloco, comm, pulse::to_device(theta0),
                 pulse::loco::OuterHyper{},
                 which == 1 ? SparseExchange::sparse_allreduce : SparseExchange::allgather);
  pulse::loco::OuterStats last;
  double max_bytes = 0;
  for (auto _ : state) {
    auto local = pulse::to_device(local_weights(pulse::to_host(sync.theta_global()), density, rng));
    comm.barrier();
    const double start = MPI_Wtime();
    last = sync.outer_step(local);
    const double mine = MPI_Wtime() - start;
    state.SetIterationTime(pulse::allreduce_value(comm, mine, pulse::ReduceOp::max));
    max_bytes = pulse::allreduce_value(comm, double(last.bytes_sent), pulse::ReduceOp::max);
  }
  state.counters["density"] = last.density;
  state.counters["bytes_sent"] = max_bytes;
  state.counters["bytes_per_element"] = max_bytes / double(kElements);
  state.counters["went_dense"] = last.went_dense;
  state.counters["ranks"] = comm.size();
}

void densities(benchmark::internal::Benchmark* b) {
  for (const int exchange : {0, 1})
    for (const int per_mille : {1, 10, 50, 200, 500}) b->Args({per_mille, exchange});
  b->Args({1000, 2});
}

BENCHMARK(BM_OuterStep)->Apply(densities)->UseManualTime()->Iterations(5)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int code = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    code = pulse::bench::run_mpi_benchmarks(argc, argv);
  }
  MPI_Finalize();
  return code;
}
