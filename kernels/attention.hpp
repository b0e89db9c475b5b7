#pragma once
// Causal multi-head self-attention on a fused qkv projection (llm.c's layout):
//   qkv [B,T,3C]: q = qkv[..., 0:C], k = qkv[..., C:2C], v = qkv[..., 2C:3C], head h owning
//   channels h*hs .. (h+1)*hs of each, hs = C/NH;
//   att [B,NH,T,T]: softmax over t2 <= t of q_t.k_t2 / sqrt(hs), zero above the diagonal;
//   out [B,T,C]: sum over t2 of att[t,t2] * v_t2, heads side by side.
// One thread per (b, h, t) row; every thread writes only its own row, so no atomics.
#include <cmath>

#include "kernels/types.hpp"

namespace pulse {

template <class ExecSpace>
void attention_forward(const ExecSpace& space, FloatSpan<ExecSpace> out, FloatSpan<ExecSpace> att,
                       ConstFloatSpan<ExecSpace> qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hs)));
  Kokkos::parallel_for(
      "pulse::attention::forward", FlatPolicy<ExecSpace>(space, 0, index_t(B) * NH * T),
      KOKKOS_LAMBDA(const index_t row) {
        const index_t t = row % T, bh = row / T, h = bh % NH, b = bh / NH;
        const index_t q = (b * T + t) * 3 * C + h * hs;  // offsets into qkv
        const index_t a = row * T;                        // offset of this row of att
        float maxv = 0.0f;
        for (index_t t2 = 0; t2 <= t; ++t2) {
          const index_t k = (b * T + t2) * 3 * C + C + h * hs;
          float s = 0.0f;
          for (int i = 0; i < hs; ++i) s += qkv(q + i) * qkv(k + i);
          s *= scale;
          att(a + t2) = s;
          if (t2 == 0 || s > maxv) maxv = s;
        }
        float sum = 0.0f;
        for (index_t t2 = 0; t2 <= t; ++t2) {
          const float e = expf(att(a + t2) - maxv);
          att(a + t2) = e;
          sum += e;
        }
        const float inv = 1.0f / sum;
        for (index_t t2 = 0; t2 < T; ++t2) att(a + t2) = t2 <= t ? att(a + t2) * inv : 0.0f;
        const index_t o = (b * T + t) * C + h * hs;
        for (int i = 0; i < hs; ++i) out(o + i) = 0.0f;
        for (index_t t2 = 0; t2 <= t; ++t2) {
          const index_t v = (b * T + t2) * 3 * C + 2 * C + h * hs;
          const float w = att(a + t2);
          for (int i = 0; i < hs; ++i) out(o + i) += w * qkv(v + i);
        }
      });
}

// Accumulates into dqkv. dpreatt [B,NH,T,T] is scratch: it receives the gradient of the scores
// before the softmax. Two passes keep every write private to its thread: first each (b,h,t) row
// of dpreatt, then per (b,h,p) the query gradient of position p (from row p) and the key and value
// gradients of position p (from column p).
template <class ExecSpace>
void attention_backward(const ExecSpace& space, FloatSpan<ExecSpace> dqkv, FloatSpan<ExecSpace> dpreatt,
                        ConstFloatSpan<ExecSpace> dout, ConstFloatSpan<ExecSpace> qkv, ConstFloatSpan<ExecSpace> att,
                        int B, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hs)));
  const index_t rows = index_t(B) * NH * T;
  Kokkos::parallel_for(
      "pulse::attention::backward_softmax", FlatPolicy<ExecSpace>(space, 0, rows), KOKKOS_LAMBDA(const index_t row) {
        const index_t t = row % T, bh = row / T, h = bh % NH, b = bh / NH;
        const index_t o = (b * T + t) * C + h * hs;
        const index_t a = row * T;
        float dot = 0.0f;  // sum over t2 of att * datt
        for (index_t t2 = 0; t2 <= t; ++t2) {
          const index_t v = (b * T + t2) * 3 * C + 2 * C + h * hs;
          float datt = 0.0f;
          for (int i = 0; i < hs; ++i) datt += dout(o + i) * qkv(v + i);
          dpreatt(a + t2) = datt;
          dot += att(a + t2) * datt;
        }
        for (index_t t2 = 0; t2 < T; ++t2) dpreatt(a + t2) = t2 <= t ? att(a + t2) * (dpreatt(a + t2) - dot) : 0.0f;
      });
  Kokkos::parallel_for(
      "pulse::attention::backward_qkv", FlatPolicy<ExecSpace>(space, 0, rows), KOKKOS_LAMBDA(const index_t row) {
        const index_t p = row % T, bh = row / T, h = bh % NH, b = bh / NH;
        const index_t base = bh * T * T;  // att and dpreatt of this (b, h)
        const index_t qp = (b * T + p) * 3 * C + h * hs, kp = qp + C, vp = qp + 2 * C;
        // Query p attends to keys t2 <= p.
        for (index_t t2 = 0; t2 <= p; ++t2) {
          const float d = dpreatt(base + p * T + t2) * scale;
          const index_t k = (b * T + t2) * 3 * C + C + h * hs;
          for (int i = 0; i < hs; ++i) dqkv(qp + i) += d * qkv(k + i);
        }
        // Key and value p are seen by queries t >= p.
        for (index_t t = p; t < T; ++t) {
          const float d = dpreatt(base + t * T + p) * scale;
          const float w = att(base + t * T + p);
          const index_t q = (b * T + t) * 3 * C + h * hs;
          const index_t o = (b * T + t) * C + h * hs;
          for (int i = 0; i < hs; ++i) {
            dqkv(kp + i) += d * qkv(q + i);
            dqkv(vp + i) += w * dout(o + i);
          }
        }
      });
}

}  // namespace pulse
