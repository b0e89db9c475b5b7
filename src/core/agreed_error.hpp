#pragma once
// An error thrown on every rank of an MPI job alike (comm/agree.hpp): no rank is left inside a
// collective call, so an app prints it once (rank 0) and ends with MPI_Finalize, not MPI_Abort.
#include "core/error.hpp"

namespace pulse {

class AgreedError : public Error {
 public:
  using Error::Error;
};

}  // namespace pulse
