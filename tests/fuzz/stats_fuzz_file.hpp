#pragma once
// The statistics file of fuzz_stats_file and its seed writer: a per-step series of each type
// and width, a per-rank series, an array and the run id, as pulse-train writes them.
#include <mpi.h>

#include <string>

#include "io/stats_file.hpp"

// Open MPI's allocations and threads (MPI_Init) defeat LeakSanitizer at exit (reports of
// MPI's own memory, or LeakSanitizer crashing): no leak check in the programs that include this
// (one definition each: fuzz_stats_file and its seed writer).
extern "C" const char* __asan_default_options() { return "detect_leaks=0"; }

namespace pulse_fuzz {

inline void declare_stats(pulse::io::StatsFile& s) {
  using pulse::io::SeriesType;
  s.declare("/steps/loss", SeriesType::float64, 0, "1", "loss");
  s.declare("/steps/changed", SeriesType::int64, 0, "elements", "changed");
  s.declare("/kstep/sparsity", SeriesType::float64, 3, "1", "k-step sparsity");
  s.declare_per_rank("/ranks/bytes_sent", SeriesType::int64, "bytes", "bytes sent");
}

inline void append_row(pulse::io::StatsFile& s, double x) {
  pulse::io::StatsRow row;
  row.set("/steps/loss", x);
  row.set_int("/steps/changed", std::int64_t(x * 10));
  row.set("/kstep/sparsity", {x, x / 2, x / 4});
  row.set_rank_int("/ranks/bytes_sent", 7);
  s.append(row);
}

}  // namespace pulse_fuzz
