#include "measure/rank_threads.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"

namespace pulse::measure {

unsigned threads_of_mask(const std::vector<cpu_set_t>& node_masks, std::size_t me) {
  PULSE_CHECK(me < node_masks.size(), "threads_of_mask: no mask for this rank");
  double share = 0;
  for (int core = 0; core < CPU_SETSIZE; ++core) {
    if (!CPU_ISSET(core, &node_masks[me])) continue;
    int holders = 0;
    for (const cpu_set_t& mask : node_masks) holders += CPU_ISSET(core, &mask) ? 1 : 0;
    share += 1.0 / holders;
  }
  return std::max(1u, unsigned(std::floor(share + 1e-9)));  // 3 x 1/3 is 1
}

unsigned default_rank_threads(MPI_Comm comm) {
  MPI_Comm node;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int me = 0, ranks = 1;
  MPI_Comm_rank(node, &me);
  MPI_Comm_size(node, &ranks);
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof(mine), &mine) != 0 || CPU_COUNT(&mine) == 0) CPU_SET(0, &mine);
  std::vector<cpu_set_t> masks(static_cast<std::size_t>(ranks));
  MPI_Allgather(&mine, int(sizeof(cpu_set_t)), MPI_BYTE, masks.data(), int(sizeof(cpu_set_t)), MPI_BYTE, node);
  MPI_Comm_free(&node);
  return threads_of_mask(masks, std::size_t(me));
}

}  // namespace pulse::measure
