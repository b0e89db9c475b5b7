#include "shard/sharded_sums.hpp"

#include <mpi.h>

#include <cstring>

#include "comm/collectives.hpp"
#include "core/error.hpp"

namespace pulse::sync {

namespace {

constexpr int kRecordBytes = 16 + 16 + 8;  // base digest, target digest, elements

BlockDigest digest_at(const std::uint8_t* p) {
  Digest d;
  std::memcpy(d.data(), p, 16);
  return BlockDigest::of(d);
}

void put_digest(std::uint8_t* p, const BlockDigest& b) {
  const Digest d = b.digest();
  std::memcpy(p, d.data(), 16);
}

// The MPI reduction: inout[k] += in[k] for each record (digests modulo 2^128).
void add_records(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const std::uint8_t*>(in);
  auto* b = static_cast<std::uint8_t*>(inout);
  for (int k = 0; k < *len; ++k, a += kRecordBytes, b += kRecordBytes) {
    for (int d = 0; d < 2; ++d) {
      BlockDigest sum = digest_at(b + 16 * d);
      sum += digest_at(a + 16 * d);
      put_digest(b + 16 * d, sum);
    }
    std::uint64_t x, y;
    std::memcpy(&x, a + 32, 8);
    std::memcpy(&y, b + 32, 8);
    y += x;
    std::memcpy(b + 32, &y, 8);
  }
}

}  // namespace

void sum_over_ranks(const Communicator& comm, std::vector<PieceSums>& sums, int root, Channel channel) {
  std::vector<std::uint8_t> send(sums.size() * kRecordBytes), recv(send.size());
  for (std::size_t i = 0; i < sums.size(); ++i) {
    std::uint8_t* p = send.data() + i * kRecordBytes;
    put_digest(p, sums[i].base);
    put_digest(p + 16, sums[i].target);
    std::memcpy(p + 32, &sums[i].elements, 8);
  }
  PULSE_CHECK(sums.size() <= std::size_t(INT32_MAX), "too many tensors to sum over ranks");
  MPI_Datatype record;
  MPI_Op op;
  check_mpi(MPI_Type_contiguous(kRecordBytes, MPI_BYTE, &record), "MPI_Type_contiguous");
  check_mpi(MPI_Type_commit(&record), "MPI_Type_commit");
  check_mpi(MPI_Op_create(&add_records, 1, &op), "MPI_Op_create");
  const int count = int(sums.size());
  int rc;
  if (root < 0)
    rc = MPI_Allreduce(send.data(), recv.data(), count, record, op, comm.raw());
  else
    rc = MPI_Reduce(send.data(), recv.data(), count, record, op, root, comm.raw());
  MPI_Op_free(&op);
  MPI_Type_free(&record);
  check_mpi(rc, root < 0 ? "MPI_Allreduce" : "MPI_Reduce");
  const std::uint64_t bytes = send.size(), others = std::uint64_t(comm.size() - 1);
  if (root < 0) {
    const std::uint64_t wire = detail::allreduce_wire_bytes(comm, sums.size(), kRecordBytes);
    comm.count_bytes(channel, wire, wire);
  } else if (comm.rank() == root) {
    comm.count_bytes(channel, 0, others * bytes);
  } else {
    comm.count_bytes(channel, bytes, 0);
  }
  if (root >= 0 && comm.rank() != root) return;
  for (std::size_t i = 0; i < sums.size(); ++i) {
    const std::uint8_t* p = recv.data() + i * kRecordBytes;
    sums[i].base = digest_at(p);
    sums[i].target = digest_at(p + 16);
    std::memcpy(&sums[i].elements, p + 32, 8);
  }
}

void agree(const Communicator& comm, const std::exception_ptr& error, const std::string& step) {
  const int first = allreduce_value(comm, error ? comm.rank() : comm.size(), ReduceOp::min);
  if (error) std::rethrow_exception(error);
  PULSE_CHECK(first == comm.size(), step + ": rank " + std::to_string(first) + " refused (see its error); no rank went on");
}

}  // namespace pulse::sync
