#include "loco/exchange.hpp"

#include <algorithm>
#include <vector>

#include "comm/collectives.hpp"
#include "core/error.hpp"
#include "loco/sparse_payload.hpp"

namespace pulse::loco {

namespace {

std::vector<index_t> displacements(const std::vector<index_t>& counts) {
  std::vector<index_t> displs(counts.size() + 1, 0);
  for (std::size_t r = 0; r < counts.size(); ++r) displs[r + 1] = displs[r] + counts[r];
  return displs;
}

// Gathers every rank's bytes; returns the offsets of rank r's bytes in `all`.
std::vector<index_t> allgather_bytes(const Communicator& comm, const std::vector<std::uint8_t>& mine,
                                     Kokkos::View<std::uint8_t*, Kokkos::HostSpace>& all, Channel channel) {
  return allgatherv(comm, as_view(mine.data(), mine.size()), all, channel);
}

}  // namespace

void dense_sum(const Communicator& comm, const float* dense, index_t n, float* sum, Channel channel) {
  const int ranks = comm.size(), me = comm.rank();
  const index_t my_begin = chunk_begin(n, ranks, me), my_len = chunk_begin(n, ranks, me + 1) - my_begin;
  std::vector<index_t> send_counts(ranks), send_displs(ranks), recv_counts(ranks, my_len), recv_displs(ranks);
  for (int r = 0; r < ranks; ++r) {
    send_displs[r] = chunk_begin(n, ranks, r);
    send_counts[r] = chunk_begin(n, ranks, r + 1) - send_displs[r];
    recv_displs[r] = r * my_len;
  }
  std::vector<float> received(static_cast<std::size_t>(ranks * my_len));
  alltoallv(comm, dense, send_counts, send_displs, received.data(), recv_counts, recv_displs, channel);

  std::vector<float> my_sum(static_cast<std::size_t>(my_len), 0.0f);
  for (int r = 0; r < ranks; ++r)
    for (index_t k = 0; k < my_len; ++k) my_sum[k] += received[r * my_len + k];
  auto sum_view = as_view(sum, static_cast<std::size_t>(n));
  allgatherv(comm, as_view(my_sum.data(), my_sum.size()), sum_view, channel);
}

std::uint64_t sparse_allgather_sum(const Communicator& comm, const index_t* sorted_indices, const float* values,
                                   std::size_t count, index_t n, float* sum, Channel channel) {
  const std::vector<std::uint8_t> payload = encode_sparse_payload(sorted_indices, values, count, 0);
  Kokkos::View<std::uint8_t*, Kokkos::HostSpace> all("pulse::loco::payloads", 0);
  const std::vector<index_t> offsets = allgather_bytes(comm, payload, all, channel);

  std::fill(sum, sum + n, 0.0f);
  SparsePairs pairs;
  for (int r = 0; r < comm.size(); ++r) {
    decode_sparse_payload(all.data() + offsets[r], offsets[r + 1] - offsets[r], 0, n, pairs);
    for (std::size_t k = 0; k < pairs.indices.size(); ++k) sum[pairs.indices[k]] += pairs.values[k];
  }
  return payload.size();
}

std::uint64_t sparse_reduce_scatter_sum(const Communicator& comm, const index_t* sorted_indices, const float* values,
                                        std::size_t count, index_t n, float* sum, Channel channel) {
  const int ranks = comm.size(), me = comm.rank();
  // Phase 1: the pairs of chunk r, coded relative to the chunk's start, go to rank r.
  std::vector<std::uint8_t> outgoing;
  std::vector<index_t> send_counts(ranks);
  const index_t* first = sorted_indices;
  for (int r = 0; r < ranks; ++r) {
    const index_t* last = std::lower_bound(first, sorted_indices + count, chunk_begin(n, ranks, r + 1));
    const std::vector<std::uint8_t> part =
        encode_sparse_payload(first, values + (first - sorted_indices), last - first, chunk_begin(n, ranks, r));
    outgoing.insert(outgoing.end(), part.begin(), part.end());
    send_counts[r] = static_cast<index_t>(part.size());
    first = last;
  }
  std::vector<index_t> recv_counts(ranks);
  const std::vector<index_t> ones(ranks, 1), iota = [&] {
    std::vector<index_t> v(ranks);
    for (int r = 0; r < ranks; ++r) v[r] = r;
    return v;
  }();
  alltoallv(comm, send_counts.data(), ones, iota, recv_counts.data(), ones, iota, channel);
  const std::vector<index_t> send_displs = displacements(send_counts), recv_displs = displacements(recv_counts);
  std::vector<std::uint8_t> incoming(static_cast<std::size_t>(recv_displs.back()));
  alltoallv(comm, outgoing.data(), send_counts, send_displs, incoming.data(), recv_counts, recv_displs, channel);

  // The owner sums its chunk in rank order and remembers which elements anyone sent.
  const index_t my_begin = chunk_begin(n, ranks, me), my_end = chunk_begin(n, ranks, me + 1);
  std::vector<float> chunk_sum(static_cast<std::size_t>(my_end - my_begin), 0.0f);
  std::vector<std::uint8_t> touched(chunk_sum.size(), 0);
  SparsePairs pairs;
  for (int r = 0; r < ranks; ++r) {
    decode_sparse_payload(incoming.data() + recv_displs[r], recv_counts[r], my_begin, my_end, pairs);
    for (std::size_t k = 0; k < pairs.indices.size(); ++k) {
      chunk_sum[pairs.indices[k] - my_begin] += pairs.values[k];
      touched[pairs.indices[k] - my_begin] = 1;
    }
  }
  std::vector<index_t> union_indices;
  std::vector<float> union_values;
  for (std::size_t k = 0; k < chunk_sum.size(); ++k) {
    if (!touched[k]) continue;
    union_indices.push_back(my_begin + static_cast<index_t>(k));
    union_values.push_back(chunk_sum[k]);
  }

  // Phase 2: every owner's sums to everyone.
  const std::vector<std::uint8_t> summed =
      encode_sparse_payload(union_indices.data(), union_values.data(), union_indices.size(), my_begin);
  Kokkos::View<std::uint8_t*, Kokkos::HostSpace> all("pulse::loco::chunk_sums", 0);
  const std::vector<index_t> offsets = allgather_bytes(comm, summed, all, channel);
  std::fill(sum, sum + n, 0.0f);
  for (int r = 0; r < ranks; ++r) {
    decode_sparse_payload(all.data() + offsets[r], offsets[r + 1] - offsets[r], chunk_begin(n, ranks, r),
                          chunk_begin(n, ranks, r + 1), pairs);
    for (std::size_t k = 0; k < pairs.indices.size(); ++k) sum[pairs.indices[k]] = pairs.values[k];
  }
  return outgoing.size() + summed.size();
}

}  // namespace pulse::loco
