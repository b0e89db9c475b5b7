#pragma once
// Fused AdamW: one pass over the flat parameter buffer, bit-identical to
// torch.optim.AdamW(foreach=False) from PyTorch 1.13 (Debian bookworm).
//
// PyTorch runs AdamW as a chain of tensor ops; to match it bit for bit we keep its order of
// operations, round where it rounds, and fuse a multiply-add exactly where its CPU kernels do
// (add_ with alpha and addcmul_ compile to FMA). The project builds with contraction off so
// nothing else is fused.
//   mixed: every op in FP32; the BF16 copy of the new weights is written in the same pass.
//   bf16:  every op computes in FP32 and rounds its result to BF16, like PyTorch on a
//          .bfloat16() model; scalar operands of mul_/div/add are first rounded to BF16, those
//          of add_(alpha), addcmul_ and addcdiv_ stay FP32 (what PyTorch 1.13 does).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/bf16.hpp"
#include "kernels/segments.hpp"

// Host code with AVX-512 (BW, VL, VBMI2) stages the changed elements by compress instructions;
// other hosts by a scalar scan of the same flags, with the same list.
#if defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VBMI2__) && !defined(__CUDA_ARCH__) && \
    !defined(__HIP_DEVICE_COMPILE__)
#include <immintrin.h>
#define PULSE_STAGE_BY_COMPRESS 1
#endif

namespace pulse {

// Hyper-parameters in double: PyTorch computes its per-step scalars in Python floats.
struct AdamWHyper {
  double lr = 3e-6;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// The scalars one step hands to the element kernel, rounded as PyTorch rounds them.
struct AdamWScalars {
  float decay;            // 1 - lr * weight_decay, for tensors with weight decay on
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  float eps;
  float neg_step_size;    // -lr / (1 - beta1^t)
  float grad_scale;       // gradient-clipping coefficient, 1 when not clipping
};

// step is 1-based (PyTorch increments its step counter before using it).
inline AdamWScalars adamw_scalars(const AdamWHyper& h, std::int64_t step, float grad_scale,
                                  Precision precision) {
  PULSE_CHECK(step >= 1, "AdamW step must be >= 1, got " + std::to_string(step));
  const double t = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(h.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(h.beta2, t);
  // Scalars of mul_/div/add (tensor op Python number) take the tensor's dtype.
  auto as_operand = [precision](double x) {
    const float f = static_cast<float>(x);
    return precision == Precision::bf16 ? round_to_bf16(f) : f;
  };
  AdamWScalars s;
  s.decay = as_operand(1.0 - h.lr * h.weight_decay);
  s.beta1 = as_operand(h.beta1);
  s.one_minus_beta1 = as_operand(1.0 - h.beta1);  // add_(alpha=) on BF16 rounds alpha too
  s.beta2 = as_operand(h.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);  // addcmul_ keeps value in FP32
  s.bias_correction2_sqrt = as_operand(std::sqrt(bias_correction2));
  s.eps = as_operand(h.eps);
  s.neg_step_size = static_cast<float>(-(h.lr / bias_correction1));  // addcdiv_ keeps FP32
  s.grad_scale = grad_scale;
  return s;
}

namespace detail {

// One element of the mixed-precision step; returns the new FP32 weight.
KOKKOS_INLINE_FUNCTION float adamw_mixed_element(const AdamWScalars& s, bool decay, float w, float g,
                                                 float& m, float& v) {
  g = g * s.grad_scale;
  w = w * (decay ? s.decay : 1.0f);  // times 1 is exact: PyTorch's mul_(1 - lr*0)
  m = fmaf(g, s.one_minus_beta1, m * s.beta1);
  v = fmaf(s.one_minus_beta2 * g, g, v * s.beta2);
  const float denom = sqrtf(v) / s.bias_correction2_sqrt + s.eps;
  return w + (s.neg_step_size * m) / denom;
}

// One element of the BF16 step: every PyTorch op rounds its result to BF16. Scale and Decay say
// whether the gradient-scaling and weight-decay factors can differ from 1: a factor of 1 leaves
// a BF16 value as it is (a NaN may keep its payload, but every result it reaches is a NaN made
// canonical when stored), so those two multiply-and-rounds are skipped with the same bits out.
// HostRounding (host code paths): the intermediate results are rounded by
// round_to_bf16_keeping_nan and only the stored ones made canonical, the same bits with a compare
// and a select less per rounding; the scalars' NaNs must be canonical (with_canonical_nans). The
// division by bias_correction2_sqrt is a multiplication by inverse_bias_correction2_sqrt, its
// reciprocal: the same BF16 result where bf16_reciprocal_is_exact(bias_correction2_sqrt), which
// with_bf16_variant checks, and the divider, which bounds the element's speed, is freed.
// Forced inline: a call per element stops the loop over a segment from vectorising.
template <bool Scale, bool Decay, bool HostRounding = false>
KOKKOS_FORCEINLINE_FUNCTION bf16_bits adamw_bf16_element(const AdamWScalars& s,
                                                         [[maybe_unused]] float inverse_bias_correction2_sqrt,
                                                         bf16_bits w_bits, bf16_bits g_bits, bf16_bits& m_bits,
                                                         bf16_bits& v_bits) {
  const auto round = [](float x) { return HostRounding ? round_to_bf16_keeping_nan(x) : round_to_bf16(x); };
  const auto stored = [](float rounded) {
    return HostRounding ? bf16_of_rounded_canonical(rounded) : bf16_of_rounded(rounded);
  };
  float g = bf16_to_float(g_bits);
  if (Scale) g = round(g * s.grad_scale);
  float w = bf16_to_float(w_bits);
  if (Decay) w = round(w * s.decay);
  float m = round(bf16_to_float(m_bits) * s.beta1);
  m = round(fmaf(g, s.one_minus_beta1, m));
  float v = round(bf16_to_float(v_bits) * s.beta2);
  v = round(fmaf(s.one_minus_beta2 * g, g, v));
  float denom = round(sqrtf(v));
  denom = HostRounding ? round(denom * inverse_bias_correction2_sqrt) : round(denom / s.bias_correction2_sqrt);
  denom = round(denom + s.eps);
  m_bits = stored(m);
  v_bits = stored(v);
  return stored(round(w + (s.neg_step_size * m) / denom));
}

// The scalars with every NaN canonical, whatever its payload (a BF16 step's outputs are the same).
inline AdamWScalars with_canonical_nans(AdamWScalars s) {
  for (float* x : {&s.decay, &s.beta1, &s.one_minus_beta1, &s.beta2, &s.one_minus_beta2, &s.bias_correction2_sqrt,
                   &s.eps, &s.neg_step_size, &s.grad_scale})
    *x = canonical_nan_of(*x);
  return s;
}

// The element with both factors applied, as PyTorch runs it (decay: the tensor has weight decay).
KOKKOS_INLINE_FUNCTION bf16_bits adamw_bf16_element(const AdamWScalars& s, bool decay, bf16_bits w_bits,
                                                    bf16_bits g_bits, bf16_bits& m_bits, bf16_bits& v_bits) {
  return decay ? adamw_bf16_element<true, true>(s, 0.0f, w_bits, g_bits, m_bits, v_bits)
               : adamw_bf16_element<true, false>(s, 0.0f, w_bits, g_bits, m_bits, v_bits);
}

// Calls body(scale, decay, host_rounding), each a std::integral_constant<bool, ...>, with the
// element variant a segment needs: one loop per variant, without a per-element test. Host
// rounding on host code paths (host_path: as given to segment_policy) when the bias correction's
// reciprocal can stand in for it (always, for the scalars adamw_scalars computes).
template <class ExecSpace, class Body>
KOKKOS_INLINE_FUNCTION void with_bf16_variant(const AdamWScalars& s, bool decay, [[maybe_unused]] const bool host_path,
                                              const Body& body) {
  using yes = std::true_type;
  using no = std::false_type;
  const auto with_rounding = [&](auto scale, auto decayed) {
    if constexpr (is_host_space<ExecSpace>) {
      if (host_path && bf16_reciprocal_is_exact(s.bias_correction2_sqrt)) return body(scale, decayed, yes());
    }
    body(scale, decayed, no());
  };
  const bool scale = s.grad_scale != 1.0f;
  decay = decay && s.decay != 1.0f;
  if (scale) {
    if (decay) with_rounding(yes(), yes()); else with_rounding(yes(), no());
  } else {
    if (decay) with_rounding(no(), yes()); else with_rounding(no(), no());
  }
}

// Host paths: how many elements of the segment update(i) returns true for, counted in blocks
// whose count fits 16 bits, so the vectorised loop adds its compares' 16-bit lanes as they are
// (a 64-bit count per element widens every compare twice).
template <class Update>
KOKKOS_INLINE_FUNCTION index_t host_count(const Segment& seg, const Update& update) {
  constexpr index_t block = 4096;
  index_t count = 0;
  for (index_t b = seg.begin; b < seg.end; b += block) {
    const index_t end = b + block < seg.end ? b + block : seg.end;
    std::uint16_t block_count = 0;
    for (index_t i = b; i < end; ++i) block_count += update(i) ? 1 : 0;
    count += block_count;
  }
  return count;
}

}  // namespace detail

namespace detail {

template <bool CountChanges, class ExecSpace, class Mem, class MaskView, class MasterView, class GradView,
          class MomentView, class Bf16View>
index_t adamw_mixed_pass(const ExecSpace& space, const TensorSegments<Mem>& segs, const MaskView& decay_mask,
                         const AdamWScalars& s, const MasterView& master, const GradView& grad, const MomentView& m,
                         const MomentView& v, const Bf16View& weights_bf16) {
  using Team = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  const auto segments = segs.segments;
  const bool host_path = takes_host_path(space);
  index_t changed = 0;
  Kokkos::parallel_reduce(
      "pulse::adamw::mixed", segment_policy(space, segs, host_path),
      KOKKOS_LAMBDA(const Team& team, index_t& team_changed) {
        const Segment seg = segments(team.league_rank());
        const bool decay = decay_mask(seg.tensor) != 0;
        // A local copy of the scalars: without it GCC stops vectorising the loop under OpenMP.
        const AdamWScalars sl = s;
        const index_t seg_changed = segment_sum<ExecSpace>(team, seg, host_path, [&](const index_t i) -> index_t {
          float mi = m(i), vi = v(i);
          const float w = adamw_mixed_element(sl, decay, master(i), grad(i), mi, vi);
          const bf16_bits b = float_to_bf16(w);
          index_t c = 0;
          // A plain if on the template constant (folded at compile time): nvcc rejects an
          // extended lambda whose first use of a captured view is inside if constexpr.
          if (CountChanges) c = b != weights_bf16(i);
          master(i) = w;
          m(i) = mi;
          v(i) = vi;
          weights_bf16(i) = b;
          return c;
        });
        Kokkos::single(Kokkos::PerTeam(team), [&]() { team_changed += seg_changed; });
      },
      changed);
  return changed;
}

}  // namespace detail

namespace detail {

// The buffers of a mixed-precision step: one element each per segment element, one decay flag
// per tensor. Shared by the plain and the staged step.
template <class Mem, class MaskView, class MasterView, class GradView, class MomentView, class Bf16View>
void check_mixed_buffers(const TensorSegments<Mem>& segs, const MaskView& decay_mask, const MasterView& master,
                         const GradView& grad, const MomentView& m, const MomentView& v,
                         const Bf16View& weights_bf16) {
  static_assert(std::is_same_v<typename MasterView::value_type, float>);
  static_assert(std::is_same_v<typename GradView::non_const_value_type, float>);
  static_assert(std::is_same_v<typename MomentView::value_type, float>);
  static_assert(std::is_same_v<typename Bf16View::value_type, bf16_bits>);
  const index_t n = segs.num_elements;
  PULSE_CHECK(master.extent(0) == std::size_t(n) && grad.extent(0) == std::size_t(n) &&
                  m.extent(0) == std::size_t(n) && v.extent(0) == std::size_t(n) &&
                  weights_bf16.extent(0) == std::size_t(n),
              "adamw_mixed: every buffer must hold " + std::to_string(n) + " elements");
  PULSE_CHECK(decay_mask.extent(0) == std::size_t(segs.num_tensors), "adamw_mixed: one decay flag per tensor");
}

// The same for a pure-BF16 step.
template <class Mem, class MaskView, class WeightView, class GradView, class MomentView>
void check_bf16_buffers(const TensorSegments<Mem>& segs, const MaskView& decay_mask, const WeightView& weights,
                        const GradView& grad, const MomentView& m, const MomentView& v) {
  static_assert(std::is_same_v<typename WeightView::value_type, bf16_bits>);
  static_assert(std::is_same_v<typename GradView::non_const_value_type, bf16_bits>);
  static_assert(std::is_same_v<typename MomentView::value_type, bf16_bits>);
  const index_t n = segs.num_elements;
  PULSE_CHECK(weights.extent(0) == std::size_t(n) && grad.extent(0) == std::size_t(n) &&
                  m.extent(0) == std::size_t(n) && v.extent(0) == std::size_t(n),
              "adamw_bf16: every buffer must hold " + std::to_string(n) + " elements");
  PULSE_CHECK(decay_mask.extent(0) == std::size_t(segs.num_tensors), "adamw_bf16: one decay flag per tensor");
}

}  // namespace detail

// Mixed precision: updates master, m, v in place and writes bf16(master) into weights_bf16.
// decay_mask holds one byte per tensor (1: weight decay on). With count_changes, returns the
// number of elements whose BF16 bits changed (weights_bf16 must hold the previous copy);
// otherwise returns -1 and does not read weights_bf16.
template <class ExecSpace, class Mem, class MaskView, class MasterView, class GradView, class MomentView,
          class Bf16View>
index_t adamw_mixed(const ExecSpace& space, const TensorSegments<Mem>& segs, const MaskView& decay_mask,
                    const AdamWScalars& s, const MasterView& master, const GradView& grad,
                    const MomentView& m, const MomentView& v, const Bf16View& weights_bf16,
                    bool count_changes) {
  detail::check_mixed_buffers(segs, decay_mask, master, grad, m, v, weights_bf16);
  // Two instantiations: the loop without the count has no extra load and vectorises fully.
  if (count_changes)
    return detail::adamw_mixed_pass<true>(space, segs, decay_mask, s, master, grad, m, v, weights_bf16);
  detail::adamw_mixed_pass<false>(space, segs, decay_mask, s, master, grad, m, v, weights_bf16);
  return -1;
}

// Pure BF16: weights, m and v are BF16 bit patterns, updated in place. Returns the number of
// weights whose bits changed (always counted: the old bits are read anyway).
template <class ExecSpace, class Mem, class MaskView, class WeightView, class GradView, class MomentView>
index_t adamw_bf16(const ExecSpace& space, const TensorSegments<Mem>& segs, const MaskView& decay_mask,
                   const AdamWScalars& s, const WeightView& weights, const GradView& grad,
                   const MomentView& m, const MomentView& v) {
  detail::check_bf16_buffers(segs, decay_mask, weights, grad, m, v);
  const AdamWScalars scalars = detail::with_canonical_nans(s);
  const float inverse = 1.0f / scalars.bias_correction2_sqrt;  // host paths' divisor (adamw_bf16_element)
  using Team = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  const auto segments = segs.segments;
  const bool host_path = takes_host_path(space);
  index_t changed = 0;
  Kokkos::parallel_reduce(
      "pulse::adamw::bf16", segment_policy(space, segs, host_path),
      KOKKOS_LAMBDA(const Team& team, index_t& team_changed) {
        const Segment seg = segments(team.league_rank());
        const bool decay = decay_mask(seg.tensor) != 0;
        // A local copy of the scalars: without it GCC stops vectorising the loop under OpenMP.
        const AdamWScalars sl = scalars;
        index_t seg_changed = 0;
        detail::with_bf16_variant<ExecSpace>(sl, decay, host_path, [&](auto scale, auto decayed, auto host_rounding) {
          const auto update = [&](const index_t i) -> bool {
            bf16_bits mi = m(i), vi = v(i);
            const bf16_bits old = weights(i);
            const bf16_bits w = detail::adamw_bf16_element<decltype(scale)::value, decltype(decayed)::value,
                                                           decltype(host_rounding)::value>(sl, inverse, old, grad(i),
                                                                                           mi, vi);
            weights(i) = w;
            m(i) = mi;
            v(i) = vi;
            return w != old;
          };
          // Host rounding means a host path (with_bf16_variant): a plain if, as in adamw_mixed_pass.
          if (decltype(host_rounding)::value)
            seg_changed = detail::host_count(seg, update);
          else
            seg_changed =
                segment_sum<ExecSpace>(team, seg, host_path, [&](const index_t i) -> index_t { return update(i); });
        });
        Kokkos::single(Kokkos::PerTeam(team), [&]() { team_changed += seg_changed; });
      },
      changed);
  return changed;
}

// ---- the changed list, written by the step's own pass ----

// The elements whose BF16 bits an AdamW step changed, staged per segment during the step's pass:
// segment j's changes sit in increasing index order at positions [begin_j, begin_j + counts(j))
// of indices/values, where begin_j is the segment's first flat index. gather_changes compacts
// them into one sorted list.
template <class Mem = DefaultMem>
struct ChangeStaging {
  Kokkos::View<index_t*, Mem> counts;   // one per segment
  Kokkos::View<index_t*, Mem> indices;  // num_elements
  Kokkos::View<bf16_bits*, Mem> values;
  Kokkos::View<index_t*, Mem> starts;   // one per segment: where its changes go in the gathered list
};

template <class Mem>
ChangeStaging<Mem> make_change_staging(const TensorSegments<Mem>& segs) {
  using Kokkos::view_alloc, Kokkos::WithoutInitializing;
  return {Kokkos::View<index_t*, Mem>("pulse::adamw::staged_counts", segs.segments.extent(0)),
          Kokkos::View<index_t*, Mem>(view_alloc(WithoutInitializing, "pulse::adamw::staged_indices"), segs.num_elements),
          Kokkos::View<bf16_bits*, Mem>(view_alloc(WithoutInitializing, "pulse::adamw::staged_values"), segs.num_elements),
          Kokkos::View<index_t*, Mem>(view_alloc(WithoutInitializing, "pulse::adamw::gather_starts"),
                                      segs.segments.extent(0))};
}

namespace detail {

// The elements segment_stage's host path updates before listing their changes.
inline constexpr index_t stage_block_elements = 512;

// Appends the changes of one block of segment_stage's host path (at most stage_block_elements) at
// position k of indices and values, in order, and returns the new end: element b + j changed when
// changed[j] != 0 (j below length rounded up to 32; flags past length are 0), its new bits are
// bits[j]. Host code only (intrinsics and builtins).
inline index_t stage_block(const index_t b, const index_t length, const bf16_bits* bits, const std::uint8_t* changed,
                           index_t* indices, bf16_bits* values, index_t k) {
#if defined(PULSE_STAGE_BY_COMPRESS)
  // 32 flags at a time, without a branch per change: the changed lanes' positions in the block are
  // packed to the front of a register (vpcompressw) and stored whole after the ones listed so far
  // (count <= j, so the 32 lanes fit; those past the changes are overwritten next or ignored); the
  // indices and values follow from the positions in one short loop. Compressing the bits too, and
  // storing both under a mask of the changed lanes, took longer.
  alignas(64) std::uint16_t positions[stage_block_elements];
  const __m512i lanes = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13,
                                         12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  index_t count = 0;
  for (index_t j = 0; j < length; j += 32) {
    const __m256i flags = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(changed + j));
    const __mmask32 mask = _mm256_test_epi8_mask(flags, flags);
    const __m512i position = _mm512_add_epi16(_mm512_set1_epi16(static_cast<short>(j)), lanes);
    _mm512_storeu_si512(positions + count, _mm512_maskz_compress_epi16(mask, position));
    count += __builtin_popcount(mask);
  }
  for (index_t c = 0; c < count; ++c) {
    const index_t at = positions[c];
    indices[k + c] = b + at, values[k + c] = bits[at];
  }
  k += count;
#else
  // The flags eight bytes at a time: at a weight update's sparsity most words are 0, and a set
  // word names its changes by its set bits (little-endian: flag j + t is byte t).
  for (index_t j = 0; j < length; j += 8) {
    std::uint64_t word;
    std::memcpy(&word, changed + j, sizeof word);
    for (; word != 0; word &= word - 1) {
      const index_t at = j + (__builtin_ctzll(word) >> 3);
      indices[k] = b + at, values[k] = bits[at];
      ++k;
    }
  }
#endif
  return k;
}

// Runs update(i, write, bits) for every element of the segment; it returns whether element i's
// BF16 bits change (bits: the new ones) and writes the optimizer state only when `write` is set
// (a device team scan calls it twice per element, writing on the second call). Stages the
// changed elements in order and stores their count.
template <class ExecSpace, class Team, class Update, class IndexView, class ValueView, class CountView>
KOKKOS_INLINE_FUNCTION void segment_stage(const Team& team, const Segment& seg, [[maybe_unused]] const bool host_path,
                                          const Update& update, const IndexView& indices, const ValueView& values,
                                          const CountView& counts) {
  if constexpr (is_host_space<ExecSpace>) {
    if (host_path) {
      // Blocks: the update loop vectorises when nothing else is in it, then stage_block lists the
      // block's changes from its flags. The flags past the segment's end stay 0, so a short last
      // block reads no stale flags.
      constexpr index_t block = stage_block_elements;
      bf16_bits bits[block];
      std::uint8_t changed[block];
      index_t k = seg.begin;
      for (index_t b = seg.begin; b < seg.end; b += block) {
        const index_t length = b + block < seg.end ? block : seg.end - b;
        if (length < block) std::memset(changed + length, 0, std::size_t(block - length));
        for (index_t j = 0; j < length; ++j) changed[j] = update(b + j, true, bits[j]) ? 1 : 0;
        k = stage_block(b, length, bits, changed, indices.data(), values.data(), k);
      }
      counts(team.league_rank()) = k - seg.begin;
      return;
    }
  }
  Kokkos::parallel_scan(Kokkos::TeamThreadRange(team, seg.begin, seg.end),
                        [&](const index_t i, index_t& offset, const bool final) {
                          bf16_bits bits = 0;
                          const bool changed = update(i, final, bits);
                          if (final && changed) indices(seg.begin + offset) = i, values(seg.begin + offset) = bits;
                          offset += changed ? 1 : 0;
                          if (final && i == seg.end - 1) counts(team.league_rank()) = offset;
                        });
}

}  // namespace detail

// Mixed precision, as adamw_mixed, and the changed elements staged in the same pass (weights_bf16
// must hold the previous BF16 copy). staging: make_change_staging(segs).
template <class ExecSpace, class Mem, class MaskView, class MasterView, class GradView, class MomentView,
          class Bf16View>
void adamw_mixed(const ExecSpace& space, const TensorSegments<Mem>& segs, const MaskView& decay_mask,
                 const AdamWScalars& s, const MasterView& master, const GradView& grad, const MomentView& m,
                 const MomentView& v, const Bf16View& weights_bf16, const ChangeStaging<Mem>& staging) {
  PULSE_CHECK(staging.indices.extent(0) == std::size_t(segs.num_elements) &&
                  staging.counts.extent(0) == segs.segments.extent(0),
              "adamw_mixed: the change staging does not match the segments");
  detail::check_mixed_buffers(segs, decay_mask, master, grad, m, v, weights_bf16);
  using Team = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  const auto segments = segs.segments;
  const bool host_path = takes_host_path(space);
  const auto indices = staging.indices;
  const auto values = staging.values;
  const auto counts = staging.counts;
  Kokkos::parallel_for(
      "pulse::adamw::mixed_staged", segment_policy(space, segs, host_path), KOKKOS_LAMBDA(const Team& team) {
        const Segment seg = segments(team.league_rank());
        const bool decay = decay_mask(seg.tensor) != 0;
        // A local copy of the scalars: without it GCC stops vectorising the loop under OpenMP.
        const AdamWScalars sl = s;
        auto update = [&](const index_t i, const bool write, bf16_bits& bits) -> bool {
          float mi = m(i), vi = v(i);
          const float w = detail::adamw_mixed_element(sl, decay, master(i), grad(i), mi, vi);
          bits = float_to_bf16(w);
          const bool changed = bits != weights_bf16(i);
          if (write) master(i) = w, m(i) = mi, v(i) = vi, weights_bf16(i) = bits;
          return changed;
        };
        detail::segment_stage<ExecSpace>(team, seg, host_path, update, indices, values, counts);
      });
}

// Pure BF16, as adamw_bf16, and the changed weights staged in the same pass.
template <class ExecSpace, class Mem, class MaskView, class WeightView, class GradView, class MomentView>
void adamw_bf16(const ExecSpace& space, const TensorSegments<Mem>& segs, const MaskView& decay_mask,
                const AdamWScalars& s, const WeightView& weights, const GradView& grad, const MomentView& m,
                const MomentView& v, const ChangeStaging<Mem>& staging) {
  PULSE_CHECK(staging.indices.extent(0) == std::size_t(segs.num_elements) &&
                  staging.counts.extent(0) == segs.segments.extent(0),
              "adamw_bf16: the change staging does not match the segments");
  detail::check_bf16_buffers(segs, decay_mask, weights, grad, m, v);
  const AdamWScalars scalars = detail::with_canonical_nans(s);
  const float inverse = 1.0f / scalars.bias_correction2_sqrt;  // host paths' divisor (adamw_bf16_element)
  using Team = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  const auto segments = segs.segments;
  const bool host_path = takes_host_path(space);
  const auto indices = staging.indices;
  const auto values = staging.values;
  const auto counts = staging.counts;
  Kokkos::parallel_for(
      "pulse::adamw::bf16_staged", segment_policy(space, segs, host_path), KOKKOS_LAMBDA(const Team& team) {
        const Segment seg = segments(team.league_rank());
        const bool decay = decay_mask(seg.tensor) != 0;
        // A local copy of the scalars: without it GCC stops vectorising the loop under OpenMP.
        const AdamWScalars sl = scalars;
        detail::with_bf16_variant<ExecSpace>(sl, decay, host_path, [&](auto scale, auto decayed, auto host_rounding) {
          auto update = [&](const index_t i, const bool write, bf16_bits& bits) -> bool {
            bf16_bits mi = m(i), vi = v(i);
            const bf16_bits old = weights(i);
            bits = detail::adamw_bf16_element<decltype(scale)::value, decltype(decayed)::value,
                                              decltype(host_rounding)::value>(sl, inverse, old, grad(i), mi, vi);
            if (write) weights(i) = bits, m(i) = mi, v(i) = vi;
            return bits != old;
          };
          detail::segment_stage<ExecSpace>(team, seg, host_path, update, indices, values, counts);
        });
      });
}

// The staged changes as one sorted list: writes at most capacity = indices_out.extent(0) entries
// and returns the true count (compact_changed's contract). The staging stays valid until the next
// staged step, so a caller whose outputs were too small grows them and gathers again.
template <class ExecSpace, class Mem, class IndexView, class ValueView>
index_t gather_changes(const ExecSpace& space, const TensorSegments<Mem>& segs, const ChangeStaging<Mem>& staging,
                       const IndexView& indices_out, const ValueView& values_out) {
  static_assert(std::is_same_v<typename IndexView::value_type, index_t>);
  static_assert(std::is_same_v<typename ValueView::value_type, bf16_bits>);
  PULSE_CHECK(indices_out.extent(0) == values_out.extent(0), "gather_changes: outputs differ in capacity");
  const index_t num_segments = static_cast<index_t>(segs.segments.extent(0));
  PULSE_CHECK(staging.starts.extent(0) == std::size_t(num_segments),
              "gather_changes: the staging does not match the segments");
  const auto counts = staging.counts;
  const auto starts = staging.starts;
  index_t total = 0;
  Kokkos::parallel_scan(
      "pulse::adamw::gather_starts", FlatPolicy<ExecSpace>(space, 0, num_segments),
      KOKKOS_LAMBDA(const index_t j, index_t& offset, const bool final) {
        if (final) starts(j) = offset;
        offset += counts(j);
      },
      total);
  const index_t capacity = static_cast<index_t>(indices_out.extent(0));
  const auto segments = segs.segments;
  const bool host_path = takes_host_path(space);
  const auto indices = staging.indices;
  const auto values = staging.values;
  using Team = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  Kokkos::parallel_for(
      "pulse::adamw::gather", segment_policy(space, segs, host_path), KOKKOS_LAMBDA(const Team& team) {
        const index_t j = team.league_rank();
        const index_t from = segments(j).begin, to = starts(j);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, index_t(0), counts(j)), [&](const index_t k) {
          if (to + k < capacity) indices_out(to + k) = indices(from + k), values_out(to + k) = values(from + k);
        });
      });
  return total;
}

}  // namespace pulse
