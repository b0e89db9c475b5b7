#pragma once
// Runs tasks 0..n-1 on a few std::threads: the parts of a patch, the block ranges of a digest.
// Each task runs exactly once; the first exception (by task order) is rethrown after all ended.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <thread>
#include <vector>

#include <sched.h>

namespace pulse::sync {

// 0 means the cores this process may run on: its affinity mask (what Slurm's cgroup or
// `taskset` gives it), not every core of the node.
inline unsigned resolve_threads(unsigned threads) {
  if (threads > 0) return threads;
  cpu_set_t mask;
  if (sched_getaffinity(0, sizeof(mask), &mask) == 0 && CPU_COUNT(&mask) > 0) return unsigned(CPU_COUNT(&mask));
  const unsigned cores = std::thread::hardware_concurrency();
  return cores > 0 ? cores : 1;
}

template <class Task>
void parallel_for(unsigned threads, std::size_t n, Task&& task) {
  threads = resolve_threads(threads);
  if (threads <= 1 || n <= 1) {
    for (std::size_t i = 0; i < n; ++i) task(i);
    return;
  }
  std::vector<std::exception_ptr> errors(n);
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < n;) {
      try {
        task(i);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  const std::size_t count = std::min<std::size_t>(threads, n) - 1;
  pool.reserve(count);
  for (std::size_t t = 0; t < count; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace pulse::sync
