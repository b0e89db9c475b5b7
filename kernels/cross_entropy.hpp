#pragma once
// Softmax + cross entropy over a vocabulary of V for N rows (llm.c's fused
// crossentropy_softmax): probs [N,V] = softmax(logits), losses [N] = -log probs[target].
#include "kernels/types.hpp"

namespace pulse {

// The loss is taken as logsumexp - logit[target], which stays finite where probs[target]
// underflows to zero.
template <class ExecSpace>
void cross_entropy_forward(const ExecSpace& space, FloatSpan<ExecSpace> losses, FloatSpan<ExecSpace> probs,
                           ConstFloatSpan<ExecSpace> logits, ConstIntSpan<ExecSpace> targets, index_t N, int V) {
  Kokkos::parallel_for(
      "pulse::cross_entropy::forward", FlatPolicy<ExecSpace>(space, 0, N), KOKKOS_LAMBDA(const index_t r) {
        const index_t o = r * V;
        float maxv = logits(o);
        for (int v = 1; v < V; ++v) maxv = logits(o + v) > maxv ? logits(o + v) : maxv;
        float sum = 0.0f;
        for (int v = 0; v < V; ++v) {
          const float e = expf(logits(o + v) - maxv);
          probs(o + v) = e;
          sum += e;
        }
        const float inv = 1.0f / sum;
        for (int v = 0; v < V; ++v) probs(o + v) *= inv;
        losses(r) = logf(sum) + maxv - logits(o + targets(r));
      });
}

// log softmax(logits)[target] of one row of V logits, in cross_entropy_forward's arithmetic
// (-(log(sum) + max - logit[target]), the same max, the same ordered float sum): the sampler
// records its logprobs with it, so the trainer's logprobs of the same rows from the same logits
// are the same bits and GRPO's first ratio is exactly 1 (test_rollout checks both).
KOKKOS_INLINE_FUNCTION float row_target_logprob(const float* logits, int V, int target) {
  float maxv = logits[0];
  for (int v = 1; v < V; ++v) maxv = logits[v] > maxv ? logits[v] : maxv;
  float sum = 0.0f;
  for (int v = 0; v < V; ++v) sum += expf(logits[v] - maxv);
  return -(logf(sum) + maxv - logits[target]);
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
