#include "train/parameter_store.hpp"

#include <cmath>
#include <string>

#include "kernels/bf16.hpp"
#include "kernels/grad_norm.hpp"
#include "kernels/host_copy.hpp"

namespace pulse {

ParameterStore::ParameterStore(const TensorTable& table, Precision precision, const std::vector<float>& initial,
                               bool list_changes)
    : precision_(precision), segs_(make_segments(table.offsets())), decay_mask_(to_device(table.weight_decay_mask())) {
  const index_t n = table.num_elements();
  PULSE_CHECK(initial.size() == std::size_t(n), "ParameterStore: " + std::to_string(initial.size()) +
                                                    " initial weights for a table of " + std::to_string(n));
  weights_ = Kokkos::View<bf16_bits*>("weights_bf16", n);
  const Kokkos::View<float*> master = to_device(initial);
  cast_to_bf16(DefaultExec(), master, weights_);
  if (precision_ == Precision::mixed) {
    master_ = master;
    m_ = Kokkos::View<float*>("adam_m", n), v_ = Kokkos::View<float*>("adam_v", n);
  } else {
    m16_ = Kokkos::View<bf16_bits*>("adam_m", n), v16_ = Kokkos::View<bf16_bits*>("adam_v", n);
    grad_bf16_ = Kokkos::View<bf16_bits*>("grad_bf16", n);
  }
  if (list_changes) staging_ = make_change_staging(segs_);
}

float ParameterStore::step(std::int64_t t, const Kokkos::View<const float*>& grad, const AdamWHyper& hyper,
                           double grad_clip, bool list) {
  PULSE_CHECK(!list || staging_.indices.extent(0) > 0, "ParameterStore: step lists changes but was made without staging");
  const bool mixed = precision_ == Precision::mixed;
  // Pure BF16 clips and steps with the gradient as a BF16 model holds it.
  if (!mixed) cast_to_bf16(DefaultExec(), grad, grad_bf16_);
  const GradNorm norm = mixed ? grad_norm(DefaultExec(), segs_, grad, precision_)
                              : grad_norm(DefaultExec(), segs_, grad_bf16_, precision_);
  const float clip = grad_clip > 0 ? clip_coefficient(norm.total, grad_clip, precision_) : 1.0f;
  PULSE_CHECK(std::isfinite(clip), "training diverged at step " + std::to_string(t) +
                                       (mixed ? " (gradient norm " + std::to_string(norm.total) + ")" : ""));
  const AdamWScalars scalars = adamw_scalars(hyper, t, clip, precision_);
  if (mixed) {
    if (list) adamw_mixed(DefaultExec(), segs_, decay_mask_, scalars, master_, grad, m_, v_, weights_, staging_);
    else adamw_mixed(DefaultExec(), segs_, decay_mask_, scalars, master_, grad, m_, v_, weights_, false);
  } else {
    if (list) adamw_bf16(DefaultExec(), segs_, decay_mask_, scalars, weights_, grad_bf16_, m16_, v16_, staging_);
    else adamw_bf16(DefaultExec(), segs_, decay_mask_, scalars, weights_, grad_bf16_, m16_, v16_);
  }
  return norm.total;
}

const sync::ChangeSet& ParameterStore::gather_changes(TransferCounter& copies) {
  PULSE_CHECK(staging_.indices.extent(0) > 0, "ParameterStore: gathering changes without staging");
  compactor_.gather(segs_, staging_, copies, changes_);
  return changes_;
}

void ParameterStore::weights_from_master() { cast_to_bf16(DefaultExec(), master_, weights_); }

ParameterStore::Moments ParameterStore::moments_fp32() const {
  if (precision_ == Precision::mixed) return {m_, v_};
  Kokkos::View<float*> m("m32", m16_.extent(0)), v("v32", v16_.extent(0));
  cast_to_float(DefaultExec(), m16_, m), cast_to_float(DefaultExec(), v16_, v);
  return {m, v};
}

}  // namespace pulse
