#pragma once
// The Adam ratio |m_hat| / (sqrt(v_hat) + eps) of each element from an Adam-family optimizer's
// moments (m_hat = m / (1 - beta1^t), v_hat = v / (1 - beta2^t)), each operation rounded to
// FP32 in the order torch computes it (pulse.torch's recorder wrote it with torch before): the
// same bits, in one pass instead of six, on threads.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace pulse::python {

// A BF16 value (its bits) as FP32: exact, the top half of the FP32 bits, as torch widens it.
inline float bf16_to_float(std::uint16_t bits) {
  const std::uint32_t wide = std::uint32_t(bits) << 16;
  float x;
  std::memcpy(&x, &wide, sizeof(x));
  return x;
}

// One parameter's moments: n elements each, FP32 or (bf16) BF16 bits, and its ratios' place.
struct AdamMoments {
  const void* m;
  const void* v;
  float* out;
  std::size_t n;
  bool bf16;
  double m_scale;  // 1 - beta1^t
  double v_scale;  // 1 - beta2^t
  double eps;
};

void adam_ratios(const std::vector<AdamMoments>& moments, unsigned threads);

}  // namespace pulse::python
