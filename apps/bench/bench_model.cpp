// Speed of the GPT on this machine (Google Benchmark), against the machine's own GEMM peak:
//   BM_Sgemm       C = A B for 1024^3 float matrices through OpenBLAS (pulse::blas_gemm): the
//                  peak that MFU is measured against, in the same binary and thread setting.
//   BM_Gemm        pulse::gemm (the model's batch-invariant GEMM) against OpenBLAS on the same
//                  operands (blas = 1), at 1024^3 and at the model's own shapes: the decoder's
//                  64 rows and a training batch's rows x (3C, C, 4C) for each preset's C.
//   BM_TrainStep   one optimizer step on a fixed batch per preset: set_weights (BF16 -> FP32),
//                  forward, zero_grad, backward, fused AdamW (mixed). Counters: tokens_per_second,
//                  model FLOP/s and MFU = model FLOP/s / SGEMM peak (calibrated once, best of 5).
//   BM_Generate    GPTDecoder, batch 64, the preset's full context from an empty cache:
//                  generated tokens per second (decoder steps only, no sampling).
// Model FLOPs of a training step (PaLM, Chowdhery et al. 2022, appendix B), for P parameters,
// L layers, C channels, T tokens per sequence and BT tokens in the batch:
//   6 * P * BT           forward (2) + backward (4) multiply-adds of every parameter per token
//   + 12 * L * C * T * BT   attention scores and weighted values, forward and backward
//                          (full T x T, not halved for the causal mask: the usual convention)
// Run single-threaded for a per-core figure:
//   OPENBLAS_NUM_THREADS=1 pulse-bench-model --benchmark_format=json
#include <benchmark/benchmark.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <string>

#include "kernels/adamw.hpp"
#include "kernels/blas_gemm.hpp"
#include "kernels/gemm.hpp"
#include "kernels/host_copy.hpp"
#include "model/gpt.hpp"
#include "model/gpt_decoder.hpp"

using namespace pulse;

namespace {

const char* const presets[] = {"tiny", "small", "base"};
constexpr int sgemm_size = 1024;
constexpr int generate_batch = 64;

using Matrix = Kokkos::View<float**, Kokkos::LayoutRight, DefaultMem>;

Matrix filled(const char* label, int n, float scale) {
  Matrix x(std::string(label), n, n);
  Kokkos::parallel_for(
      "pulse::bench::fill", Kokkos::RangePolicy<DefaultExec>(0, n * n),
      KOKKOS_LAMBDA(const int i) { x.data()[i] = scale * float((i * 37) % 101 - 50); });
  return x;
}

double sgemm_seconds(const Matrix& a, const Matrix& b, const Matrix& c) {
  Kokkos::Timer timer;
  blas_gemm(DefaultExec(), Transpose::no, Transpose::no, sgemm_size, sgemm_size, sgemm_size, 1.0f, a, b, 0.0f, c);
  Kokkos::fence();
  return timer.seconds();
}

constexpr double sgemm_flops = 2.0 * sgemm_size * sgemm_size * sgemm_size;

// Best of five 1024^3 SGEMMs, measured once per process.
double sgemm_peak_flops_per_second() {
  static const double peak = [] {
    const Matrix a = filled("a", sgemm_size, 1e-2f), b = filled("b", sgemm_size, 1e-2f), c("c", sgemm_size, sgemm_size);
    double best = 1e30;
    for (int i = 0; i < 5; ++i) best = std::min(best, sgemm_seconds(a, b, c));
    return sgemm_flops / best;
  }();
  return peak;
}

double train_step_flops(const GPTConfig& c, index_t parameters, int batch, int T) {
  const double tokens = double(batch) * T;
  return 6.0 * double(parameters) * tokens + 12.0 * c.num_layers * c.channels * double(T) * tokens;
}

void BM_Sgemm(benchmark::State& state) {
  const Matrix a = filled("a", sgemm_size, 1e-2f), b = filled("b", sgemm_size, 1e-2f), c("c", sgemm_size, sgemm_size);
  for (auto _ : state) state.SetIterationTime(sgemm_seconds(a, b, c));
  state.counters["flops_per_second"] = benchmark::Counter(sgemm_flops * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["size"] = sgemm_size;
}

// Args: m, n, k, trans_b (the model's forward passes B = W transposed), blas.
void BM_Gemm(benchmark::State& state) {
  const int m = static_cast<int>(state.range(0)), n = static_cast<int>(state.range(1)),
            k = static_cast<int>(state.range(2));
  const Transpose tb = state.range(3) ? Transpose::yes : Transpose::no;
  const bool blas = state.range(4) != 0;
  const int size = std::max({m, n, k});
  const Matrix big_a = filled("a", size, 1e-2f), big_b = filled("b", size, 1e-2f);
  const Kokkos::View<float**, Kokkos::LayoutRight, DefaultMem, Kokkos::MemoryUnmanaged> a(big_a.data(), m, k),
      b(big_b.data(), tb == Transpose::yes ? n : k, tb == Transpose::yes ? k : n);
  Matrix c("c", m, n);
  for (auto _ : state) {
    Kokkos::Timer timer;
    if (blas)
      blas_gemm(DefaultExec(), Transpose::no, tb, m, n, k, 1.0f, a, b, 0.0f, c);
    else
      gemm(DefaultExec(), Transpose::no, tb, m, n, k, 1.0f, a, b, 0.0f, c);
    Kokkos::fence();
    state.SetIterationTime(timer.seconds());
  }
  state.SetLabel(blas ? "openblas" : "pulse");
  state.counters["flops_per_second"] =
      benchmark::Counter(2.0 * m * n * k * state.iterations(), benchmark::Counter::kIsRate);
}

void BM_TrainStep(benchmark::State& state) {
  const GPTConfig config = gpt_preset(presets[state.range(0)]);
  const int batch = static_cast<int>(state.range(1));
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
  const double peak = sgemm_peak_flops_per_second();
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
  const double flops = train_step_flops(config, n, batch, T) * state.iterations();
  state.SetLabel(presets[state.range(0)]);
  state.counters["tokens_per_second"] =
      benchmark::Counter(double(batch) * T * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["model_flops_per_second"] = benchmark::Counter(flops, benchmark::Counter::kIsRate);
  state.counters["mfu"] = benchmark::Counter(flops / peak, benchmark::Counter::kIsRate);
  state.counters["sgemm_peak_flops_per_second"] = peak;
  state.counters["parameters"] = double(n);
}

void BM_Generate(benchmark::State& state) {
  const GPTConfig config = gpt_preset(presets[state.range(0)]);
  const int T = config.max_seq_len;
  GPTDecoder decoder(config, generate_batch, T);
  {
    const auto master = to_device(gpt_init(config, 1));
    Kokkos::View<bf16_bits*> weights("weights", master.extent(0));
    cast_to_bf16(DefaultExec(), master, weights);
    decoder.set_weights(weights);
  }
  std::vector<Kokkos::View<int*>> columns;
  for (int t = 0; t < T; ++t) {
    std::vector<int> ids(generate_batch);
    for (int b = 0; b < generate_batch; ++b) ids[b] = (b * 31 + t * 7) % config.vocab_size;
    columns.push_back(to_device(ids));
  }
  for (auto _ : state) {
    Kokkos::Timer timer;
    decoder.reset();
    for (int t = 0; t < T; ++t) benchmark::DoNotOptimize(decoder.step(columns[t], t).data());
    Kokkos::fence();
    state.SetIterationTime(timer.seconds());
  }
  state.SetLabel(presets[state.range(0)]);
  state.counters["tokens_per_second"] =
      benchmark::Counter(double(generate_batch) * T * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["batch"] = generate_batch;
}

BENCHMARK(BM_Sgemm)->UseManualTime()->Unit(benchmark::kMillisecond);
void gemm_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"m", "n", "k", "trans_b", "blas"});
  for (int blas : {0, 1}) {
    b->Args({sgemm_size, sgemm_size, sgemm_size, 0, blas});
    for (int c : {64, 128, 256}) {
      b->Args({generate_batch, 4 * c, c, 1, blas});  // the decoder's MLP up-projection
      b->Args({1024, 4 * c, c, 1, blas});            // a training batch's
      b->Args({1024, c, 4 * c, 1, blas});            // and its down-projection
    }
  }
}
BENCHMARK(BM_Gemm)->Apply(gemm_shapes)->UseManualTime()->Unit(benchmark::kMicrosecond);
// {preset, batch}: the original 4 sequences, and a batch of 16 with GEMM-friendlier shapes.
BENCHMARK(BM_TrainStep)
    ->ArgsProduct({{0, 1, 2}, {4, 16}})
    ->ArgNames({"preset", "batch"})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Generate)->DenseRange(0, 2)->ArgName("preset")->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
