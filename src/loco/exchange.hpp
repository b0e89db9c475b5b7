#pragma once
// The pseudo-gradient exchanges of the outer step, on host buffers. Each one leaves in `sum`
// the sum over trainers of their contributions, added in rank order starting from +0 (a
// trainer that sends nothing for an element adds nothing). The order is fixed, so every
// trainer holds the same bits, and the three exchanges agree bit for bit on the same inputs:
// the partial sums are never -0, so adding a +0 for an unsent element changes nothing.
// All bytes are counted on the given channel, by the rule of comm/collectives.hpp (what this
// rank sends to and receives from the other trainers).
#include <cstdint>

#include "comm/collectives.hpp"
#include "kernels/types.hpp"

namespace pulse::loco {

// Rank r owns elements [chunk_begin(n, ranks, r), chunk_begin(n, ranks, r + 1)) in reduce-scatters.
using pulse::chunk_begin;

// DiLoCo: every trainer's dense vector; a reduce-scatter by owner chunk (alltoallv, summed in
// rank order by the owner) followed by an allgatherv of the owners' sums.
void dense_sum(const Communicator& comm, const float* dense, index_t n, float* sum, Channel channel);

// PULSELoCo over MPI_Allgatherv: every trainer's coded (index, value) payload goes to every
// trainer, which decodes them in rank order. Returns this rank's payload size in bytes.
std::uint64_t sparse_allgather_sum(const Communicator& comm, const index_t* sorted_indices, const float* values,
                                   std::size_t count, index_t n, float* sum, Channel channel);

// PULSELoCo as a sparse reduce-scatter: each trainer sends the pairs of chunk r to its owner
// r (alltoallv of coded payloads), the owner sums them in rank order and codes the elements
// anyone sent, and an allgatherv spreads the owners' payloads. Returns the bytes of this
// rank's coded payloads (both phases).
std::uint64_t sparse_reduce_scatter_sum(const Communicator& comm, const index_t* sorted_indices, const float* values,
                                        std::size_t count, index_t n, float* sum, Channel channel);

}  // namespace pulse::loco
