#include "train/changed_list.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/error.hpp"
#include "kernels/sparsity.hpp"

namespace pulse {

namespace {

// A free function: nvcc rejects a device lambda in a private member function.
void narrow_indices(const DefaultExec& space, const Kokkos::View<const index_t*>& wide,
                    const Kokkos::View<std::uint32_t*>& narrow, index_t count) {
  Kokkos::parallel_for("pulse::changed::narrow", FlatPolicy<DefaultExec>(space, 0, count),
                       KOKKOS_LAMBDA(const index_t j) { narrow(j) = std::uint32_t(wide(j)); });
}

}  // namespace

bool ChangeCompactor::reserve(index_t count) {
  if (count <= index_t(indices_.extent(0))) return false;
  using Kokkos::view_alloc, Kokkos::WithoutInitializing;
  indices_ = Kokkos::View<index_t*>(view_alloc(WithoutInitializing, "pulse::changed::indices"), count);
  values_ = Kokkos::View<bf16_bits*>(view_alloc(WithoutInitializing, "pulse::changed::values"), count);
  return true;
}

ChangedList ChangeCompactor::compact(const Kokkos::View<const bf16_bits*>& before,
                                     const Kokkos::View<const bf16_bits*>& after, TransferCounter& copies) {
  const DefaultExec space;
  index_t count = compact_changed(space, before, after, indices_, values_);
  if (reserve(count)) count = compact_changed(space, before, after, indices_, values_);
  return download(count, index_t(after.extent(0)), copies);
}

ChangedList ChangeCompactor::gather(const TensorSegments<DefaultMem>& segs, const ChangeStaging<DefaultMem>& staging,
                                    TransferCounter& copies) {
  const DefaultExec space;
  index_t count = gather_changes(space, segs, staging, indices_, values_);
  if (reserve(count)) count = gather_changes(space, segs, staging, indices_, values_);
  return download(count, segs.num_elements, copies);
}

ChangedList ChangeCompactor::download(index_t count, index_t num_elements, TransferCounter& copies) {
  const DefaultExec space;
  ChangedList list;
  list.values = copies.to_host(Kokkos::subview(values_, std::make_pair(index_t(0), count)));
  if (std::uint64_t(num_elements) > std::numeric_limits<std::uint32_t>::max()) {
    list.indices = copies.to_host(Kokkos::subview(indices_, std::make_pair(index_t(0), count)));
    return list;
  }
  // Indices below 2^32 cross as 32-bit words: 6 bytes per changed element instead of 10.
  if (index_t(narrow_.extent(0)) < count)
    narrow_ = Kokkos::View<std::uint32_t*>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "pulse::changed::narrow"),
                                           indices_.extent(0));
  narrow_indices(space, indices_, narrow_, count);
  const std::vector<std::uint32_t> words = copies.to_host(Kokkos::subview(narrow_, std::make_pair(index_t(0), count)));
  list.indices.assign(words.begin(), words.end());
  return list;
}

std::vector<index_t> per_tensor_counts(const ChangedList& list, const std::vector<index_t>& offsets) {
  PULSE_CHECK(!offsets.empty(), "per_tensor_counts: no tensor offsets");
  std::vector<index_t> counts(offsets.size() - 1, 0);
  auto at = list.indices.begin();
  for (std::size_t t = 0; t + 1 < offsets.size(); ++t) {
    const auto end = std::lower_bound(at, list.indices.end(), offsets[t + 1]);
    counts[t] = index_t(end - at);
    at = end;
  }
  return counts;
}

void apply_changes(const ChangedList& list, std::vector<bf16_bits>& weights) {
  PULSE_CHECK(list.indices.size() == list.values.size(), "changed list: indices and values differ in length");
  for (std::size_t j = 0; j < list.indices.size(); ++j) {
    PULSE_CHECK(list.indices[j] >= 0 && std::size_t(list.indices[j]) < weights.size(),
                "changed list: index " + std::to_string(list.indices[j]) + " outside " + std::to_string(weights.size()));
    weights[std::size_t(list.indices[j])] = list.values[j];
  }
}

}  // namespace pulse
