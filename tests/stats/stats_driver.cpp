// Drives pulse::io::StatsFile for the h5py checks and the append benchmark.
//   stats_driver write PATH ROWS [--hang|--progress]
//                                           a known layout with values derived from (step, rank);
//                                           --hang: after ROWS appends print "ready <pid>" per rank
//                                           and wait to be killed; --progress: rank 0 prints
//                                           "appended <n> <pid>" after every append
//   stats_driver bench PATH ROWS SCALARS WIDTH
//                                           SCALARS float64 series, one (steps x WIDTH) series and a
//                                           (steps x 4) per-rank series; prints per-append seconds
//                                           (mean and max over appends, each the max over ranks)
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "io/stats_file.hpp"

using pulse::io::SeriesType;
using pulse::io::StatsFile;
using pulse::io::StatsOpen;
using pulse::io::StatsRow;

namespace {

// The values tests/stats/test_stats_h5py.py expects.
void write(const std::string& path, int rows, const std::string& flag, int rank, int nranks) {
  StatsFile f(MPI_COMM_WORLD, path, StatsOpen::create);
  f.set_attribute("program", std::string("stats_driver"));
  f.set_attribute("ranks", std::int64_t(nranks));
  f.set_attribute("tensor_names", std::vector<std::string>{"wte", "h.0.mlp", "lm_head"});
  f.declare("/steps/step", SeriesType::int64, 0, "steps", "optimizer step");
  f.declare("/steps/loss", SeriesType::float64, 0, "nats", "1 / (step + 1)");
  f.declare("/steps/reward", SeriesType::float64, 0, "1", "step / 4 on even steps, unset on odd ones");
  f.declare("/steps/tensor_changed", SeriesType::int64, 3, "elements", "10 * step + tensor");
  f.set_dataset_attribute("/steps/tensor_changed", "tensor_names", std::vector<std::string>{"wte", "h.0.mlp", "lm_head"});
  f.declare("/kstep/sparsity", SeriesType::float64, 2, "1", "step + k / 8");
  f.set_dataset_attribute("/kstep/sparsity", "k_values", std::vector<double>{1, 4});
  f.declare_per_rank("/ranks/bytes_sent", SeriesType::int64, "B", "1000 * rank + step");
  f.declare_per_rank("/ranks/compute_seconds", SeriesType::float64, "s", "rank + step / 2");
  f.write_array("/absorption/step_000000/counts", std::vector<std::int64_t>{5, 6, 7, 8, 9, 10}, {2, 3}, "weights",
                "a fixed histogram");
  for (int step = 0; step < rows; ++step) {
    StatsRow row;
    row.set_int("/steps/step", step);
    row.set("/steps/loss", 1.0 / (step + 1));
    if (step % 2 == 0) row.set("/steps/reward", step / 4.0);
    row.set_int("/steps/tensor_changed", {10 * step, 10 * step + 1, 10 * step + 2});
    row.set("/kstep/sparsity", {step + 1 / 8.0, step + 4 / 8.0});
    row.set_rank_int("/ranks/bytes_sent", 1000 * rank + step);
    row.set_rank("/ranks/compute_seconds", rank + step / 2.0);
    f.append(row);
    if (flag == "--progress" && rank == 0) {
      std::printf("appended %d %d\n", step + 1, static_cast<int>(getpid()));
      std::fflush(stdout);
    }
  }
  if (flag == "--hang") {
    std::printf("ready %d\n", static_cast<int>(getpid()));
    std::fflush(stdout);
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

void bench(const std::string& path, int rows, int scalars, int width, int rank, int nranks) {
  StatsFile f(MPI_COMM_WORLD, path, StatsOpen::overwrite);
  std::vector<std::string> names;
  for (int i = 0; i < scalars; ++i) {
    names.push_back("/steps/scalar_" + std::to_string(i));
    f.declare(names.back(), SeriesType::float64, 0, "1", "benchmark scalar");
  }
  f.declare("/steps/tensor_changed", SeriesType::float64, width, "1", "benchmark tensor series");
  f.declare_per_rank("/ranks/seconds", SeriesType::float64, "s", "benchmark per-rank series");
  std::vector<double> times;
  for (int step = 0; step < rows; ++step) {
    StatsRow row;
    for (const auto& name : names) row.set(name, step * 0.5);
    row.set("/steps/tensor_changed", std::vector<double>(width, step));
    row.set_rank("/ranks/seconds", rank + step);
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    f.append(row);
    double seconds = MPI_Wtime() - start;
    MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    times.push_back(seconds);
  }
  double sum = 0, worst = 0;
  for (double t : times) {
    sum += t;
    worst = std::max(worst, t);
  }
  if (rank == 0)
    std::printf("{\"ranks\": %d, \"rows\": %d, \"series\": %d, \"mean_append_ms\": %.3f, \"max_append_ms\": %.3f}\n",
                nranks, rows, scalars + 2, 1e3 * sum / rows, 1e3 * worst);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, nranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  int rc = 0;
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "write" && (argc == 4 || argc == 5)) {
      write(argv[2], std::stoi(argv[3]), argc == 5 ? argv[4] : "", rank, nranks);
    } else if (mode == "bench" && argc == 6) {
      bench(argv[2], std::stoi(argv[3]), std::stoi(argv[4]), std::stoi(argv[5]), rank, nranks);
    } else {
      if (rank == 0) std::fprintf(stderr, "usage: stats_driver write PATH ROWS [--hang|--progress] | bench PATH ROWS SCALARS WIDTH\n");
      rc = 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stats_driver: %s\n", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
