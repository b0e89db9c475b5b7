#pragma once
// Google Benchmark under MPI: every rank runs every benchmark (they hold collectives), rank 0
// alone reports. Call between MPI_Init and MPI_Finalize (and inside Kokkos's lifetime if the
// benchmarks use it); returns main's exit code.
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <vector>

namespace pulse::bench {

class NullReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

inline int run_mpi_benchmarks(int& argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    NullReporter quiet;
    benchmark::RunSpecifiedBenchmarks(&quiet);
  }
  benchmark::Shutdown();
  return 0;
}

}  // namespace pulse::bench
