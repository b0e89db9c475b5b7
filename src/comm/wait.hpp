#pragma once
// Waiting for the other ranks without holding the core. A rank that reaches a collective call
// long before its peers (an inference rank while the trainer trains, a trainer while rollouts
// are sampled) would spin inside MPI at full CPU: Open MPI's blocking calls poll, and its
// mpi_yield_when_idle only calls sched_yield between polls, which still burns the core when
// nothing else is runnable. In sleep mode (the default) pulse's collectives make the nonblocking
// form of their MPI call and poll its request with MPI_Test, sleeping between polls once the wait
// lasts (sleep_until_complete); one message round, as in the blocking call. The data moved, and
// so every result, are the same in either mode: a floating-point sum, whose rounding depends on
// the order of its additions and so on the algorithm, keeps the blocking MPI call, after a
// sleeping meeting of the ranks (wait_for_ranks). PULSE_MPI_WAIT=spin (or sleep) in the
// environment chooses, the same on every rank; spin makes the blocking calls, as before. Like the
// MPI calls themselves (pulse initializes MPI at most FUNNELED), these run on one thread.
#include <mpi.h>

#include <chrono>

#include "comm/communicator.hpp"

namespace pulse {

enum class WaitMode { spin, sleep };

// From PULSE_MPI_WAIT ("spin" or "sleep"; unset: sleep), read once. Throws on another value.
WaitMode wait_mode();
const char* wait_mode_name(WaitMode mode);

// Returns once request has completed: polls with MPI_Test, without sleeping for the first 1 ms
// (a peer that is nearly there, or asleep in a wait of its own), then sleeping between polls,
// naps of 20 us growing to 500 us. `what` names the call in an error.
void sleep_until_complete(MPI_Request& request, const char* what);

// One collective MPI call: in spin mode `blocking()`, in sleep mode `start(&request)` (the
// nonblocking form of the same call) and sleep_until_complete. Each returns an MPI error code.
template <class Blocking, class Start>
void collective_call(const char* what, const Blocking& blocking, const Start& start) {
  if (wait_mode() == WaitMode::spin) {
    check_mpi(blocking(), what);
    return;
  }
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(start(&request), what);
  sleep_until_complete(request, what);
}

// Returns once every rank of comm has called it (a no-op in spin mode, where the collective's
// own call waits): before a blocking call that has no nonblocking twin with the same result, and
// where a rank's next timing should not include the wait for the slowest. Collective.
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
