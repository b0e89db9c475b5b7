#pragma once
// How many threads a pulse-measure rank runs when --threads is not given: its share of the cores
// it may run on. A rank may run on its affinity mask (what mpirun's binding, Slurm's cgroup or
// `taskset` gives it; pulse-sync's --threads 0 counts the same mask), and each of those cores is
// shared with the other ranks of the node whose masks hold it: bound ranks get their cores,
// unbound ones an equal part of the node's.
#include <sched.h>

#include <mpi.h>

#include <vector>

namespace pulse::measure {

// The sum over the cores in node_masks[me] of 1 / (ranks whose mask holds the core), rounded
// down, at least 1.
unsigned threads_of_mask(const std::vector<cpu_set_t>& node_masks, std::size_t me);

// threads_of_mask for this rank, from the masks of the ranks on its node (collective on comm).
unsigned default_rank_threads(MPI_Comm comm);

}  // namespace pulse::measure
