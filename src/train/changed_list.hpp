#pragma once
// The BF16 weights a step changed, as a list: sorted flat indices and their new bit patterns
// (a PULSESync patch's content). Compacted on the device from the previous and the new version;
// only the list crosses to the host, and the host copy of the weights follows by applying it.
#include <cstdint>
#include <vector>

#include "kernels/adamw.hpp"
#include "kernels/segments.hpp"
#include "kernels/types.hpp"
#include "train/transfer_counter.hpp"

namespace pulse {

struct ChangedList {
  std::vector<index_t> indices;  // sorted, each once
  std::vector<bf16_bits> values;  // the new bits of indices[j]
};

// Compaction buffers on the device that grow to the largest count seen (compact_changed's
// capacity contract: a count above the capacity grows them and compacts again).
class ChangeCompactor {
 public:
  ChangedList compact(const Kokkos::View<const bf16_bits*>& before, const Kokkos::View<const bf16_bits*>& after,
                      TransferCounter& copies);
  // The list AdamW staged in its own pass (kernels/adamw.hpp), without another scan.
  ChangedList gather(const TensorSegments<DefaultMem>& segs, const ChangeStaging<DefaultMem>& staging,
                     TransferCounter& copies);

 private:
  Kokkos::View<index_t*> indices_;
  Kokkos::View<bf16_bits*> values_;
  Kokkos::View<std::uint32_t*> narrow_;  // the indices as 32-bit words, for the copy

  // Grows the buffers to hold count entries; true if they grew.
  bool reserve(index_t count);
  // The first count entries of the buffers, copied to the host (32-bit indices when n < 2^32).
  ChangedList download(index_t count, index_t num_elements, TransferCounter& copies);
};

// Elements of the list in each tensor (offsets: the tensor table's num_tensors + 1 offsets).
std::vector<index_t> per_tensor_counts(const ChangedList& list, const std::vector<index_t>& offsets);

// weights[indices[j]] = values[j]: turns the host copy of the previous version into the new one.
void apply_changes(const ChangedList& list, std::vector<bf16_bits>& weights);

}  // namespace pulse
