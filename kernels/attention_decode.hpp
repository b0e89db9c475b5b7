#pragma once
// Causal attention for incremental decoding with a key/value cache: one new query per sequence
// attends to the keys and values of every position fed so far. Same arithmetic, in the same
// order, as attention_forward's row t = pos, so a decoder reproduces the full forward pass.
//   qkv    [B,3C]          q, k, v of the new token (layout of attention.hpp)
//   kcache, vcache [B,max_len,C]  keys and values of positions 0..pos (pos written here first)
//   att    [B,NH,max_len]  scratch for the softmax
//   out    [B,C]
#include <cmath>

#include "kernels/types.hpp"

namespace pulse {

// Stores the new token's key and value at position pos of each sequence's cache.
template <class ExecSpace>
void kv_cache_append(const ExecSpace& space, FloatSpan<ExecSpace> kcache, FloatSpan<ExecSpace> vcache,
                     ConstFloatSpan<ExecSpace> qkv, int B, int pos, int max_len, int C) {
  Kokkos::parallel_for(
      "pulse::attention_decode::append", FlatPolicy<ExecSpace>(space, 0, index_t(B) * C),
      KOKKOS_LAMBDA(const index_t i) {
        const index_t b = i / C, c = i % C;
        const index_t slot = (b * max_len + pos) * C + c;
        kcache(slot) = qkv(b * 3 * C + C + c);
        vcache(slot) = qkv(b * 3 * C + 2 * C + c);
      });
}

// One thread per (b, h): scores over positions 0..pos, softmax, weighted sum of values.
template <class ExecSpace>
void attention_decode(const ExecSpace& space, FloatSpan<ExecSpace> out, FloatSpan<ExecSpace> att,
                      ConstFloatSpan<ExecSpace> qkv, ConstFloatSpan<ExecSpace> kcache, ConstFloatSpan<ExecSpace> vcache,
                      int B, int pos, int max_len, int C, int NH) {
  const int hs = C / NH;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hs)));
  Kokkos::parallel_for(
      "pulse::attention_decode::forward", FlatPolicy<ExecSpace>(space, 0, index_t(B) * NH),
      KOKKOS_LAMBDA(const index_t bh) {
        const index_t h = bh % NH, b = bh / NH;
        const index_t q = b * 3 * C + h * hs;
        const index_t a = bh * max_len;
        float maxv = 0.0f;
        for (index_t t2 = 0; t2 <= pos; ++t2) {
          const index_t k = (b * max_len + t2) * C + h * hs;
          float s = 0.0f;
          for (int i = 0; i < hs; ++i) s += qkv(q + i) * kcache(k + i);
          s *= scale;
          att(a + t2) = s;
          if (t2 == 0 || s > maxv) maxv = s;
        }
        float sum = 0.0f;
        for (index_t t2 = 0; t2 <= pos; ++t2) {
          const float e = expf(att(a + t2) - maxv);
          att(a + t2) = e;
          sum += e;
        }
        const float inv = 1.0f / sum;
        const index_t o = b * C + h * hs;
        for (int i = 0; i < hs; ++i) out(o + i) = 0.0f;
        for (index_t t2 = 0; t2 <= pos; ++t2) {
          const index_t v = (b * max_len + t2) * C + h * hs;
          const float w = att(a + t2) * inv;
          for (int i = 0; i < hs; ++i) out(o + i) += w * vcache(v + i);
        }
      });
}

}  // namespace pulse
