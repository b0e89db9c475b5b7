#include "comm/agree.hpp"

#include <cstdint>
#include <exception>
#include <string>

#include "comm/communicator.hpp"
#include "comm/wait.hpp"

namespace pulse {

void agree_on_error(MPI_Comm comm, const std::function<void()>& work) {
  std::string error;
  bool failed = false;
  try {
    work();
  } catch (const std::exception& e) {
    failed = true;
    error = e.what();
  }
  if (failed && error.empty()) error = "unknown error";
  int rank = 0, size = 1;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  int first = failed ? rank : size;
  const WaitClock clock;
  collective_call("MPI_Allreduce", [&] { return MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm); },
                  [&](MPI_Request* request) {
                    return MPI_Iallreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm, request);
                  });
  if (first == size) return;
  std::uint64_t length = error.size();
  check_mpi(MPI_Bcast(&length, 1, MPI_UINT64_T, first, comm), "MPI_Bcast");
  error.resize(length);
  check_mpi(MPI_Bcast(error.data(), int(length), MPI_CHAR, first, comm), "MPI_Bcast");
  throw AgreedError(error);
}

}  // namespace pulse
