#pragma once
// A sharded sender (issue 26 item 3): ranks that each hold pieces of a model state (an FSDP
// flat range or row range of every tensor, or TP row or column slices) encode the parts of their
// own pieces from their own base and target values (encode_slice_parts), and root gathers the
// coded parts (MPI_Gatherv: bytes of the changes, never of the weights) and each rank's partial
// block digests (40 bytes per tensor per rank, summed by MPI_Reduce), then writes one patch
// (assemble_patch). It decodes to the changes an unsharded sender's patch holds.
//
// Each element of the state is held by exactly one rank. Pieces begin and end on the 128-byte
// grid of the tensor digest (tensor_slice_spec.hpp); a column slice is coded as one run per
// row, so it costs a part per row (its table entry and coder reset): prefer row or flat pieces.
// Tensors of dtypes that are not coded sparsely must not change. Not for gap-fixed or
// expclass-history codings.
#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "sync/patch.hpp"
#include "sync/tensor_slice_spec.hpp"

namespace pulse::sync {

// A rank's piece of a tensor: its elements of the base and of the target, row by row, contiguous.
struct SenderSlice {
  std::string name;
  SliceSpec spec;
  const std::byte* base = nullptr;
  const std::byte* target = nullptr;
};

// Collective over comm. Every rank passes the same layout (every tensor of the state, in any
// order), options and metadata, and its own pieces. Returns the patch on root and an empty
// vector elsewhere; with target_digests, root receives the target's digests. A rank's bad piece
// is refused on every rank with one line before anything is gathered; pieces that do not tile
// the state are refused on root.
std::vector<std::uint8_t> encode_sharded(const Communicator& comm, int root, const std::vector<TensorLayout>& layout,
                                         const std::vector<SenderSlice>& slices, const EncodeOptions& options,
                                         const Metadata& metadata = {}, StateDigests* target_digests = nullptr);

}  // namespace pulse::sync
