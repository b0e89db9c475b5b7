// pulse-train's per-step measurement on trainer 0 (src/train/sparsity_meter), part by part, at the
// sizes of the tiny (204,992 parameters) and small (1,009,664) models:
//   pulse-bench-meter --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// KStep: the meter's step from AdamW's change set (per-tensor counts, k-step sparsity for
// k = 1..32 against the ring, the push); GradientSparsity: the four thresholds; AdamRatio: the
// four quantiles of the 2^16-element sample. The weights change in 2.6% of the elements per step
// (as tiny does at lr 3e-6), a third of them back to their previous bits.
#include <benchmark/benchmark.h>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/adamw.hpp"
#include "kernels/host_copy.hpp"
#include "train/sparsity_meter.hpp"
#include "train/train_config.hpp"

using namespace pulse;

namespace {

// 52 tensors of equal size, as many as the tiny model has.
TensorTable bench_table(index_t n) {
  TensorTable table;
  for (int t = 0; t < 52; ++t) table.add("t" + std::to_string(t), {n * (t + 1) / 52 - n * t / 52});
  return table;
}

// The versions a run steps through: each changes 2.6% of the elements, a third of them back to
// the bits they held the step before.
struct VersionStream {
  std::vector<bf16_bits> previous, current;
  std::mt19937_64 rng{7};

  explicit VersionStream(index_t n) : previous(n), current(n) {
    for (auto& b : current) b = bf16_bits(rng());
    previous = current;
  }
  sync::ChangeSet next(const std::vector<index_t>& offsets) {
    const std::vector<bf16_bits> before = current;
    std::uniform_int_distribution<int> pick(0, 999);
    sync::ChangeSet list;
    for (std::size_t i = 0; i < current.size(); ++i) {
      const int u = pick(rng);
      if (u >= 26) continue;
      const bf16_bits bits = u < 9 && previous[i] != current[i] ? previous[i] : bf16_bits(current[i] + 1);
      current[i] = bits;
      list.indices.push_back(index_t(i));
      list.new_bits.push_back(bits);
    }
    list.tensor_begin = sync::tensor_begins(list.indices, offsets);
    previous = before;
    return list;
  }
};

void BM_KStep(benchmark::State& state) {
  const index_t n = state.range(0);
  const TensorTable table = bench_table(n);
  SparsityMeter meter(table, kstep_values);
  VersionStream versions(n);
  meter.start(to_device(versions.current));
  for (auto _ : state) {
    state.PauseTiming();
    const sync::ChangeSet changes = versions.next(table.offsets());
    const auto weights = to_device(versions.current);
    Kokkos::fence();
    state.ResumeTiming();
    benchmark::DoNotOptimize(meter.measure(weights, changes));
    Kokkos::fence();
  }
}

void BM_GradientSparsity(benchmark::State& state) {
  const index_t n = state.range(0);
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 1e-6f);
  std::vector<float> g(n);
  for (auto& x : g) x = rng() % 50 == 0 ? 0.0f : normal(rng);  // 2% exact zeros
  const auto grads = to_device(g);
  for (auto _ : state) {
    benchmark::DoNotOptimize(gradient_sparsity(grads, grad_thresholds));
    Kokkos::fence();
  }
}

// Adam moments after some steps of noisy gradients: m ~ N(0, 1e-5), v ~ m^2-sized plus noise;
// or (second argument 1) all 0, as in a run whose gradients are 0 (GRPO from weights that earn no
// reward, bench_train_step.py's runs): every ratio 0, one bin of the selection.
void BM_AdamRatio(benchmark::State& state) {
  const index_t n = state.range(0);
  const bool zero = state.range(1) != 0;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> m(n), v(n);
  for (index_t i = 0; i < n && !zero; ++i) {
    m[i] = 1e-5f * normal(rng);
    v[i] = 1e-10f * (std::abs(normal(rng)) + 0.01f);
  }
  const auto m_d = to_device(m), v_d = to_device(v);
  std::int64_t step = 100;
  const AdamWHyper adam;  // pulse-train's betas and eps
  for (auto _ : state) {
    benchmark::DoNotOptimize(adam_ratio_quantiles(m_d, v_d, adam.beta1, adam.beta2, adam.eps, ++step, adam_quantiles));
    Kokkos::fence();
  }
}

constexpr index_t tiny_parameters = 204992, small_parameters = 1009664;
BENCHMARK(BM_KStep)->Arg(tiny_parameters)->Arg(small_parameters)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_GradientSparsity)->Arg(tiny_parameters)->Arg(small_parameters)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AdamRatio)->ArgsProduct({{tiny_parameters, small_parameters}, {0, 1}})->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("kokkos_execution_space", DefaultExec::name());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
