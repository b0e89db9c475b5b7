// PULSESync benchmarks: patch size in bits per changed element for dense BF16, dense BF16 +
// zstd, the paper's format and pulse's codings beside the change's empirical entropy (with and
// without the exponent-class context, src/sync/change_entropy.hpp), and encode/apply throughput
// in GB/s of BF16 weights scanned for the default coding and expclass. Steps follow the absorption rule: weights ~ N(0, 0.02), updates lr * N(0, 1)
// with lr calibrated to the target sparsity, and an element changes where bf16(w + u) differs.
// With --trace=DIR (a relay folder of a run, e.g. pulse-train --relay DIR --anchor-every 1000
// --keep-anchors 1000), BM_Trace/DIR replays its versions from the oldest anchor and reports the
// same sizes for each recorded step, summed over the run, the size of expclass-history (each
// sign in the context of its element's change history, followed from the oldest anchor), and
// the entropy given also each element's recency (versions since it last changed,
// src/sync/change_history.hpp). BM_EncodeChanges
// times the sender coding from its list of changes (encode_changes) beside BM_Encode.
//   pulse-bench-sync --benchmark_format=json [--trace=DIR ...]
#include <benchmark/benchmark.h>
#include <zstd.h>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>

#include "kernels/bf16.hpp"
#include "sync/change_entropy.hpp"
#include "sync/change_history.hpp"
#include "sync/checkpoint.hpp"
#include "sync/patch.hpp"
#include "sync/sparse_format.hpp"

using namespace pulse;
using namespace pulse::sync;

namespace {

// Deterministic standard normal from a counter (Box-Muller on two hashed uniforms).
double hashed_normal(std::uint64_t i, std::uint64_t seed) {
  auto mix = [](std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  const double u1 = (mix(2 * i * 0x9E3779B97F4A7C15ull ^ seed) >> 11) * 0x1.0p-53 + 0x1.0p-54;
  const double u2 = (mix((2 * i + 1) * 0x9E3779B97F4A7C15ull ^ seed) >> 11) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

struct Step {
  std::vector<bf16_bits> base, target;
  std::uint64_t changed = 0;
};

double changed_fraction(const std::vector<float>& w, double lr, std::size_t sample) {
  std::size_t c = 0;
  for (std::size_t i = 0; i < sample; ++i)
    c += float_to_bf16(w[i]) != float_to_bf16(w[i] + float(lr * hashed_normal(i, 2)));
  return double(c) / sample;
}

const Step& step_at(std::size_t n, double sparsity) {
  static std::map<std::pair<std::size_t, double>, Step> cache;
  auto& s = cache[{n, sparsity}];
  if (!s.base.empty()) return s;
  std::vector<float> w(n);
  for (std::size_t i = 0; i < n; ++i) w[i] = float(0.02 * hashed_normal(i, 1));
  double lo = 1e-9, hi = 1e-3;  // bisection on log lr for the target changed fraction
  for (int it = 0; it < 40; ++it) {
    const double mid = std::sqrt(lo * hi);
    (changed_fraction(w, mid, std::min<std::size_t>(n, 1 << 20)) < 1 - sparsity ? lo : hi) = mid;
  }
  const double lr = std::sqrt(lo * hi);
  s.base.resize(n);
  s.target.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    s.base[i] = float_to_bf16(w[i]);
    s.target[i] = float_to_bf16(w[i] + float(lr * hashed_normal(i, 2)));
    s.changed += s.base[i] != s.target[i];
  }
  return s;
}

// The tensors a benchmark's elements are cut into: one tensor, or (Layout::qwen) tensors of
// Qwen2-1.5B's layout in its order (the embedding, 151936 x 1536, then layer 0's q, k, v, o,
// gate, up, down projections, the last cut short): many parts, some spanning tensors, as a
// real model's.
enum class Layout { one_tensor, qwen };

std::vector<TensorRef> as_state(const std::vector<bf16_bits>& bits, Layout layout = Layout::one_tensor) {
  if (layout == Layout::one_tensor)
    return {{"weight", "BF16", {std::int64_t(bits.size())}, reinterpret_cast<const std::byte*>(bits.data()), 2 * bits.size()}};
  const std::vector<std::pair<std::string, std::vector<std::int64_t>>> shapes = {
      {"model.embed_tokens.weight", {151936, 1536}},      {"model.layers.0.self_attn.q_proj.weight", {1536, 1536}},
      {"model.layers.0.self_attn.k_proj.weight", {256, 1536}}, {"model.layers.0.self_attn.v_proj.weight", {256, 1536}},
      {"model.layers.0.self_attn.o_proj.weight", {1536, 1536}}, {"model.layers.0.mlp.gate_proj.weight", {8960, 1536}},
      {"model.layers.0.mlp.up_proj.weight", {8960, 1536}},    {"model.layers.0.mlp.down_proj.weight", {1536, 8960}}};
  std::vector<TensorRef> out;
  std::size_t at = 0;
  for (const auto& [name, shape] : shapes) {
    std::size_t n = std::size_t(shape[0] * shape[1]);
    std::vector<std::int64_t> s = shape;
    if (at + n > bits.size()) n = bits.size() - at, s = {std::int64_t(n)};
    out.push_back({name, "BF16", s, reinterpret_cast<const std::byte*>(bits.data() + at), 2 * n});
    if ((at += n) == bits.size()) break;
  }
  return out;
}

// A receiver's state: the same tensors, writable.
std::vector<MutableTensor> as_mutable_state(std::vector<bf16_bits>& bits, Layout layout = Layout::one_tensor) {
  std::vector<MutableTensor> out;
  for (const TensorRef& t : as_state(bits, layout)) out.push_back({t.name, t.dtype, t.shape, const_cast<std::byte*>(t.data), t.bytes});
  return out;
}

std::size_t zstd1_size(const void* data, std::size_t bytes) {
  std::vector<char> out(ZSTD_compressBound(bytes));
  return ZSTD_compress(out.data(), out.size(), data, bytes, 1);
}

// The paper's representation: int32 gaps of the flat indices (over the BF16 tensors in order),
// then raw BF16 values, zstd-1.
std::size_t paper_format_size(const std::vector<TensorRef>& base, const std::vector<TensorRef>& target) {
  std::vector<std::int32_t> gaps;
  std::vector<bf16_bits> values;
  std::int64_t prev = 0, flat = 0;
  for (std::size_t t = 0; t < target.size(); ++t) {
    if (target[t].dtype != "BF16") continue;
    const auto* a = reinterpret_cast<const bf16_bits*>(base[t].data);
    const auto* b = reinterpret_cast<const bf16_bits*>(target[t].data);
    for (std::size_t i = 0; i < target[t].bytes / 2; ++i, ++flat)
      if (a[i] != b[i]) {
        gaps.push_back(std::int32_t(flat - prev));
        prev = flat;
        values.push_back(b[i]);
      }
  }
  std::vector<std::uint8_t> raw(gaps.size() * 4 + values.size() * 2);
  std::memcpy(raw.data(), gaps.data(), gaps.size() * 4);
  std::memcpy(raw.data() + gaps.size() * 4, values.data(), values.size() * 2);
  return zstd1_size(raw.data(), raw.size());
}

// The coding a benchmark argument names: 0 the default (keydiff, gap-varint, zstd-3), 2 expclass.
EncodeOptions coding(std::int64_t id) {
  EncodeOptions opt;
  if (id == 2) {
    opt.values = ValueCoding::exponent_class;
    opt.indices = IndexCoding::exponent_class;
    opt.compressor = Compressor::none;  // range-coded streams do not compress further
  }
  return opt;
}

void BM_PatchSize(benchmark::State& state) {
  const std::size_t n = std::size_t(1) << 24;
  const double sparsity = state.range(0) / 1000.0;
  const Step& s = step_at(n, sparsity);
  std::size_t ours = 0, ours_raw = 0, ours_expclass = 0;
  for (auto _ : state) {
    EncodeOptions opt;
    ours = encode_patch(as_state(s.base), as_state(s.target), opt).size();
    opt.values = ValueCoding::raw;
    ours_raw = encode_patch(as_state(s.base), as_state(s.target), opt).size();
    ours_expclass = encode_patch(as_state(s.base), as_state(s.target), coding(2)).size();
  }
  const ChangeEntropy entropy = change_entropy(as_state(s.base), as_state(s.target));
  const double bits = 8.0 / double(s.changed);
  const std::size_t paper = paper_format_size(as_state(s.base), as_state(s.target));
  state.counters["sparsity"] = 1.0 - double(s.changed) / n;
  state.counters["bits_dense_bf16"] = 2.0 * n * bits;
  state.counters["bits_dense_bf16_zstd1"] = zstd1_size(s.target.data(), 2 * n) * bits;
  state.counters["bits_paper_format"] = paper * bits;
  state.counters["bits_pulse_raw_values"] = ours_raw * bits;
  state.counters["bits_pulse_default"] = ours * bits;
  state.counters["paper_over_default"] = double(paper) / ours;
  state.counters["dense_over_default"] = 2.0 * n / ours;
  state.counters["bits_pulse_expclass"] = ours_expclass * bits;
  state.counters["paper_over_expclass"] = double(paper) / ours_expclass;
  state.counters["dense_over_expclass"] = 2.0 * n / ours_expclass;
  state.counters["bits_entropy_exponent_class"] = entropy.bits() / double(s.changed);
  state.counters["bits_entropy_positions_exponent_class"] = entropy.position_bits / double(s.changed);
  state.counters["bits_entropy_values_exponent_class"] = entropy.value_bits / double(s.changed);
  state.counters["bits_entropy_no_context"] = entropy.bits_no_context() / double(s.changed);
  state.counters["expclass_over_entropy"] = 8.0 * ours_expclass / entropy.bits();
}

// A recorded run: the oldest anchor of a relay folder and the patches after it, each step coded
// again with the default coding, expclass and expclass-history (checked to decode against a
// receiver's history) beside the paper's format and the entropy.
void BM_Trace(benchmark::State& state, const std::string& dir) {
  namespace fs = std::filesystem;
  std::uint64_t oldest = UINT64_MAX;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("anchor-", 0) == 0 && name.size() > 19 && name.compare(name.size() - 12, 12, ".safetensors") == 0)
      oldest = std::min<std::uint64_t>(oldest, std::stoull(name.substr(7, name.size() - 19)));
  }
  if (oldest == UINT64_MAX) return state.SkipWithError(("no anchor in " + dir).c_str());
  Checkpoint current = load_checkpoint(dir + "/anchor-" + std::to_string(oldest) + ".safetensors");
  double steps = 0, changes = 0, dense = 0, ours = 0, ours_expclass = 0, expclass_streams = 0, paper = 0, entropy = 0,
         entropy_positions = 0, entropy_no_context = 0;
  // Given also how recently each element changed (age buckets, never apart, and every age).
  ChangeHistory history(current.layout, compute_digests(current.layout).state), receiver = history;
  double entropy_recency = 0, entropy_recency_positions = 0, entropy_recency_exact = 0, ours_history = 0;
  for (auto _ : state) {
    for (std::uint64_t v = oldest;; ++v) {
      const std::string path = dir + "/patch-" + std::to_string(v) + "-" + std::to_string(v + 1) + ".pulse";
      if (!fs::exists(path)) break;
      Checkpoint next = current;  // copies the bytes; layout points into them
      for (std::size_t i = 0; i < next.layout.size(); ++i) next.layout[i].data = next.data[i].data();
      std::vector<std::uint8_t> bytes(fs::file_size(path));
      std::FILE* f = std::fopen(path.c_str(), "rb");
      const bool read = f && std::fread(bytes.data(), 1, bytes.size(), f) == bytes.size();
      if (f) std::fclose(f);
      if (!read) return state.SkipWithError(("cannot read " + path).c_str());
      apply_to_checkpoint(parse_patch(bytes.data(), bytes.size()), next);
      const ChangeEntropy e = change_entropy(current.layout, next.layout);
      const auto expclass = encode_patch(current.layout, next.layout, coding(2));
      const ParsedPatch parsed = parse_patch(expclass.data(), expclass.size());
      steps += 1;
      changes += double(e.changes);
      for (const auto& t : next.layout) dense += double(t.bytes);
      ours += double(encode_patch(current.layout, next.layout, coding(0)).size());
      ours_expclass += double(expclass.size());
      expclass_streams += double(parsed.header.index_stream.coded + parsed.header.value_stream.coded);
      paper += double(paper_format_size(current.layout, next.layout));
      entropy += e.bits();
      entropy_positions += e.position_bits;
      entropy_no_context += e.bits_no_context();
      const StateDigests next_digests = compute_digests(next.layout);
      const auto with_history = encode_patch(current.layout, next.layout, exponent_class_history_options(history));
      ours_history += double(with_history.size());
      {
        Checkpoint decoded = current;
        for (std::size_t i = 0; i < decoded.layout.size(); ++i) decoded.layout[i].data = decoded.data[i].data();
        std::vector<MutableTensor> m;
        for (std::size_t i = 0; i < decoded.layout.size(); ++i) {
          const TensorRef& t = decoded.layout[i];
          m.push_back({t.name, t.dtype, t.shape, reinterpret_cast<std::byte*>(decoded.data[i].data()), t.bytes});
        }
        StateDigests got;
        apply_patch(parse_patch(with_history.data(), with_history.size()), m, {}, nullptr, &got, {}, nullptr, &receiver);
        if (got.state != next_digests.state) return state.SkipWithError("expclass-history did not decode to the step");
      }
      ElementContexts buckets, exact;
      for (const auto& t : current.layout)
        if (const std::uint8_t* h = history.of(t.name)) {
          const std::size_t n = t.bytes / sparse_format(t.dtype)->bytes;
          for (std::size_t k = 0; k < n; ++k) {
            const unsigned age = ChangeHistory::age(h[k]);
            exact[t.name].push_back(std::uint8_t(age));
            buckets[t.name].push_back(std::uint8_t(age == 0 ? ChangeHistory::kBuckets : ChangeHistory::bucket(age)));
          }
        }
      const ChangeEntropy with_recency = change_entropy(current.layout, next.layout, &buckets);
      entropy_recency += with_recency.bits();
      entropy_recency_positions += with_recency.position_bits;
      entropy_recency_exact += change_entropy(current.layout, next.layout, &exact).bits();
      history.advance(current.layout, next.layout, next_digests.state);
      if (history.bytes() != receiver.bytes() || history.digest() != receiver.digest())
        return state.SkipWithError("sender's and receiver's change histories differ");
      current = std::move(next);
    }
  }
  state.counters["steps"] = steps;
  state.counters["changes_per_step"] = changes / steps;
  state.counters["bits_paper_format"] = 8 * paper / changes;
  state.counters["bits_pulse_default"] = 8 * ours / changes;
  state.counters["bits_pulse_expclass"] = 8 * ours_expclass / changes;
  state.counters["bits_pulse_expclass_streams"] = 8 * expclass_streams / changes;
  state.counters["bits_pulse_expclass_history"] = 8 * ours_history / changes;
  state.counters["dense_over_expclass_history"] = dense / ours_history;
  state.counters["bits_entropy_exponent_class"] = entropy / changes;
  state.counters["bits_entropy_positions_exponent_class"] = entropy_positions / changes;
  state.counters["bits_entropy_no_context"] = entropy_no_context / changes;
  state.counters["expclass_over_entropy"] = 8 * ours_expclass / entropy;
  state.counters["paper_over_expclass"] = paper / ours_expclass;
  state.counters["dense_over_default"] = dense / ours;
  state.counters["dense_over_expclass"] = dense / ours_expclass;
  state.counters["bits_entropy_exponent_class_recency"] = entropy_recency / changes;
  state.counters["bits_entropy_positions_exponent_class_recency"] = entropy_recency_positions / changes;
  state.counters["bits_entropy_exponent_class_recency_exact"] = entropy_recency_exact / changes;
}

// The same change pattern in every sparse-coded float dtype: weights ~ N(0, 0.02), 1% of the
// elements (hashed positions) step by one ulp up or down. F16 and F32 should cost about the
// bits per change of BF16 (positions dominate; a one-step key difference is one byte).
template <class Bits>
std::vector<Bits> one_ulp_pattern(std::size_t n, const char* dtype, bool target) {
  std::vector<Bits> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const float w = float(0.02 * hashed_normal(i, 1));
    std::uint32_t f32;
    std::memcpy(&f32, &w, 4);
    std::uint32_t bits = std::string(dtype) == "F32" ? f32 : std::string(dtype) == "BF16" ? float_to_bf16(w) : 0;
    if (std::string(dtype) == "F16") {  // round to nearest F16 via the compiler's half type
      const _Float16 h = static_cast<_Float16>(w);
      std::uint16_t hb;
      std::memcpy(&hb, &h, 2);
      bits = hb;
    }
    const double u = (hashed_normal(i, 3) + 8.0) * 1e6;
    const bool changes = std::uint64_t(u) % 100 == 0;
    if (target && changes) bits += (std::uint64_t(u) / 100) % 2 ? 1 : -1;  // one ulp in magnitude
    out[i] = static_cast<Bits>(bits);
  }
  return out;
}

template <class Bits>
void dtype_patch_size(benchmark::State& state, const char* dtype) {
  const std::size_t n = std::size_t(1) << 22;
  const auto base = one_ulp_pattern<Bits>(n, dtype, false), target = one_ulp_pattern<Bits>(n, dtype, true);
  std::uint64_t changed = 0;
  for (std::size_t i = 0; i < n; ++i) changed += base[i] != target[i];
  auto as_refs = [&](const std::vector<Bits>& v) {
    return std::vector<TensorRef>{
        {"weight", dtype, {std::int64_t(n)}, reinterpret_cast<const std::byte*>(v.data()), sizeof(Bits) * n}};
  };
  std::size_t bytes = 0;
  for (auto _ : state) bytes = encode_patch(as_refs(base), as_refs(target), {}).size();
  state.counters["changed"] = double(changed);
  state.counters["bits_per_change"] = 8.0 * bytes / double(changed);
  state.counters["dense_over_patch"] = double(sizeof(Bits) * n) / bytes;
}
void BM_PatchSizeBF16(benchmark::State& state) { dtype_patch_size<std::uint16_t>(state, "BF16"); }
void BM_PatchSizeF16(benchmark::State& state) { dtype_patch_size<std::uint16_t>(state, "F16"); }
void BM_PatchSizeF32(benchmark::State& state) { dtype_patch_size<std::uint32_t>(state, "F32"); }

// Steady state of a sender: the base's digests are the ones the previous encode returned.
void BM_Encode(benchmark::State& state) {
  const std::size_t n = std::size_t(state.range(0));
  const Step& s = step_at(n, state.range(1) / 1000.0);
  const StateDigests base_digests = compute_digests(as_state(s.base));
  std::size_t bytes = 0;
  for (auto _ : state) {
    StateDigests target_digests;
    Kokkos::Timer timer;
    bytes = encode_patch(as_state(s.base), as_state(s.target), coding(state.range(2)), &base_digests, &target_digests).size();
    state.SetIterationTime(timer.seconds());
  }
  state.SetBytesProcessed(std::int64_t(2 * n) * state.iterations());
  state.counters["patch_bytes"] = double(bytes);
}

// The sender coding from the list of changes it already holds (pulse-train's trainer 0:
// encode_changes) instead of comparing two versions; the same bytes as BM_Encode.
void BM_EncodeChanges(benchmark::State& state) {
  const std::size_t n = std::size_t(state.range(0));
  const Step& s = step_at(n, state.range(1) / 1000.0);
  const StateDigests base_digests = compute_digests(as_state(s.base));
  std::vector<TensorChanges> changes{{"weight", {}, {}}};
  for (std::size_t i = 0; i < n; ++i)
    if (s.base[i] != s.target[i]) {
      changes[0].indices.push_back(index_t(i));
      changes[0].new_bits.push_back(s.target[i]);
    }
  std::size_t bytes = 0;
  for (auto _ : state) {
    StateDigests target_digests;
    Kokkos::Timer timer;
    bytes = encode_changes(as_state(s.base), changes, coding(state.range(2)), base_digests, &target_digests).size();
    state.SetIterationTime(timer.seconds());
  }
  if (bytes != encode_patch(as_state(s.base), as_state(s.target), coding(state.range(2))).size())
    state.SkipWithError("encode_changes and encode_patch differ");
  state.SetBytesProcessed(std::int64_t(2 * n) * state.iterations());
  state.counters["patch_bytes"] = double(bytes);
}

// Steady state of a receiver: it verified its weights' digests at the previous apply.
void BM_Apply(benchmark::State& state) {
  const std::size_t n = std::size_t(state.range(0));
  const Step& s = step_at(n, state.range(1) / 1000.0);
  const auto patch = encode_patch(as_state(s.base), as_state(s.target), coding(state.range(2)));
  const StateDigests base_digests = compute_digests(as_state(s.base));
  std::vector<bf16_bits> receiver(n);
  for (auto _ : state) {
    std::memcpy(receiver.data(), s.base.data(), 2 * n);  // untimed: reset to the base version
    std::vector<MutableTensor> m = as_mutable_state(receiver);
    Kokkos::Timer timer;
    StateDigests target_digests;
    apply_patch(parse_patch(patch.data(), patch.size()), m, {}, &base_digests, &target_digests);
    state.SetIterationTime(timer.seconds());
  }
  if (std::memcmp(receiver.data(), s.target.data(), 2 * n) != 0) state.SkipWithError("apply is not bit-exact");
  state.SetBytesProcessed(std::int64_t(2 * n) * state.iterations());
}

// Encode and apply at 1 and 2 threads (issue 26: 2 threads >= 1.8x), in memory, both states
// hashed (no digests known: the first encode and apply of a run). Time: wall; CPU: the process's.
void BM_EncodeThreads(benchmark::State& state) {
  const Step& s = step_at(1 << 28, 0.99);
  EncodeOptions options = coding(state.range(0));
  options.threads = unsigned(state.range(1));
  std::size_t bytes = 0;
  for (auto _ : state) {
    Kokkos::Timer timer;
    bytes = encode_patch(as_state(s.base, Layout::qwen), as_state(s.target, Layout::qwen), options).size();
    state.SetIterationTime(timer.seconds());
  }
  state.SetBytesProcessed(std::int64_t(4 * s.base.size()) * state.iterations());
  state.counters["patch_bytes"] = double(bytes);
}

void BM_ApplyThreads(benchmark::State& state) {
  const Step& s = step_at(1 << 28, 0.99);
  const auto patch = encode_patch(as_state(s.base, Layout::qwen), as_state(s.target, Layout::qwen), coding(state.range(0)));
  std::vector<bf16_bits> receiver(s.base.size());
  for (auto _ : state) {
    std::memcpy(receiver.data(), s.base.data(), 2 * receiver.size());  // untimed: reset to the base version
    std::vector<MutableTensor> m = as_mutable_state(receiver, Layout::qwen);
    Kokkos::Timer timer;
    apply_patch(parse_patch(patch.data(), patch.size()), m, {}, nullptr, nullptr, {}, nullptr, nullptr,
                unsigned(state.range(1)));
    state.SetIterationTime(timer.seconds());
  }
  if (std::memcmp(receiver.data(), s.target.data(), 2 * receiver.size()) != 0) state.SkipWithError("apply is not bit-exact");
  state.SetBytesProcessed(std::int64_t(2 * s.base.size()) * state.iterations());
}

// Per core (issue 30): each codec loop on one thread, in steady state (digests known), beside
// the loops that bound it, measured in the same binary: a read of both versions (what encode
// must read), xxh3 of the target and its block digest (what apply's check hashes). Bytes: one
// version's (2n), as BM_Encode. Time: CPU time of the thread.
//   pulse-bench-sync --benchmark_filter=BM_Core
void BM_CoreReadBoth(benchmark::State& state) {
  const Step& s = step_at(std::size_t(state.range(0)), 0.99);
  const std::size_t words = s.base.size() / 4;
  for (auto _ : state) {
    std::uint64_t sum = 0;  // both versions' 8-byte words, each read once
    for (std::size_t i = 0; i < words; ++i) {
      std::uint64_t a, b;
      std::memcpy(&a, s.base.data() + 4 * i, 8);
      std::memcpy(&b, s.target.data() + 4 * i, 8);
      sum += a ^ b;
    }
    benchmark::DoNotOptimize(sum);
  }
  state.SetBytesProcessed(std::int64_t(2 * s.base.size()) * state.iterations());
}

void BM_CoreXxh3(benchmark::State& state) {
  const Step& s = step_at(std::size_t(state.range(0)), 0.99);
  for (auto _ : state) benchmark::DoNotOptimize(digest_bytes(s.target.data(), 2 * s.target.size()));
  state.SetBytesProcessed(std::int64_t(2 * s.base.size()) * state.iterations());
}

void BM_CoreBlockDigest(benchmark::State& state) {
  const Step& s = step_at(std::size_t(state.range(0)), 0.99);
  for (auto _ : state) benchmark::DoNotOptimize(tensor_digest(as_state(s.target)[0], 1));
  state.SetBytesProcessed(std::int64_t(2 * s.base.size()) * state.iterations());
}

void BM_CoreEncode(benchmark::State& state) {
  const std::size_t n = std::size_t(state.range(0));
  const Step& s = step_at(n, state.range(1) / 1000.0);
  const StateDigests base_digests = compute_digests(as_state(s.base));
  EncodeOptions options = coding(state.range(2));
  options.threads = 1;
  std::size_t bytes = 0;
  for (auto _ : state) {
    StateDigests target_digests;
    bytes = encode_patch(as_state(s.base), as_state(s.target), options, &base_digests, &target_digests).size();
  }
  state.SetBytesProcessed(std::int64_t(2 * n) * state.iterations());
  state.counters["patch_bytes"] = double(bytes);
}

void BM_CoreApply(benchmark::State& state) {
  const std::size_t n = std::size_t(state.range(0));
  const Step& s = step_at(n, state.range(1) / 1000.0);
  const auto patch = encode_patch(as_state(s.base), as_state(s.target), coding(state.range(2)));
  const StateDigests base_digests = compute_digests(as_state(s.base));
  std::vector<bf16_bits> receiver(n);
  for (auto _ : state) {
    state.PauseTiming();
    std::memcpy(receiver.data(), s.base.data(), 2 * n);  // reset to the base version
    state.ResumeTiming();
    std::vector<MutableTensor> m = as_mutable_state(receiver);
    StateDigests target_digests;
    apply_patch(parse_patch(patch.data(), patch.size()), m, {}, &base_digests, &target_digests, {}, nullptr, nullptr, 1);
  }
  if (std::memcmp(receiver.data(), s.target.data(), 2 * n) != 0) state.SkipWithError("apply is not bit-exact");
  state.SetBytesProcessed(std::int64_t(2 * n) * state.iterations());
}

BENCHMARK(BM_PatchSize)->Arg(990)->Arg(999)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PatchSizeBF16)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PatchSizeF16)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PatchSizeF32)->Iterations(1)->Unit(benchmark::kMillisecond);
// Arguments: elements, sparsity in thousandths, coding (0 default, 2 expclass).
BENCHMARK(BM_Encode)->ArgsProduct({{1 << 28, 1 << 24}, {990, 999}, {0, 2}})->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeChanges)->ArgsProduct({{1 << 28, 1 << 24}, {990, 999}, {0, 2}})->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Apply)->ArgsProduct({{1 << 28, 1 << 24}, {990, 999}, {0, 2}})->UseManualTime()->Unit(benchmark::kMillisecond);
// Arguments: coding (0 default, 2 expclass), threads.
BENCHMARK(BM_EncodeThreads)->ArgsProduct({{0, 2}, {1, 2}})->UseManualTime()->MeasureProcessCPUTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ApplyThreads)->ArgsProduct({{0, 2}, {1, 2}})->UseManualTime()->MeasureProcessCPUTime()->Unit(benchmark::kMillisecond);

// Arguments: elements (2^26: beyond the caches; 2^18 for callgrind: instructions per element), then sparsity in
// thousandths and coding (0 default keydiff, 2 expclass).
BENCHMARK(BM_CoreReadBoth)->Arg(1 << 26)->Arg(1 << 18)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CoreXxh3)->Arg(1 << 26)->Arg(1 << 18)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CoreBlockDigest)->Arg(1 << 26)->Arg(1 << 18)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CoreEncode)->ArgsProduct({{1 << 26, 1 << 18}, {990}, {0, 2}})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CoreApply)->ArgsProduct({{1 << 26, 1 << 18}, {990}, {0, 2}})->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--trace=", 0) == 0) {
      const std::string dir = arg.substr(8);
      benchmark::RegisterBenchmark(("BM_Trace/" + dir).c_str(), BM_Trace, dir)->Iterations(1)->Unit(benchmark::kMillisecond);
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
