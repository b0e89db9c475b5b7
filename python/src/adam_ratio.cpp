#include "adam_ratio.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "coding/parallel.hpp"

namespace pulse::python {
namespace {

constexpr std::size_t kChunk = std::size_t(1) << 16;  // elements per task

template <class Element, class Load>
void ratios(const AdamMoments& a, std::size_t begin, std::size_t end, Load load) {
  const auto* m = static_cast<const Element*>(a.m);
  const auto* v = static_cast<const Element*>(a.v);
  // torch casts a Python float operand to the tensor's FP32 before the operation.
  const float m_scale = float(a.m_scale), v_scale = float(a.v_scale), eps = float(a.eps);
  for (std::size_t i = begin; i < end; ++i)
    a.out[i] = std::fabs(load(m[i]) / m_scale) / (std::sqrt(load(v[i]) / v_scale) + eps);
}

}  // namespace

void adam_ratios(const std::vector<AdamMoments>& moments, unsigned threads) {
  struct Task {
    std::size_t moment, begin, end;
  };
  std::vector<Task> tasks;
  for (std::size_t p = 0; p < moments.size(); ++p)
    for (std::size_t begin = 0; begin < moments[p].n; begin += kChunk)
      tasks.push_back({p, begin, std::min(moments[p].n, begin + kChunk)});
  sync::parallel_for(threads, tasks.size(), [&](std::size_t t) {
    const Task& task = tasks[t];
    const AdamMoments& a = moments[task.moment];
    if (a.bf16)
      ratios<std::uint16_t>(a, task.begin, task.end, bf16_to_float);
    else
      ratios<float>(a, task.begin, task.end, [](float x) { return x; });
  });
}

}  // namespace pulse::python
