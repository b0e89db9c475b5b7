// Training-speed benchmark of the GPT (Google Benchmark): one optimizer step per iteration on a
// fixed batch: set_weights (BF16 -> FP32), forward, zero_grad, backward, fused AdamW (mixed).
// Reports tokens/s and parameters; the batch is 4 sequences of the preset's full context.
//   pulse-bench-model --benchmark_format=json
#include <benchmark/benchmark.h>

#include <Kokkos_Core.hpp>
#include <algorithm>

#include "kernels/adamw.hpp"
#include "kernels/host_copy.hpp"
#include "model/gpt.hpp"

using namespace pulse;

namespace {

const char* const presets[] = {"tiny", "small", "base"};
constexpr int batch = 4;

void BM_TrainStep(benchmark::State& state) {
  const GPTConfig config = gpt_preset(presets[state.range(0)]);
  const int T = config.max_seq_len;
  GPT model(config, batch, T);
  const TensorTable& table = model.table();
  const index_t n = table.num_elements();
  Kokkos::View<float*> master = to_device(gpt_init(config, 1)), m("m", n), v("v", n);
  Kokkos::View<bf16_bits*> weights("weights", n);
  cast_to_bf16(DefaultExec(), master, weights);
  const auto segs = make_segments(table.offsets());
  const auto mask = to_device(table.weight_decay_mask());
  std::vector<int> ids(std::size_t(batch) * T);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>((i * 7919) % config.vocab_size);
  const auto tokens = to_device(ids);
  std::rotate(ids.begin(), ids.begin() + 1, ids.end());
  const auto targets = to_device(ids);
  AdamWHyper hyper;
  std::int64_t step = 0;
  for (auto _ : state) {
    Kokkos::Timer timer;
    model.set_weights(weights);
    benchmark::DoNotOptimize(model.forward(tokens, targets));
    model.zero_grad();
    model.backward();
    adamw_mixed(DefaultExec(), segs, mask, adamw_scalars(hyper, ++step, 1.0f, Precision::mixed), master,
                model.grads(), m, v, weights, false);
    Kokkos::fence();
    state.SetIterationTime(timer.seconds());
  }
  state.SetLabel(presets[state.range(0)]);
  state.counters["tokens_per_second"] =
      benchmark::Counter(double(batch) * T * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["parameters"] = double(n);
}

BENCHMARK(BM_TrainStep)->DenseRange(0, 2)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
