#pragma once
// The recorder role of pulse-train: per step, what every rank moved over MPI (all channels of the
// communicators it is given), its own columns of /ranks (bytes, seconds, CPU seconds in and out
// of collective calls), and the collective append of the row to the statistics file (timed on
// rank 0 once every rank is there: /steps/write_s of the next row).
#include <cstdint>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/wait.hpp"
#include "io/stats_file.hpp"

namespace pulse {

class StepRecorder {
 public:
  // The communicators are copied (copies share the MPI communicator and its byte counters):
  // `counted` are all whose bytes the rank's totals include; trainer-to-trainer bytes come from
  // `trainers`, patch bytes from `sync`.
  StepRecorder(io::StatsFile& file, const Communicator& world, const Communicator& trainers, const Communicator& sync,
               std::vector<Communicator> counted);

  // Remembers the byte counters, CPU and wait seconds at the start of a step.
  void start_step();
  // Waits for every rank, sets this rank's /ranks columns (bytes, CPU and wait seconds since
  // start_step, seconds in and out of collectives, the digest word and version of the weights
  // it holds) and /steps/write_s, then appends the row: collective over the world communicator.
  void finish_step(io::StatsRow& row, double step_s, double comm_s, std::int64_t weights_digest,
                   std::uint64_t version);

 private:
  std::uint64_t all_bytes(bool sent) const;
  std::uint64_t trainer_bytes(bool sent) const;

  io::StatsFile& file_;
  Communicator world_, trainers_, sync_;
  std::vector<Communicator> counted_;
  std::uint64_t sent0_ = 0, recv0_ = 0, patch_recv0_ = 0, trainer_sent0_ = 0, trainer_recv0_ = 0;
  double cpu0_ = 0;
  WaitTotals wait0_;
  double last_write_s_;  // NaN before the first append
};

}  // namespace pulse
