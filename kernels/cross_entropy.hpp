#pragma once
// Softmax + cross entropy over a vocabulary of V for N rows (llm.c's fused
// crossentropy_softmax): probs [N,V] = softmax(logits), losses [N] = -log probs[target].
#include "kernels/types.hpp"

namespace pulse {

// The row's -log softmax(logits)[target], taken as logsumexp - logit[target] (finite where the
// probability underflows to zero): the max, then the float sum of expf(l - max) in index order.
// cross_entropy_forward's loss and the sampler's logprobs (rl/rollout.cpp) both come from here,
// so the trainer's logprobs of sampled rows are the sampler's bits and GRPO's first ratio is
// exactly 1 (test_rollout).
KOKKOS_INLINE_FUNCTION float row_max(const float* logits, int V) {
  float maxv = logits[0];
  for (int v = 1; v < V; ++v) maxv = logits[v] > maxv ? logits[v] : maxv;
  return maxv;
}

KOKKOS_INLINE_FUNCTION float row_exp_sum(const float* logits, int V, float maxv) {
  float sum = 0.0f;
  for (int v = 0; v < V; ++v) sum += expf(logits[v] - maxv);
  return sum;
}

KOKKOS_INLINE_FUNCTION float row_loss(const float* logits, int target, float maxv, float sum) {
  return logf(sum) + maxv - logits[target];
}

KOKKOS_INLINE_FUNCTION float row_target_logprob(const float* logits, int V, int target) {
  const float maxv = row_max(logits, V);
  return -row_loss(logits, target, maxv, row_exp_sum(logits, V, maxv));
}

template <class ExecSpace>
void cross_entropy_forward(const ExecSpace& space, FloatSpan<ExecSpace> losses, FloatSpan<ExecSpace> probs,
                           ConstFloatSpan<ExecSpace> logits, ConstIntSpan<ExecSpace> targets, index_t N, int V) {
  Kokkos::parallel_for(
      "pulse::cross_entropy::forward", FlatPolicy<ExecSpace>(space, 0, N), KOKKOS_LAMBDA(const index_t r) {
        const float* row = logits.data() + r * V;
        float* const p = probs.data() + r * V;
        const float maxv = row_max(row, V);
        const float sum = row_exp_sum(row, V, maxv);
        const float inv = 1.0f / sum;
        for (int v = 0; v < V; ++v) p[v] = expf(row[v] - maxv) * inv;
        losses(r) = row_loss(row, targets(r), maxv, sum);
      });
}

// Accumulates dlogits += (probs - onehot(target)) * dlosses[r]; dlosses is the weight of each
// row's loss (1/N for a mean).
template <class ExecSpace>
void cross_entropy_backward(const ExecSpace& space, FloatSpan<ExecSpace> dlogits, ConstFloatSpan<ExecSpace> dlosses,
                            ConstFloatSpan<ExecSpace> probs, ConstIntSpan<ExecSpace> targets, index_t N, int V) {
  Kokkos::parallel_for(
      "pulse::cross_entropy::backward", FlatPolicy<ExecSpace>(space, 0, N * V), KOKKOS_LAMBDA(const index_t i) {
        const index_t r = i / V;
        const int v = static_cast<int>(i % V);
        dlogits(i) += (probs(i) - (v == targets(r) ? 1.0f : 0.0f)) * dlosses(r);
      });
}

}  // namespace pulse
