#pragma once
// Token + position embedding (llm.c's encoder): out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].
// Layouts: tokens [B*T], wte [V,C], wpe [maxT,C], out [B,T,C]. Tokens must be in range
// (the model checks them before the first kernel).
#include "kernels/types.hpp"

namespace pulse {

template <class ExecSpace>
void embedding_forward(const ExecSpace& space, FloatSpan<ExecSpace> out, ConstIntSpan<ExecSpace> tokens,
                       ConstFloatSpan<ExecSpace> wte, ConstFloatSpan<ExecSpace> wpe, int B, int T, int C) {
  Kokkos::parallel_for(
      "pulse::embedding::forward", FlatPolicy<ExecSpace>(space, 0, index_t(B) * T), KOKKOS_LAMBDA(const index_t bt) {
        const index_t tok = tokens(bt) * index_t(C), pos = (bt % T) * C, o = bt * C;
        for (int c = 0; c < C; ++c) out(o + c) = wte(tok + c) + wpe(pos + c);
      });
}

// One token per sequence at position pos (incremental decoding): out[b,:] = wte[tokens[b],:] +
// wpe[pos,:], out [B,C].
template <class ExecSpace>
void embedding_forward_at(const ExecSpace& space, FloatSpan<ExecSpace> out, ConstIntSpan<ExecSpace> tokens,
                          ConstFloatSpan<ExecSpace> wte, ConstFloatSpan<ExecSpace> wpe, int pos, int B, int C) {
  Kokkos::parallel_for(
      "pulse::embedding::forward_at", FlatPolicy<ExecSpace>(space, 0, index_t(B)), KOKKOS_LAMBDA(const index_t b) {
        const index_t tok = tokens(b) * index_t(C), p = index_t(pos) * C, o = b * C;
        for (int c = 0; c < C; ++c) out(o + c) = wte(tok + c) + wpe(p + c);
      });
}

// Accumulates into dwte and dwpe. One thread per channel walks every position in order, so rows
// of dwte shared by repeated tokens are summed without atomics and in the same order on every
// backend.
template <class ExecSpace>
void embedding_backward(const ExecSpace& space, FloatSpan<ExecSpace> dwte, FloatSpan<ExecSpace> dwpe,
                        ConstFloatSpan<ExecSpace> dout, ConstIntSpan<ExecSpace> tokens, int B, int T, int C) {
  const index_t BT = index_t(B) * T;
  Kokkos::parallel_for(
      "pulse::embedding::backward", FlatPolicy<ExecSpace>(space, 0, C), KOKKOS_LAMBDA(const index_t c) {
        for (index_t bt = 0; bt < BT; ++bt) {
          const float d = dout(bt * C + c);
          dwte(tokens(bt) * index_t(C) + c) += d;
          dwpe((bt % T) * C + c) += d;
        }
      });
}

}  // namespace pulse
