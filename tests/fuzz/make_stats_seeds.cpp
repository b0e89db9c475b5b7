// Writes inputs of fuzz_stats_file into the folder given as argument (its input format is in
// fuzz_stats_file.cpp): the datasets index of statistics files from pulse's own writer
// (StatsFile, with 0, 1 and 3 rows), beside the datasets it lists, with and without a run id.
#include <mpi.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "io/stats_file.hpp"
#include "stats_fuzz_file.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s FOLDER\n", argv[0]);
    return 2;
  }
  MPI_Init(&argc, &argv);
  int code = 0;
  try {
    const std::string dir = argv[1];
    for (const int rows : {0, 1, 3}) {
      const std::string h5 = dir + "/scratch.h5";
      {
        pulse::io::StatsFile s(MPI_COMM_SELF, h5, pulse::io::StatsOpen::overwrite);
        pulse_fuzz::declare_stats(s);
        s.write_array("/absorption/step_000001/ratio_counts", std::vector<std::int64_t>{1, 2, 3, 4}, {2, 2}, "1", "counts");
        for (int r = 0; r < rows; ++r) pulse_fuzz::append_row(s, 0.25 * r);
      }
      const std::string index = *pulse::io::read_root_string_attribute(h5, "datasets");
      ::unlink(h5.c_str());
      for (const int run_id : {0, 1}) {
        // format 1, run id, keep_rows, then the datasets as the writer made them (path, type with
        // bit 2 for an unlimited first dimension, rank, dimensions): loss, changed, kstep (w 3),
        // bytes_sent (1 rank), the array (2 x 2).
        const std::uint8_t r = std::uint8_t(rows);
        std::vector<std::uint8_t> in{0, std::uint8_t(run_id), std::uint8_t(rows), 5,
                                     0, 4, 1, r, 1, 5, 1, r, 2, 4, 2, std::uint8_t(r | 3 << 4),
                                     3, 5, 2, std::uint8_t(r | 1 << 4), 4, 1, 2, 2 | 2 << 4};
        in.insert(in.end(), index.begin(), index.end());
        const std::string path = dir + "/rows" + std::to_string(rows) + (run_id ? "-run-id" : "");
        std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(in.data()), std::streamsize(in.size()));
      }
    }
  } catch (const pulse::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    code = 1;
  }
  MPI_Finalize();
  return code;
}
