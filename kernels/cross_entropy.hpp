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
