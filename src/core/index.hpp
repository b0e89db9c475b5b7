#pragma once
// pulse's element index, in plain C++ so that core, the coding library and sync need no Kokkos;
// kernels/types.hpp reuses it for its range policies.
#include <cstdint>

namespace pulse {

// Element index into a flat parameter buffer (models beyond 2^31 elements exist).
using index_t = std::int64_t;

}  // namespace pulse
