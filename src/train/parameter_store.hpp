#pragma once
// A trainer's weights and optimizer state in the default memory space: the FP32 master weights
// and Adam moments (mixed precision) or BF16 moments (pure BF16), the BF16 weights the forward
// pass reads, AdamW's change staging and the step's change set on the host. One place owns them,
// so the optimizer step and the list of checkpointed buffers cannot drift apart.
#include <cstdint>
#include <vector>

#include "core/tensor_table.hpp"
#include "kernels/adamw.hpp"
#include "kernels/segments.hpp"
#include "kernels/types.hpp"
#include "sync/change_set.hpp"
#include "train/changed_list.hpp"
#include "train/transfer_counter.hpp"

namespace pulse {

class ParameterStore {
 public:
  // Starts from `initial` (FP32, table order): master = initial, weights = bf16(initial), zero
  // moments. list_changes: keep a staging buffer so that step() can list what it changed.
  ParameterStore(const TensorTable& table, Precision precision, const std::vector<float>& initial,
                 bool list_changes);

  // Optimizer step t (1-based) on the FP32 gradient `grad`: its norm (in the step's precision),
  // clipping to grad_clip (0: none), AdamW. With `list`, the changed BF16 weights are staged in
  // the same pass (staging()). Returns the norm before clipping; throws when it is not finite.
  float step(std::int64_t t, const Kokkos::View<const float*>& grad, const AdamWHyper& hyper, double grad_clip,
             bool list);

  // The BF16 weights the forward pass reads.
  Kokkos::View<const bf16_bits*> weights() const { return weights_; }
  // The FP32 master weights (mixed precision; empty in pure BF16). An outer step (LoCo) rewrites
  // them in place and then calls weights_from_master().
  Kokkos::View<float*> master() const { return master_; }
  void weights_from_master();
  // The Adam moments in FP32 (pure BF16: converted copies).
  struct Moments {
    Kokkos::View<const float*> m, v;
  };
  Moments moments_fp32() const;

  Precision precision() const { return precision_; }
  const TensorSegments<DefaultMem>& segments() const { return segs_; }
  // What the last step(..., list = true) changed, per segment (gather_changes reads it).
  const ChangeStaging<DefaultMem>& staging() const { return staging_; }
  // The step's change set on the host: gather_changes fills it from the staging after a listed
  // step (else a comparison of versions does, SparsityMeter::measure); trainer 0 publishes it.
  sync::ChangeSet& changes() { return changes_; }
  const sync::ChangeSet& gather_changes(TransferCounter& copies);

  // Every checkpointed buffer, in checkpoint order: visit(name, view) with an FP32 or BF16 view.
  // One list for save and load.
  template <class Visit>
  void for_each_state_buffer(const Visit& visit) const {
    if (precision_ == Precision::mixed) visit("master", master_), visit("adam_m", m_), visit("adam_v", v_);
    else visit("adam_m", m16_), visit("adam_v", v16_);
    visit("weights", weights_);
  }

 private:
  Precision precision_;
  TensorSegments<DefaultMem> segs_;
  Kokkos::View<std::uint8_t*> decay_mask_;
  Kokkos::View<float*> master_, m_, v_;                  // mixed
  Kokkos::View<bf16_bits*> weights_, grad_bf16_, m16_, v16_;  // weights_: bf16(master) in mixed
  ChangeStaging<DefaultMem> staging_;
  ChangeCompactor compactor_;
  sync::ChangeSet changes_;
};

}  // namespace pulse
