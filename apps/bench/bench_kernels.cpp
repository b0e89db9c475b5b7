// Kernel benchmarks (Google Benchmark): BF16 cast (and, on x86, its memory traffic alone), AdamW in
// both precisions (the plain pass and the staged pass pulse-train's trainer 0 runs), diff-count and
// diff-compact at 99% sparsity, each reporting bytes/s and, as counter `fraction`, its share of the
// bound named in its label. The bounds are the machine's limits, measured by this same binary at
// start-up with the same clock (JSON context): copy (Kokkos deep_copy, 8 B per float), read-only (a
// reduction over a buffer), STREAM triad (12 B per element), xxh3 (the codec's hash) and a 1024^3
// SGEMM.
// With one thread (Kokkos Serial, or OMP_NUM_THREADS=1) every time is the process's CPU time, so
// a loaded machine slows the figures less; with more threads it is wall time (context `clock`).
//   OPENBLAS_NUM_THREADS=1 taskset -c 1 pulse-bench-kernels --benchmark_format=json
// OpenMP scaling, side by side (the JSON context records kokkos_concurrency):
//   OMP_NUM_THREADS=1 pulse-bench-kernels --benchmark_filter='/16777216/' --benchmark_repetitions=5
//   OMP_NUM_THREADS=2 pulse-bench-kernels --benchmark_filter='/16777216/' --benchmark_repetitions=5
#include <benchmark/benchmark.h>
#include <time.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <chrono>
#include <vector>

#include "coding/digest.hpp"
#include "kernels/adamw.hpp"
#include "kernels/bf16.hpp"
#include "kernels/blas_gemm.hpp"
#include "kernels/segments.hpp"
#include "kernels/sparsity.hpp"

using namespace pulse;

namespace {

// The machine's limits, bytes/s (SGEMM: FLOP/s), measured at start-up.
struct Bounds {
  double copy = 0, read = 0, triad = 0, xxh3 = 0, sgemm = 0;
};
Bounds g_bounds;

// Seconds on the clock every figure uses: the process's CPU time on one thread, else wall time.
bool g_cpu_clock = true;

double now_seconds() {
  if (!g_cpu_clock) return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// Best of five runs of body, in seconds.
template <class Body>
double best_seconds(Body&& body) {
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    Kokkos::fence();
    const double start = now_seconds();
    body();
    Kokkos::fence();
    best = std::min(best, now_seconds() - start);
  }
  return best;
}

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

// Times one call of body per iteration, fenced, and reports bytes/s and, as counter fraction,
// its share of the bound (bytes/s) named in the label; copy_fraction: its share of copy.
template <class Body>
void run_timed(benchmark::State& state, double bytes_per_iteration, const char* bound_name, double bound,
               Body&& body) {
  for (auto _ : state) {
    const double start = now_seconds();
    body();
    Kokkos::fence();
    state.SetIterationTime(now_seconds() - start);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes_per_iteration * state.iterations()));
  state.SetLabel(std::string("of ") + bound_name);
  state.counters["fraction"] =
      benchmark::Counter(bytes_per_iteration / bound, benchmark::Counter::kIsIterationInvariantRate);
  // Against copy for every kernel: the GPU targets are stated so (tests/gpu/check.sh).
  state.counters["copy_fraction"] =
      benchmark::Counter(bytes_per_iteration / g_bounds.copy, benchmark::Counter::kIsIterationInvariantRate);
}

void triad(const Kokkos::View<float*>& a, const Kokkos::View<float*>& b, const Kokkos::View<float*>& c) {
  Kokkos::parallel_for("pulse::bench::triad", Kokkos::RangePolicy<DefaultExec>(0, a.extent(0)),
                       KOKKOS_LAMBDA(index_t i) { a(i) = b(i) + 3.0f * c(i); });
}

// Reads every 4-byte word once (an integer sum, which vectorises); returns it so it is not elided.
std::uint32_t read_all(const Kokkos::View<float*>& x) {
  const Kokkos::View<const std::uint32_t*, Kokkos::MemoryUnmanaged> words(reinterpret_cast<const std::uint32_t*>(x.data()),
                                                                         x.extent(0));
  std::uint32_t sum = 0;
  Kokkos::parallel_reduce(
      "pulse::bench::read", Kokkos::RangePolicy<DefaultExec>(0, x.extent(0)),
      KOKKOS_LAMBDA(index_t i, std::uint32_t & s) { s += words(i); }, sum);
  return sum;
}

using Matrix = Kokkos::View<float**, Kokkos::LayoutRight, DefaultMem>;
constexpr int sgemm_size = 1024;

Matrix filled_matrix(const char* label, float scale) {
  Matrix x(std::string(label), sgemm_size, sgemm_size);
  Kokkos::parallel_for(
      "pulse::bench::fill_matrix", Kokkos::RangePolicy<DefaultExec>(0, sgemm_size * sgemm_size),
      KOKKOS_LAMBDA(const int i) { x.data()[i] = scale * float((i * 37) % 101 - 50); });
  return x;
}

// The machine's limits, best of five each. STREAM conventions: copy 8 B and triad 12 B per float
// (write-allocate traffic not counted), read 4 B; xxh3 over the bytes; SGEMM 2 * 1024^3 FLOP.
Bounds measure_bounds(index_t n) {
  Bounds bounds;
  auto a = random_floats(n, 1, 1.0f), b = random_floats(n, 2, 1.0f), c = random_floats(n, 3, 1.0f);
  bounds.triad = 12.0 * n / best_seconds([&] { triad(a, b, c); });
  bounds.copy = 8.0 * n / best_seconds([&] { Kokkos::deep_copy(DefaultExec(), a, b); });
  std::uint32_t sum = 0;
  bounds.read = 4.0 * n / best_seconds([&] { sum += read_all(c); });
  benchmark::DoNotOptimize(sum);
  std::vector<std::uint8_t> bytes(4 * std::size_t(n));
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::uint8_t(i * 131 >> 7);
  bounds.xxh3 = double(bytes.size()) / best_seconds([&] { benchmark::DoNotOptimize(sync::digest_bytes(bytes.data(), bytes.size())); });
  const Matrix ma = filled_matrix("a", 1e-2f), mb = filled_matrix("b", 1e-2f), mc("c", sgemm_size, sgemm_size);
  bounds.sgemm = 2.0 * sgemm_size * sgemm_size * sgemm_size / best_seconds([&] {
    blas_gemm(DefaultExec(), Transpose::no, Transpose::no, sgemm_size, sgemm_size, sgemm_size, 1.0f, ma, mb, 0.0f, mc);
  });
  return bounds;
}

void BM_DeviceCopy(benchmark::State& state) {
  const index_t n = state.range(0);
  auto src = random_floats(n, 1, 1.0f);
  Kokkos::View<float*> dst("dst", n);  // initialised: no first-touch page faults in the timing
  run_timed(state, 8.0 * n, "copy", g_bounds.copy, [&] { Kokkos::deep_copy(DefaultExec(), dst, src); });
}

void BM_ReadOnly(benchmark::State& state) {
  const index_t n = state.range(0);
  auto x = random_floats(n, 1, 1.0f);
  std::uint32_t sum = 0;
  run_timed(state, 4.0 * n, "read", g_bounds.read, [&] { sum += read_all(x); });
  benchmark::DoNotOptimize(sum);
}

void BM_Triad(benchmark::State& state) {
  const index_t n = state.range(0);
  auto a = random_floats(n, 1, 1.0f), b = random_floats(n, 2, 1.0f), c = random_floats(n, 3, 1.0f);
  run_timed(state, 12.0 * n, "triad", g_bounds.triad, [&] { triad(a, b, c); });
}

void BM_CastToBf16(benchmark::State& state) {
  const index_t n = state.range(0);
  auto x = random_floats(n, 4, 1.0f);
  Kokkos::View<bf16_bits*> y("y", n);
  run_timed(state, 6.0 * n, "copy", g_bounds.copy, [&] { cast_to_bf16(DefaultExec(), x, y); });
}

#if defined(__SSE2__)
// The streamed cast's memory traffic without its rounding: the high half of every float, in the
// access pattern cast_to_bf16 uses above streamed_cast_elements (detail::streamed_convert). When
// the cast is as fast, its rounding costs nothing and this access pattern is what bounds it on
// this core.
void high_halves_streamed(const Kokkos::View<float*>& in, const Kokkos::View<bf16_bits*>& out) {
  detail::streamed_convert(DefaultExec(), in.data(), out.data(), static_cast<index_t>(in.extent(0)),
                           [](const float x) { return static_cast<bf16_bits>(float_to_bits(x) >> 16); });
}

// Reads 4 B and writes 2 B per element, as the cast.
void BM_CastTraffic(benchmark::State& state) {
  const index_t n = state.range(0);
  auto x = random_floats(n, 4, 1.0f);
  Kokkos::View<bf16_bits*> y("y", n);
  run_timed(state, 6.0 * n, "copy", g_bounds.copy, [&] { high_halves_streamed(x, y); });
}
#endif

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
  run_timed(state, 30.0 * n, "triad", g_bounds.triad, [&] {
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
  run_timed(state, 14.0 * n, "triad", g_bounds.triad, [&] {
    adamw_bf16(DefaultExec(), segs, mask, adamw_scalars(h, ++step, 1.0f, Precision::bf16), x.w, x.g, x.m, x.v);
  });
}

// A staging whose every page has been written, so that no timed step faults one in (in a run that
// happens only while the lists still grow): each segment's list starts a page of its own, and a
// step that lists more changes than any before it first touches a new page there (at 256M, 8192
// segments: a page fault each, about 100 ms of this VM's time in the first timed step when the
// pages were left to the kernel).
ChangeStaging<DefaultMem> written_staging(const TensorSegments<DefaultMem>& segs) {
  const auto staging = make_change_staging(segs);
  Kokkos::deep_copy(staging.indices, index_t(0));
  Kokkos::deep_copy(staging.values, bf16_bits(0));
  return staging;
}

// The staged variants pulse-train's trainer 0 runs: the same pass, also reading the previous BF16
// bits (mixed) and staging each change (index 8 B + bits 2 B, not counted). Counter
// changed_fraction: the changes' share of the elements at these settings.
void BM_AdamWMixedStaged(benchmark::State& state) {
  const index_t n = state.range(0);
  const MixedInputs x = mixed_inputs(n);
  const auto segs = make_segments(bench_offsets(n));
  const auto mask = bench_decay_mask();
  const auto staging = written_staging(segs);
  const AdamWHyper h = bench_hyper(Precision::mixed);
  std::int64_t step = 10;
  adamw_mixed(DefaultExec(), segs, mask, adamw_scalars(h, ++step, 1.0f, Precision::mixed), x.master, x.grad, x.m, x.v,
              x.copy, staging);
  run_timed(state, 32.0 * n, "triad", g_bounds.triad, [&] {
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
  const auto staging = written_staging(segs);
  const AdamWHyper h = bench_hyper(Precision::bf16);
  std::int64_t step = 10;
  adamw_bf16(DefaultExec(), segs, mask, adamw_scalars(h, ++step, 1.0f, Precision::bf16), x.w, x.g, x.m, x.v, staging);
  run_timed(state, 14.0 * n, "triad", g_bounds.triad, [&] {
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
  run_timed(state, 4.0 * n, "read", g_bounds.read, [&] { count = count_changed(DefaultExec(), d.before, d.after); });
  state.counters["sparsity"] = 1.0 - double(count) / n;
}

// Reads both versions (4 B/element), writes index (8 B) and value (2 B) per change.
void BM_DiffCompact(benchmark::State& state) {
  const index_t n = state.range(0);
  const auto d = diff_inputs(n);
  Kokkos::View<index_t*> indices("indices", d.changed);
  Kokkos::View<bf16_bits*> values("values", d.changed);
  index_t count = 0;
  run_timed(state, 4.0 * n + 10.0 * d.changed, "read", g_bounds.read,
            [&] { count = compact_changed(DefaultExec(), d.before, d.after, indices, values); });
  state.counters["sparsity"] = 1.0 - double(count) / n;
}

#define PULSE_BENCH(fn) BENCHMARK(fn)->Arg(1 << 24)->Arg(1 << 28)->UseManualTime()->Unit(benchmark::kMillisecond)
PULSE_BENCH(BM_DeviceCopy);
PULSE_BENCH(BM_ReadOnly);
PULSE_BENCH(BM_Triad);
PULSE_BENCH(BM_CastToBf16);
#if defined(__SSE2__)
PULSE_BENCH(BM_CastTraffic);
#endif
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
  g_cpu_clock = DefaultExec().concurrency() == 1;
  g_bounds = measure_bounds(index_t(1) << 26);
  benchmark::AddCustomContext("clock", g_cpu_clock ? "process_cpu" : "wall");
  benchmark::AddCustomContext("copy_bytes_per_second", std::to_string(g_bounds.copy));
  benchmark::AddCustomContext("read_bytes_per_second", std::to_string(g_bounds.read));
  benchmark::AddCustomContext("triad_bytes_per_second", std::to_string(g_bounds.triad));
  benchmark::AddCustomContext("xxh3_bytes_per_second", std::to_string(g_bounds.xxh3));
  benchmark::AddCustomContext("sgemm_flops_per_second", std::to_string(g_bounds.sgemm));
  benchmark::AddCustomContext("kokkos_execution_space", DefaultExec::name());
  // Thread count (OMP_NUM_THREADS on OpenMP) and code path: scaling is read across runs.
  benchmark::AddCustomContext("kokkos_concurrency", std::to_string(DefaultExec().concurrency()));
  benchmark::AddCustomContext("pulse_force_device_paths", device_paths_forced() ? "1" : "0");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
