#pragma once
// What each rank's pieces of a model state add to the group's (PieceSums), summed over a
// communicator (40 bytes per tensor per rank); and the agreement of every rank that its own
// step succeeded before the group goes on (a rank that fails alone would leave the others
// waiting in a collective). Shared by sharded_sender and sharded_receiver.
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "shard/piece_sums.hpp"

namespace pulse::sync {

// Sums every rank's sums (one per tensor, the same count on every rank) into root's (root >= 0,
// MPI_Reduce) or every rank's (root < 0, MPI_Allreduce); counted on `channel`.
void sum_over_ranks(const Communicator& comm, std::vector<PieceSums>& sums, int root, Channel channel);

// Collective. Each rank passes the error of its own step, or none; when any rank has one,
// every rank throws: a failing rank its own error, the others a line naming the first failing
// rank and `step`.
void agree(const Communicator& comm, const std::exception_ptr& error, const std::string& step);

}  // namespace pulse::sync
