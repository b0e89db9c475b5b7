#pragma once
// Waiting for the other ranks without holding the core. A rank that reaches a collective call
// long before its peers (an inference rank while the trainer trains, a trainer while rollouts
// are sampled) would spin inside MPI at full CPU: Open MPI's blocking calls poll, and its
// mpi_yield_when_idle only calls sched_yield between polls, which still burns the core when
// nothing else is runnable. In sleep mode (the default) pulse's collectives first meet the other
// ranks in an MPI_Ibarrier polled with MPI_Test, sleeping between polls once the wait lasts,
// then make the same blocking MPI call as before, which finds every rank there. The MPI call and
// so every result stay the same in either mode; only the core's time while waiting differs.
// PULSE_MPI_WAIT=spin (or sleep) in the environment chooses, the same on every rank. Like the MPI
// calls themselves (pulse initializes MPI at most FUNNELED), these run on one thread.
#include <mpi.h>

#include <chrono>

namespace pulse {

class Communicator;

enum class WaitMode { spin, sleep };

// From PULSE_MPI_WAIT ("spin" or "sleep"; unset: sleep), read once. Throws on another value.
WaitMode wait_mode();
const char* wait_mode_name(WaitMode mode);

// Returns once every rank of comm has called it (a no-op in spin mode, where the collective's
// own call waits). Collective.
void wait_for_ranks(const Communicator& comm);
void wait_for_ranks(MPI_Comm comm);

// Seconds this process spent in pulse's collective calls (waiting for the other ranks included)
// since it started: wall time and the CPU time of the calling thread meanwhile. The CPU share
// of a wait is what it took from the core: near 1 when spinning, near 0 when asleep.
struct WaitTotals {
  double seconds = 0, cpu_seconds = 0;
};
WaitTotals wait_totals();

// Adds the wall and thread CPU time of its scope to wait_totals(). Not nested: a collective that
// calls another times only the outer call.
class WaitClock {
 public:
  WaitClock();
  ~WaitClock();
  WaitClock(const WaitClock&) = delete;
  WaitClock& operator=(const WaitClock&) = delete;

 private:
  bool outer_;
  std::chrono::steady_clock::time_point start_;
  double cpu_start_ = 0;
};

}  // namespace pulse
