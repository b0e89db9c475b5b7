#include "train/changed_list.hpp"

#include <cstdint>
#include <limits>

#include "core/error.hpp"
#include "kernels/sparsity.hpp"

namespace pulse {

namespace {

// Free functions: nvcc rejects a device lambda in a private member function.
void narrow_indices(const DefaultExec& space, const Kokkos::View<const index_t*>& wide,
                    const Kokkos::View<std::uint32_t*>& narrow, index_t count) {
  Kokkos::parallel_for("pulse::changed::narrow", FlatPolicy<DefaultExec>(space, 0, count),
                       KOKKOS_LAMBDA(const index_t j) { narrow(j) = std::uint32_t(wide(j)); });
}

// begins(t) = where tensor t's first segment's changes start in the gathered list (starts: per
// segment, as gather_changes left them); tensors without a segment (empty ones) keep -1.
void first_segment_starts(const DefaultExec& space, const TensorSegments<DefaultMem>& segs,
                          const Kokkos::View<const index_t*>& starts, const Kokkos::View<index_t*>& begins) {
  Kokkos::deep_copy(space, begins, index_t(-1));
  const auto segments = segs.segments;
  Kokkos::parallel_for("pulse::changed::tensor_begins",
                       FlatPolicy<DefaultExec>(space, 0, index_t(segments.extent(0))), KOKKOS_LAMBDA(const index_t j) {
                         if (j == 0 || segments(j - 1).tensor != segments(j).tensor) begins(segments(j).tensor) = starts(j);
                       });
}

}  // namespace

bool ChangeCompactor::reserve(index_t count) {
  if (count <= index_t(indices_.extent(0))) return false;
  using Kokkos::view_alloc, Kokkos::WithoutInitializing;
  indices_ = Kokkos::View<index_t*>(view_alloc(WithoutInitializing, "pulse::changed::indices"), count);
  values_ = Kokkos::View<bf16_bits*>(view_alloc(WithoutInitializing, "pulse::changed::values"), count);
  return true;
}

void ChangeCompactor::compact(const Kokkos::View<const bf16_bits*>& before, const Kokkos::View<const bf16_bits*>& after,
                              const std::vector<index_t>& offsets, TransferCounter& copies, sync::ChangeSet& out) {
  const DefaultExec space;
  index_t count = compact_changed(space, before, after, indices_, values_);
  if (reserve(count)) count = compact_changed(space, before, after, indices_, values_);
  download(count, index_t(after.extent(0)), copies, out);
  out.tensor_begin = sync::tensor_begins(out.indices, offsets);
}

void ChangeCompactor::gather(const TensorSegments<DefaultMem>& segs, const ChangeStaging<DefaultMem>& staging,
                             TransferCounter& copies, sync::ChangeSet& out) {
  const DefaultExec space;
  index_t count = gather_changes(space, segs, staging, indices_, values_);
  if (reserve(count)) count = gather_changes(space, segs, staging, indices_, values_);
  if (index_t(tensor_begin_.extent(0)) != index_t(segs.num_tensors))
    tensor_begin_ = Kokkos::View<index_t*>("pulse::changed::tensor_begin", segs.num_tensors);
  first_segment_starts(space, segs, staging.starts, tensor_begin_);
  download(count, segs.num_elements, copies, out);
  out.tensor_begin = copies.to_host(tensor_begin_);
  out.tensor_begin.push_back(count);
  for (std::size_t t = out.tensor_begin.size() - 1; t-- > 0;)  // an empty tensor begins where the next does
    if (out.tensor_begin[t] < 0) out.tensor_begin[t] = out.tensor_begin[t + 1];
}

void ChangeCompactor::download(index_t count, index_t num_elements, TransferCounter& copies, sync::ChangeSet& out) {
  const DefaultExec space;
  out.old_bits.clear();
  out.new_bits = copies.to_host(Kokkos::subview(values_, std::make_pair(index_t(0), count)));
  if (std::uint64_t(num_elements) > std::numeric_limits<std::uint32_t>::max()) {
    out.indices = copies.to_host(Kokkos::subview(indices_, std::make_pair(index_t(0), count)));
    return;
  }
  // Indices below 2^32 cross as 32-bit words: 6 bytes per changed element instead of 10.
  if (index_t(narrow_.extent(0)) < count)
    narrow_ = Kokkos::View<std::uint32_t*>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "pulse::changed::narrow"),
                                           indices_.extent(0));
  narrow_indices(space, indices_, narrow_, count);
  const std::vector<std::uint32_t> words = copies.to_host(Kokkos::subview(narrow_, std::make_pair(index_t(0), count)));
  out.indices.assign(words.begin(), words.end());
}

}  // namespace pulse
