#pragma once
// The BF16 weights a step changed, gathered on the device into a change set
// (sync/change_set.hpp: sorted flat indices, their new bits, each tensor's begin), from AdamW's
// staging or by comparing two versions; only the set crosses to the host, and the host copy of
// the weights follows by applying it.
#include <cstdint>
#include <vector>

#include "kernels/adamw.hpp"
#include "kernels/segments.hpp"
#include "kernels/types.hpp"
#include "sync/change_set.hpp"
#include "train/transfer_counter.hpp"

namespace pulse {

// Compaction buffers on the device that grow to the largest count seen (compact_changed's
// capacity contract: a count above the capacity grows them and compacts again).
class ChangeCompactor {
 public:
  // What differs between before and after, over tensors at flat `offsets` (num_tensors + 1).
  void compact(const Kokkos::View<const bf16_bits*>& before, const Kokkos::View<const bf16_bits*>& after,
               const std::vector<index_t>& offsets, TransferCounter& copies, sync::ChangeSet& out);
  // The set AdamW staged in its own pass (kernels/adamw.hpp), without another scan; each
  // tensor's begin is where its first segment's changes start in the gathered list.
  void gather(const TensorSegments<DefaultMem>& segs, const ChangeStaging<DefaultMem>& staging, TransferCounter& copies,
              sync::ChangeSet& out);

 private:
  Kokkos::View<index_t*> indices_;
  Kokkos::View<bf16_bits*> values_;
  Kokkos::View<std::uint32_t*> narrow_;  // the indices as 32-bit words, for the copy
  Kokkos::View<index_t*> tensor_begin_;  // gather: one per tensor and one more

  // Grows the buffers to hold count entries; true if they grew.
  bool reserve(index_t count);
  // The first count entries of the buffers, copied to the host (32-bit indices when n < 2^32).
  void download(index_t count, index_t num_elements, TransferCounter& copies, sync::ChangeSet& out);
};

}  // namespace pulse
