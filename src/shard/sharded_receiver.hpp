#pragma once
// Resharding receivers (issue 26 item 3): ranks that each hold pieces of a model state (TP row
// or column slices, flat ranges; a fused tensor is the pieces of several tensors in one buffer)
// apply a full patch to their pieces only, and verify the result together: each rank's partial
// block digests of its pieces are summed over the receivers' communicator (MPI_Allreduce of 80
// bytes per tensor, 32-bit limbs in int64 words: base and target digests and the elements
// held) into the tensor digests and the state digests, which must be the patch's base and target. On any failure on any rank
// every rank puts its pieces back as they were and throws (the apply is transactional).
//
// A raw or keydiff patch decodes from the old values at the changed elements only, so any
// pieces work. An expclass patch decodes a segment from the old values of all its elements: a
// rank must hold every segment it decodes whole (in the patch's parts, the segments before the
// last one it needs), else it refuses in one line: use keydiff patches for sliced receivers, or
// sender pieces (encode_sharded) that match the receivers'. Patches that change the layout or
// metadata, carry tensors whole, or are coded against a change history are refused. The steps
// without MPI are SlicedApply's (sliced_apply.hpp), for other frameworks' all-reduce.
#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "shard/sliced_apply.hpp"

namespace pulse::sync {

// Collective over comm, whose ranks together hold every element of the layout (every tensor of
// the state, any order, the same on every rank) exactly once. The parts this rank needs are
// decoded on `threads` threads (0: the cores). Returns the elements this rank wrote.
std::uint64_t apply_sharded(const Communicator& comm, const ParsedPatch& patch, const std::vector<TensorLayout>& layout,
                            const std::vector<ReceiverSlice>& slices, const Metadata& metadata = {}, unsigned threads = 0);

}  // namespace pulse::sync
