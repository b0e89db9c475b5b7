#pragma once
// What each rank's pieces of a model state add to the group's, per tensor: the partial block
// digests (BlockDigest) of its base and target bytes and the elements it holds. MPI-free, so
// that the Python module's sliced receivers (sliced_apply.hpp) share it.
#include <cstdint>

#include "coding/digest.hpp"

namespace pulse::sync {

struct PieceSums {
  BlockDigest base, target;
  std::uint64_t elements = 0;
};

}  // namespace pulse::sync
