// Cost of the statistics file per step on pulse-train's tiny-model row:
//   mpirun -np 2 pulse-bench-stats --benchmark_format=json   (rank 0 reports)
// The row has pulse-train's shape for the tiny model (18 float64 and 10 int64 per-step scalars,
// a 52-column per-tensor series, 4 + 4 + 6 columns of gradient, Adam and k-step series, 9 per-rank
// series). Each iteration is one append, timed on the slowest rank; the iteration count is fixed
// so every rank runs the same appends, and the mean over iterations is the amortised cost, the
// periodic flushes included. The file goes to $TMPDIR (default /tmp).
#include <benchmark/benchmark.h>
#include <mpi.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "mpi_benchmarks.hpp"
#include "io/stats_file.hpp"

namespace {

using pulse::io::SeriesType;
using pulse::io::StatsFile;
using pulse::io::StatsOpen;
using pulse::io::StatsRow;

constexpr int kFloatScalars = 18, kIntScalars = 10, kTensors = 52;
constexpr int kFloatPerRank = 2, kIntPerRank = 7;
const std::vector<std::pair<std::string, int>> kWideSeries = {{"/steps/grad_sparsity", 4}, {"/steps/adam_ratio", 4},
                                                              {"/kstep/sparsity", 6}};

std::string bench_path() {
  const char* tmp = std::getenv("TMPDIR");
  std::string path = std::string(tmp ? tmp : "/tmp") + "/pulse_bench_stats_";
  int pid = static_cast<int>(getpid());
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);  // rank 0's name for every rank
  return path + std::to_string(pid) + ".h5";
}

void declare_tiny_schema(StatsFile& f) {
  for (int i = 0; i < kFloatScalars; ++i) f.declare("/steps/f" + std::to_string(i), SeriesType::float64, 0, "1", "x");
  for (int i = 0; i < kIntScalars; ++i) f.declare("/steps/i" + std::to_string(i), SeriesType::int64, 0, "1", "x");
  f.declare("/steps/tensor_changed", SeriesType::int64, kTensors, "elements", "x");
  for (const auto& [name, width] : kWideSeries) f.declare(name, SeriesType::float64, width, "1", "x");
  for (int i = 0; i < kFloatPerRank; ++i) f.declare_per_rank("/ranks/f" + std::to_string(i), SeriesType::float64, "s", "x");
  for (int i = 0; i < kIntPerRank; ++i) f.declare_per_rank("/ranks/i" + std::to_string(i), SeriesType::int64, "B", "x");
}

StatsRow tiny_row(std::int64_t step, int rank) {
  StatsRow row;
  for (int i = 0; i < kFloatScalars; ++i) row.set("/steps/f" + std::to_string(i), 0.5 * double(step + i));
  for (int i = 0; i < kIntScalars; ++i) row.set_int("/steps/i" + std::to_string(i), step + i);
  row.set_int("/steps/tensor_changed", std::vector<std::int64_t>(kTensors, step));
  for (const auto& [name, width] : kWideSeries) row.set(name, std::vector<double>(width, double(step)));
  for (int i = 0; i < kFloatPerRank; ++i) row.set_rank("/ranks/f" + std::to_string(i), rank + 0.25 * double(step));
  for (int i = 0; i < kIntPerRank; ++i) row.set_rank_int("/ranks/i" + std::to_string(i), 1000 * rank + step);
  return row;
}

// One append per iteration (the row is built outside the timed part, as pulse-train builds it
// during the step).
void BM_StatsAppendTiny(benchmark::State& state) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string path = bench_path();
  const int gap_ms = static_cast<int>(state.range(0));
  {
    StatsFile f(MPI_COMM_WORLD, path, StatsOpen::overwrite);
    declare_tiny_schema(f);
    std::int64_t step = 0;
    for (auto _ : state) {
      const StatsRow row = tiny_row(step++, rank);
      if (gap_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms));
      MPI_Barrier(MPI_COMM_WORLD);
      const double start = MPI_Wtime();
      f.append(row);
      double seconds = MPI_Wtime() - start;
      MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      state.SetIterationTime(seconds);
    }
    int ranks = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    state.counters["ranks"] = ranks;
  }
  if (rank == 0) std::remove(path.c_str());
}
BENCHMARK(BM_StatsAppendTiny)->Arg(0)->UseManualTime()->Iterations(1000)->Repetitions(3)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StatsAppendTiny)->Arg(25)->UseManualTime()->Iterations(200)->Repetitions(3)->Unit(benchmark::kMillisecond);

// One explicit flush (what pulse-train does before each checkpoint) after each appended row, of a
// file holding state.range(0) rows: the whole image is written, fsynced and renamed.
void BM_StatsFlushTiny(benchmark::State& state) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string path = bench_path();
  {
    StatsFile f(MPI_COMM_WORLD, path, StatsOpen::overwrite);
    declare_tiny_schema(f);
    std::int64_t step = 0;
    for (; step < state.range(0); ++step) f.append(tiny_row(step, rank));
    double bytes = 0;
    for (auto _ : state) {
      f.append(tiny_row(step++, rank));
      MPI_Barrier(MPI_COMM_WORLD);
      const double start = MPI_Wtime();
      f.flush();
      double seconds = MPI_Wtime() - start;
      MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      state.SetIterationTime(seconds);
      struct stat info {};
      if (rank == 0 && ::stat(path.c_str(), &info) == 0) bytes = double(info.st_size);
    }
    state.counters["file_bytes"] = bytes;
  }
  if (rank == 0) std::remove(path.c_str());
}
BENCHMARK(BM_StatsFlushTiny)->Arg(100)->Arg(10000)->UseManualTime()->Iterations(20)->Repetitions(3)->Unit(benchmark::kMillisecond);

// The floor under any gathered row on this machine: the two collectives an append makes (a gather
// of the per-rank columns and an agreement on errors), with nothing written.
void BM_CollectivesOnly(benchmark::State& state) {
  const int gap_ms = static_cast<int>(state.range(0));
  std::vector<std::int64_t> mine(kFloatPerRank + kIntPerRank + 1, 7), all;
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  all.resize(mine.size() * std::size_t(ranks));
  for (auto _ : state) {
    if (gap_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms));
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    MPI_Gather(mine.data(), int(mine.size()), MPI_INT64_T, all.data(), int(mine.size()), MPI_INT64_T, 0, MPI_COMM_WORLD);
    std::int64_t both[2] = {0, 0};
    MPI_Allreduce(MPI_IN_PLACE, both, 2, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
    double seconds = MPI_Wtime() - start;
    MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    state.SetIterationTime(seconds);
  }
  state.counters["ranks"] = ranks;
}
BENCHMARK(BM_CollectivesOnly)->Arg(0)->UseManualTime()->Iterations(1000)->Repetitions(3)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CollectivesOnly)->Arg(25)->UseManualTime()->Iterations(200)->Repetitions(3)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const int code = pulse::bench::run_mpi_benchmarks(argc, argv);
  MPI_Finalize();
  return code;
}
