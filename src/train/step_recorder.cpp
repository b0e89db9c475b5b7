#include "train/step_recorder.hpp"

#include <Kokkos_Core.hpp>
#include <sys/resource.h>

#include <cmath>

#include "comm/wait.hpp"

namespace pulse {

namespace {

// User + system CPU seconds of this process so far, all threads.
double process_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return double(t.tv_sec) + 1e-6 * double(t.tv_usec); };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

}  // namespace

StepRecorder::StepRecorder(io::StatsFile& file, const Communicator& world, const Communicator& trainers,
                           const Communicator& sync, std::vector<Communicator> counted)
    : file_(file), world_(world), trainers_(trainers), sync_(sync), counted_(std::move(counted)),
      last_write_s_(std::nan("")) {}

std::uint64_t StepRecorder::all_bytes(bool sent) const {
  std::uint64_t b = 0;
  for (const Communicator& comm : counted_)
    for (int ch = 0; ch < num_channels; ++ch) b += sent ? comm.bytes_sent(Channel(ch)) : comm.bytes_received(Channel(ch));
  return b;
}

std::uint64_t StepRecorder::trainer_bytes(bool sent) const {
  std::uint64_t b = 0;
  for (const Channel ch : {Channel::gradients, Channel::pseudo_gradients})
    b += sent ? trainers_.bytes_sent(ch) : trainers_.bytes_received(ch);
  return b;
}

void StepRecorder::start_step() {
  sent0_ = all_bytes(true), recv0_ = all_bytes(false);
  patch_recv0_ = sync_.bytes_received(Channel::patches);
  trainer_sent0_ = trainer_bytes(true), trainer_recv0_ = trainer_bytes(false);
  cpu0_ = process_cpu_seconds();
  wait0_ = wait_totals();
}

void StepRecorder::finish_step(io::StatsRow& row, double step_s, double comm_s, std::int64_t weights_digest,
                               std::uint64_t version) {
  // Meet the other ranks first, so the append's own time is not a wait for the slowest rank.
  {
    const WaitClock clock;
    wait_for_ranks(world_);
  }
  const WaitTotals wait = wait_totals();
  row.set_rank_int("/ranks/bytes_sent", std::int64_t(all_bytes(true) - sent0_));
  row.set_rank_int("/ranks/bytes_recv", std::int64_t(all_bytes(false) - recv0_));
  row.set_rank_int("/ranks/patch_bytes_recv", std::int64_t(sync_.bytes_received(Channel::patches) - patch_recv0_));
  row.set_rank_int("/ranks/trainer_bytes_sent", std::int64_t(trainer_bytes(true) - trainer_sent0_));
  row.set_rank_int("/ranks/trainer_bytes_recv", std::int64_t(trainer_bytes(false) - trainer_recv0_));
  row.set_rank("/ranks/comm_s", comm_s);
  row.set_rank("/ranks/compute_s", step_s - comm_s);
  row.set_rank("/ranks/cpu_s", process_cpu_seconds() - cpu0_);
  row.set_rank("/ranks/wait_s", wait.seconds - wait0_.seconds);
  row.set_rank("/ranks/wait_cpu_s", wait.cpu_seconds - wait0_.cpu_seconds);
  row.set_rank_int("/ranks/weights_digest", weights_digest);
  row.set_rank_int("/ranks/version", std::int64_t(version));
  row.set("/steps/write_s", last_write_s_);
  Kokkos::Timer write_timer;
  file_.append(row);
  last_write_s_ = write_timer.seconds();  // rank 0's, which holds the file (other ranks wait for it)
}

}  // namespace pulse
