// Kernel benchmarks (Google Benchmark): BF16 cast, AdamW in both precisions, diff-count and
// diff-compact at 99% sparsity, each reporting bytes/s and its fraction of two bandwidths this
// same binary measures at start-up: STREAM triad (counter triad_fraction) and a Kokkos
// deep_copy between two views of the default memory space, device to device on a GPU
// (counter copy_fraction; the GPU targets are stated against it).
//   pulse-bench-kernels --benchmark_format=json
// OpenMP scaling, side by side (the JSON context records kokkos_concurrency):
//   OMP_NUM_THREADS=1 pulse-bench-kernels --benchmark_filter='/16777216/' --benchmark_repetitions=5
//   OMP_NUM_THREADS=2 pulse-bench-kernels --benchmark_filter='/16777216/' --benchmark_repetitions=5
#include <benchmark/benchmark.h>

#include <Kokkos_Core.hpp>
#include <algorithm>

#include "kernels/adamw.hpp"
#include "kernels/bf16.hpp"
#include "kernels/segments.hpp"
#include "kernels/sparsity.hpp"

using namespace pulse;

namespace {

double g_triad_bytes_per_second = 0;
double g_copy_bytes_per_second = 0;

// Deterministic pseudo-random floats in (-1, 1) without a device RNG.
KOKKOS_INLINE_FUNCTION float hash_unit(std::uint64_t i, std::uint64_t seed) {
  std::uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<std::int64_t>(z >> 11) - (std::int64_t(1) << 52)) / float(std::int64_t(1) << 52);
}

Kokkos::View<float*> random_floats(index_t n, std::uint64_t seed, float scale) {
  Kokkos::View<float*> v(Kokkos::view_alloc(Kokkos::WithoutInitializing, "random"), n);
  Kokkos::parallel_for("bench::fill", n, KOKKOS_LAMBDA(index_t i) { v(i) = scale * hash_unit(i, seed); });
  return v;
}

// Times one call of body per iteration, fenced, and reports bytes/s and both fractions.
template <class Body>
void run_timed(benchmark::State& state, double bytes_per_iteration, Body&& body) {
  for (auto _ : state) {
    Kokkos::Timer timer;
    body();
    Kokkos::fence();
    state.SetIterationTime(timer.seconds());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes_per_iteration * state.iterations()));
  state.counters["triad_fraction"] = benchmark::Counter(bytes_per_iteration / g_triad_bytes_per_second,
                                                        benchmark::Counter::kIsIterationInvariantRate);
  state.counters["copy_fraction"] = benchmark::Counter(bytes_per_iteration / g_copy_bytes_per_second,
                                                       benchmark::Counter::kIsIterationInvariantRate);
}

void triad(const Kokkos::View<float*>& a, const Kokkos::View<float*>& b, const Kokkos::View<float*>& c) {
  Kokkos::parallel_for("pulse::bench::triad", Kokkos::RangePolicy<DefaultExec>(0, a.extent(0)),
                       KOKKOS_LAMBDA(index_t i) { a(i) = b(i) + 3.0f * c(i); });
}

// STREAM convention: 12 bytes per element (two reads, one write).
double measure_triad(index_t n) {
  auto a = random_floats(n, 1, 1.0f), b = random_floats(n, 2, 1.0f), c = random_floats(n, 3, 1.0f);
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    Kokkos::fence();
    Kokkos::Timer timer;
    triad(a, b, c);
    Kokkos::fence();
    best = std::min(best, timer.seconds());
  }
  return 12.0 * n / best;
}

// Copy convention: 8 bytes per float (one read, one write).
double measure_copy(index_t n) {
  auto src = random_floats(n, 1, 1.0f);
  Kokkos::View<float*> dst("dst", n);  // initialised: no first-touch page faults in the timing
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    Kokkos::fence();
    Kokkos::Timer timer;
    Kokkos::deep_copy(DefaultExec(), dst, src);
    Kokkos::fence();
    best = std::min(best, timer.seconds());
  }
  return 8.0 * n / best;
}

void BM_DeviceCopy(benchmark::State& state) {
  const index_t n = state.range(0);
  auto src = random_floats(n, 1, 1.0f);
  Kokkos::View<float*> dst("dst", n);  // initialised: no first-touch page faults in the timing
  run_timed(state, 8.0 * n, [&] { Kokkos::deep_copy(DefaultExec(), dst, src); });
}

void BM_Triad(benchmark::State& state) {
  const index_t n = state.range(0);
  auto a = random_floats(n, 1, 1.0f), b = random_floats(n, 2, 1.0f), c = random_floats(n, 3, 1.0f);
  run_timed(state, 12.0 * n, [&] { triad(a, b, c); });
}

void BM_CastToBf16(benchmark::State& state) {
  const index_t n = state.range(0);
  auto x = random_floats(n, 4, 1.0f);
  Kokkos::View<bf16_bits*> y("y", n);
  run_timed(state, 6.0 * n, [&] { cast_to_bf16(DefaultExec(), x, y); });
}

// A model-like table: 64 tensors, every other one without weight decay.
std::vector<index_t> bench_offsets(index_t n) {
  std::vector<index_t> offsets;
  for (int t = 0; t <= 64; ++t) offsets.push_back(n * t / 64);
  return offsets;
}

Kokkos::View<std::uint8_t*> bench_decay_mask() {
  Kokkos::View<std::uint8_t*> mask("mask", 64);
  Kokkos::parallel_for("bench::mask", 64, KOKKOS_LAMBDA(int t) { mask(t) = t % 2; });
  return mask;
}

// AdamW's inputs: FP32 master, gradient and moments with a BF16 copy of the master (mixed), or
// all in BF16.
struct MixedInputs {
  Kokkos::View<float*> master, grad, m, v;
  Kokkos::View<bf16_bits*> copy;
};

MixedInputs mixed_inputs(index_t n) {
  MixedInputs x{random_floats(n, 5, 0.05f), random_floats(n, 6, 1e-3f), random_floats(n, 7, 1e-4f),
                random_floats(n, 8, 1e-8f), Kokkos::View<bf16_bits*>("copy", n)};
  const auto v = x.v;
  Kokkos::parallel_for("bench::abs", n, KOKKOS_LAMBDA(index_t i) { v(i) = fabsf(v(i)); });
  cast_to_bf16(DefaultExec(), x.master, x.copy);
  return x;
}

struct Bf16Inputs {
  Kokkos::View<bf16_bits*> w, g, m, v;
};

Bf16Inputs bf16_inputs(index_t n) {
  Bf16Inputs x{Kokkos::View<bf16_bits*>("w", n), Kokkos::View<bf16_bits*>("g", n), Kokkos::View<bf16_bits*>("m", n),
               Kokkos::View<bf16_bits*>("v", n)};
  cast_to_bf16(DefaultExec(), random_floats(n, 5, 0.05f), x.w);
  cast_to_bf16(DefaultExec(), random_floats(n, 6, 1e-3f), x.g);
  return x;
}

AdamWHyper bench_hyper(Precision p) {
  AdamWHyper h;  // lr 3e-6, an RL learning rate: 1-3% of the BF16 bits change per step
  if (p == Precision::mixed) h.weight_decay = 0.01;
  return h;
}

// The changes a staged pass listed, as a share of the elements.
double changed_fraction(const ChangeStaging<DefaultMem>& staging, index_t n) {
  index_t changed = 0;
  const auto counts = staging.counts;
  Kokkos::parallel_reduce("bench::changed", counts.extent(0), KOKKOS_LAMBDA(index_t j, index_t & c) { c += counts(j); },
                          changed);
  return double(changed) / n;
}

// Mixed: reads w, g, m, v (16 B), writes w, m, v (12 B) and the BF16 copy (2 B).
void BM_AdamWMixed(benchmark::State& state) {
  const index_t n = state.range(0);
  const MixedInputs x = mixed_inputs(n);
  const auto segs = make_segments(bench_offsets(n));
  const auto mask = bench_decay_mask();
  const AdamWHyper h = bench_hyper(Precision::mixed);
  std::int64_t step = 10;
  run_timed(state, 30.0 * n, [&] {
    adamw_mixed(DefaultExec(), segs, mask, adamw_scalars(h, ++step, 1.0f, Precision::mixed), x.master, x.grad, x.m,
                x.v, x.copy, false);
  });
}

// BF16: reads w, g, m, v (8 B), writes w, m, v (6 B); counts changes on the way.
void BM_AdamWBf16(benchmark::State& state) {
  const index_t n = state.range(0);
  const Bf16Inputs x = bf16_inputs(n);
  const auto segs = make_segments(bench_offsets(n));
  const auto mask = bench_decay_mask();
  const AdamWHyper h = bench_hyper(Precision::bf16);
  std::int64_t step = 10;
  run_timed(state, 14.0 * n, [&] {
    adamw_bf16(DefaultExec(), segs, mask, adamw_scalars(h, ++step, 1.0f, Precision::bf16), x.w, x.g, x.m, x.v);
  });
}

// The staged variants pulse-train's trainer 0 runs: the same pass, also reading the previous BF16
// bits (mixed) and staging each change (index 8 B + bits 2 B, not counted). Counter
// changed_fraction: the changes' share of the elements at these settings.
void BM_AdamWMixedStaged(benchmark::State& state) {
  const index_t n = state.range(0);
  const MixedInputs x = mixed_inputs(n);
  const auto segs = make_segments(bench_offsets(n));
  const auto mask = bench_decay_mask();
  const auto staging = make_change_staging(segs);
  const AdamWHyper h = bench_hyper(Precision::mixed);
  std::int64_t step = 10;
  run_timed(state, 32.0 * n, [&] {
    adamw_mixed(DefaultExec(), segs, mask, adamw_scalars(h, ++step, 1.0f, Precision::mixed), x.master, x.grad, x.m,
                x.v, x.copy, staging);
  });
  state.counters["changed_fraction"] = changed_fraction(staging, n);
}

void BM_AdamWBf16Staged(benchmark::State& state) {
  const index_t n = state.range(0);
  const Bf16Inputs x = bf16_inputs(n);
  const auto segs = make_segments(bench_offsets(n));
  const auto mask = bench_decay_mask();
  const auto staging = make_change_staging(segs);
  const AdamWHyper h = bench_hyper(Precision::bf16);
  std::int64_t step = 10;
  run_timed(state, 14.0 * n, [&] {
    adamw_bf16(DefaultExec(), segs, mask, adamw_scalars(h, ++step, 1.0f, Precision::bf16), x.w, x.g, x.m, x.v,
               staging);
  });
  state.counters["changed_fraction"] = changed_fraction(staging, n);
}

// Two BF16 versions that differ in 1% of the elements (the paper's per-step sparsity).
struct DiffInputs {
  Kokkos::View<bf16_bits*> before, after;
  index_t changed;
};

DiffInputs diff_inputs(index_t n) {
  DiffInputs d{Kokkos::View<bf16_bits*>("before", n), Kokkos::View<bf16_bits*>("after", n), 0};
  cast_to_bf16(DefaultExec(), random_floats(n, 9, 0.05f), d.before);
  Kokkos::deep_copy(d.after, d.before);
  auto after = d.after;
  Kokkos::parallel_reduce(
      "bench::perturb", n,
      KOKKOS_LAMBDA(index_t i, index_t & c) {
        if (hash_unit(i, 10) > 0.98f) {  // P = 1%
          after(i) = static_cast<bf16_bits>(after(i) ^ 1u);
          ++c;
        }
      },
      d.changed);
  return d;
}

void BM_DiffCount(benchmark::State& state) {
  const index_t n = state.range(0);
  const auto d = diff_inputs(n);
  index_t count = 0;
  run_timed(state, 4.0 * n, [&] { count = count_changed(DefaultExec(), d.before, d.after); });
  state.counters["sparsity"] = 1.0 - double(count) / n;
}

// Reads both versions (4 B/element), writes index (8 B) and value (2 B) per change.
void BM_DiffCompact(benchmark::State& state) {
  const index_t n = state.range(0);
  const auto d = diff_inputs(n);
  Kokkos::View<index_t*> indices("indices", d.changed);
  Kokkos::View<bf16_bits*> values("values", d.changed);
  index_t count = 0;
  run_timed(state, 4.0 * n + 10.0 * d.changed,
            [&] { count = compact_changed(DefaultExec(), d.before, d.after, indices, values); });
  state.counters["sparsity"] = 1.0 - double(count) / n;
}

#define PULSE_BENCH(fn) BENCHMARK(fn)->Arg(1 << 24)->Arg(1 << 28)->UseManualTime()->Unit(benchmark::kMillisecond)
PULSE_BENCH(BM_DeviceCopy);
PULSE_BENCH(BM_Triad);
PULSE_BENCH(BM_CastToBf16);
PULSE_BENCH(BM_AdamWMixed);
PULSE_BENCH(BM_AdamWBf16);
PULSE_BENCH(BM_AdamWMixedStaged);
PULSE_BENCH(BM_AdamWBf16Staged);
PULSE_BENCH(BM_DiffCount);
PULSE_BENCH(BM_DiffCompact);

}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  g_triad_bytes_per_second = measure_triad(index_t(1) << 26);
  g_copy_bytes_per_second = measure_copy(index_t(1) << 26);
  benchmark::AddCustomContext("triad_bytes_per_second", std::to_string(g_triad_bytes_per_second));
  benchmark::AddCustomContext("copy_bytes_per_second", std::to_string(g_copy_bytes_per_second));
  benchmark::AddCustomContext("kokkos_execution_space", DefaultExec::name());
  // Thread count (OMP_NUM_THREADS on OpenMP) and code path: scaling is read across runs.
  benchmark::AddCustomContext("kokkos_concurrency", std::to_string(DefaultExec().concurrency()));
  benchmark::AddCustomContext("pulse_force_device_paths", force_device_paths ? "1" : "0");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
