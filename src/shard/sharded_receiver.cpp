#include "shard/sharded_receiver.hpp"

#include <mpi.h>

#include <optional>

#include "comm/collectives.hpp"
#include "core/error.hpp"
#include "shard/sharded_sums.hpp"

namespace pulse::sync {

std::uint64_t apply_sharded(const Communicator& comm, const ParsedPatch& patch, const std::vector<TensorLayout>& layout,
                            const std::vector<ReceiverSlice>& slices, const Metadata& metadata, unsigned threads) {
  std::optional<SlicedApply> apply;
  std::exception_ptr error;
  try {
    apply.emplace(patch, layout, slices, metadata, threads);
  } catch (...) {
    error = std::current_exception();
  }
  try {
    agree(comm, error, "sliced apply");
  } catch (...) {
    if (apply) apply->rollback();
    throw;
  }
  std::vector<std::int64_t> sums = apply->partial();
  const int count = int(sums.size());
  PULSE_CHECK(sums.size() <= std::size_t(INT32_MAX), "too many tensors to sum over ranks");
  const int rc = MPI_Allreduce(MPI_IN_PLACE, sums.data(), count, MPI_INT64_T, MPI_SUM, comm.raw());
  if (rc != MPI_SUCCESS) apply->rollback();
  check_mpi(rc, "MPI_Allreduce");
  const std::uint64_t wire = detail::allreduce_wire_bytes(comm, sums.size(), sizeof(std::int64_t));
  comm.count_bytes(Channel::patches, wire, wire);
  apply->finish(sums);
  return apply->written();
}

}  // namespace pulse::sync
