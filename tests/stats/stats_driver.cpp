// Drives pulse::io::StatsFile for the h5py checks and the append benchmark.
//   stats_driver write PATH ROWS [--flush-every N] [--hang|--hang-unflushed|--progress]
//                                           a known layout with values derived from (step, rank),
//                                           flushed every N rows (default: the library's policy);
//                                           --hang: after ROWS appends and a flush, print
//                                           "ready <pid>" per rank and wait to be killed;
//                                           --hang-unflushed: the same without the flush;
//                                           --progress: every rank prints "pid <pid>" first, then
//                                           rank 0 prints "appended <n> flushed <m>" after every
//                                           append (m: rows the file at PATH holds)
//   stats_driver resume PATH KEEP ROWS [--flush-every N]
//                                           reopens PATH keeping KEEP rows and appends rows
//                                           KEEP..ROWS-1 with the same values
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

void declare_layout(StatsFile& f) {
  f.declare("/steps/step", SeriesType::int64, 0, "steps", "optimizer step");
  f.declare("/steps/loss", SeriesType::float64, 0, "nats", "1 / (step + 1)");
  f.declare("/steps/reward", SeriesType::float64, 0, "1", "step / 4 on even steps, unset on odd ones");
  f.declare("/steps/tensor_changed", SeriesType::int64, 3, "elements", "10 * step + tensor");
  f.set_dataset_attribute("/steps/tensor_changed", "tensor_names", std::vector<std::string>{"wte", "h.0.mlp", "lm_head"});
  f.declare("/kstep/sparsity", SeriesType::float64, 2, "1", "step + k / 8");
  f.set_dataset_attribute("/kstep/sparsity", "k_values", std::vector<double>{1, 4});
  f.declare_per_rank("/ranks/bytes_sent", SeriesType::int64, "B", "1000 * rank + step");
  f.declare_per_rank("/ranks/compute_seconds", SeriesType::float64, "s", "rank + step / 2");
}

// The values tests/stats/test_stats_h5py.py expects.
void append_steps(StatsFile& f, int first, int rows, bool progress, int rank) {
  for (int step = first; step < rows; ++step) {
    StatsRow row;
    row.set_int("/steps/step", step);
    row.set("/steps/loss", 1.0 / (step + 1));
    if (step % 2 == 0) row.set("/steps/reward", step / 4.0);
    row.set_int("/steps/tensor_changed", {10 * step, 10 * step + 1, 10 * step + 2});
    row.set("/kstep/sparsity", {step + 1 / 8.0, step + 4 / 8.0});
    row.set_rank_int("/ranks/bytes_sent", 1000 * rank + step);
    row.set_rank("/ranks/compute_seconds", rank + step / 2.0);
    f.append(row);
    if (progress && rank == 0) {
      std::printf("appended %d flushed %lld\n", step + 1, static_cast<long long>(f.flushed_rows()));
      std::fflush(stdout);
    }
  }
}

void write(const std::string& path, int rows, int flush_every, const std::string& flag, int rank, int nranks) {
  if (flag == "--progress") {
    std::printf("pid %d\n", static_cast<int>(getpid()));
    std::fflush(stdout);
  }
  StatsFile f(MPI_COMM_WORLD, path, StatsOpen::create);
  if (flush_every > 0) f.set_flush_interval(flush_every, 1e9);
  f.set_attribute("program", std::string("stats_driver"));
  f.set_attribute("ranks", std::int64_t(nranks));
  f.set_attribute("tensor_names", std::vector<std::string>{"wte", "h.0.mlp", "lm_head"});
  declare_layout(f);
  f.write_array("/absorption/step_000000/counts", std::vector<std::int64_t>{5, 6, 7, 8, 9, 10}, {2, 3}, "weights",
                "a fixed histogram");
  append_steps(f, 0, rows, flag == "--progress", rank);
  if (flag == "--hang") f.flush();
  if (flag == "--hang" || flag == "--hang-unflushed") {
    std::printf("ready %d\n", static_cast<int>(getpid()));
    std::fflush(stdout);
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

void resume(const std::string& path, int keep, int rows, int flush_every, int rank) {
  StatsFile f(MPI_COMM_WORLD, path, StatsOpen::resume, keep);
  if (flush_every > 0) f.set_flush_interval(flush_every, 1e9);
  declare_layout(f);
  append_steps(f, keep, rows, false, rank);
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
    std::vector<std::string> args(argv + 1, argv + argc);
    int flush_every = 0;
    for (std::size_t i = 0; i + 1 < args.size(); ++i)
      if (args[i] == "--flush-every") {
        flush_every = std::stoi(args[i + 1]);
        args.erase(args.begin() + std::ptrdiff_t(i), args.begin() + std::ptrdiff_t(i) + 2);
        break;
      }
    const std::string mode = args.empty() ? "" : args[0];
    if (mode == "write" && (args.size() == 3 || args.size() == 4)) {
      write(args[1], std::stoi(args[2]), flush_every, args.size() == 4 ? args[3] : "", rank, nranks);
    } else if (mode == "resume" && args.size() == 4) {
      resume(args[1], std::stoi(args[2]), std::stoi(args[3]), flush_every, rank);
    } else if (mode == "bench" && args.size() == 5) {
      bench(args[1], std::stoi(args[2]), std::stoi(args[3]), std::stoi(args[4]), rank, nranks);
    } else {
      if (rank == 0)
        std::fprintf(stderr, "usage: stats_driver write PATH ROWS [--flush-every N] [--hang|--hang-unflushed|--progress]"
                             " | resume PATH KEEP ROWS [--flush-every N] | bench PATH ROWS SCALARS WIDTH\n");
      rc = 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stats_driver: %s\n", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
