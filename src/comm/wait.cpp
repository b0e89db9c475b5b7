#include "comm/wait.hpp"

#include <time.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>

#include "comm/communicator.hpp"
#include "core/error.hpp"

namespace pulse {

namespace {

// Polls without sleeping for the first spin_for, then sleeps between polls, first_nap growing to
// longest_nap: the longest wait a finished peer can see, against a step of tens of milliseconds.
// spin_for is longer than longest_nap: a peer that is there but asleep in its own wait (a sender
// whose message the asleep receiver must take, as a broadcast of more than a few hundred bytes
// over shared memory needs) wakes within it, and the rank waiting on it keeps its core meanwhile,
// as a blocking call would; one that loses its core to a nap on a loaded machine can take a time
// slice (milliseconds) to get it back. A longer wait costs spin_for of CPU.
constexpr std::chrono::microseconds spin_for{1000}, first_nap{20}, longest_nap{500};

WaitTotals totals;
bool in_clock = false;

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

WaitMode mode_from_environment() {
  const char* value = std::getenv("PULSE_MPI_WAIT");
  if (value == nullptr || std::string(value) == "sleep") return WaitMode::sleep;
  if (std::string(value) == "spin") return WaitMode::spin;
  throw_error(__FILE__, __LINE__, std::string("PULSE_MPI_WAIT must be spin or sleep, got '") + value + "'");
}

}  // namespace

WaitMode wait_mode() {
  static const WaitMode mode = mode_from_environment();
  return mode;
}

const char* wait_mode_name(WaitMode mode) { return mode == WaitMode::spin ? "spin" : "sleep"; }

void sleep_until_complete(MPI_Request& request, const char* what) {
  const auto start = std::chrono::steady_clock::now();
  auto nap = first_nap;
  for (;;) {
    int done = 0;
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), what);
    if (done) return;
    if (std::chrono::steady_clock::now() - start < spin_for) continue;
    std::this_thread::sleep_for(nap);
    nap = std::min(longest_nap, nap * 2);
  }
}

void wait_for_ranks(MPI_Comm comm) {
  if (wait_mode() == WaitMode::spin) return;
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Ibarrier(comm, &request), "MPI_Ibarrier");
  sleep_until_complete(request, "MPI_Ibarrier");
}

void wait_for_ranks(const Communicator& comm) { wait_for_ranks(comm.raw()); }

WaitTotals wait_totals() { return totals; }

WaitClock::WaitClock() : outer_(!in_clock) {
  if (!outer_) return;
  in_clock = true;
  start_ = std::chrono::steady_clock::now();
  cpu_start_ = thread_cpu_seconds();
}

WaitClock::~WaitClock() {
  if (!outer_) return;
  totals.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  totals.cpu_seconds += thread_cpu_seconds() - cpu_start_;
  in_clock = false;
}

}  // namespace pulse
