// Digests of pulse's bit-exact kernels on fixed seeded inputs, for comparing builds: the same
// lines from a CPU build and a GPU build mean the GPU reproduces the CPU bit for bit.
//   kernel_digest [--check] [--serial]
// prints "name value" lines on stdout (xxh3-128 of an output's bytes, or a count). The kernels run in the
// default execution space (the GPU on a CUDA build), or with --serial in Kokkos::Serial (an OpenMP
// build's Kokkos has both, so one binary checks both host backends). With --check it also runs everything a
// second time on fresh buffers, on a host backend a third time on the other code path (host
// backends take their own, or the device paths with PULSE_FORCE_DEVICE_PATHS=1 in the
// environment: kernels/segments.hpp), and recomputes every output with plain serial host loops over
// the element functions (an independent path through the parallel machinery: segments, team
// reductions, scans, compaction), and exits 1 naming any output that differs. stderr names the
// execution space and the code path of the printed run.
// Inputs include +-0, infinities, NaN payloads, subnormals and exact BF16 rounding ties.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "core/tensor_table.hpp"
#include "kernels/adamw.hpp"
#include "kernels/bf16.hpp"
#include "kernels/gate.hpp"
#include "kernels/host_copy.hpp"
#include "kernels/sparsity.hpp"
#include "coding/digest.hpp"
#include "sync/patch.hpp"

using namespace pulse;

namespace {

// Uneven tensors, some longer than a segment (2^15), one empty, and an odd total.
const std::vector<index_t> tensor_sizes = {70001, 1, 0, 32768, 131075, 4099, 262147};
constexpr int adam_steps = 3;

using Results = std::map<std::string, std::string>;

std::uint64_t splitmix(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

float uniform(std::uint64_t& state) {  // in [-1, 1)
  return static_cast<float>(static_cast<std::int64_t>(splitmix(state) >> 40) - (1 << 23)) / float(1 << 23);
}

float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

std::vector<float> floats(std::size_t n, std::uint64_t seed, float scale) {
  std::vector<float> v(n);
  for (auto& x : v) x = scale * uniform(seed);
  return v;
}

// Values that exercise the cast's edge cases, written over every 97th element.
std::vector<float> with_specials(std::vector<float> v) {
  const std::uint32_t specials[] = {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00001u,
                                    0xFFA00000u, 0x7F800001u, 0x00000001u, 0x807FFFFFu, 0x3F808000u,
                                    0x3F818000u, 0x3F80C000u, 0x7F7FFFFFu, 0x477FE000u, 0xBF7F8000u};
  const std::size_t k = sizeof specials / sizeof specials[0];
  for (std::size_t i = 0, j = 0; i < v.size(); i += 97, ++j) v[i] = from_bits(specials[j % k]);
  return v;
}

std::vector<bf16_bits> to_bf16(const std::vector<float>& x) {
  std::vector<bf16_bits> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = float_to_bf16(x[i]);
  return out;
}

template <class T>
std::string digest(const std::vector<T>& v) {
  return sync::to_hex(sync::digest_bytes(v.data(), v.size() * sizeof(T)));
}

struct Inputs {
  TensorTable table;
  std::vector<float> x, master, grad, m, v, theta, s;
  std::vector<bf16_bits> w16, g16, m16, v16;
};

Inputs make_inputs() {
  Inputs in;
  for (std::size_t t = 0; t < tensor_sizes.size(); ++t)
    in.table.add("t" + std::to_string(t), {tensor_sizes[t]}, t % 2 == 0);
  const std::size_t n = in.table.num_elements();
  in.x = with_specials(floats(n, 1, 4.0f));
  in.master = floats(n, 2, 0.05f);
  in.grad = floats(n, 3, 1e-3f);
  in.m = floats(n, 4, 1e-4f);
  in.v = floats(n, 5, 1e-8f);
  for (auto& x : in.v) x = x < 0 ? -x : x;
  in.w16 = to_bf16(in.master);
  in.g16 = to_bf16(in.grad);
  in.m16 = to_bf16(in.m);
  in.v16 = to_bf16(in.v);
  // PULSELoCo gate: weights and a pseudo-gradient whose entries are mostly below half an ulp.
  in.theta = floats(n, 6, 0.05f);
  in.s = floats(n, 7, 2e-4f);
  return in;
}

AdamWHyper hyper() {
  AdamWHyper h;
  h.lr = 1e-3;  // large enough that a good fraction of the BF16 weights change
  h.weight_decay = 0.01;
  return h;
}

// Per-tensor changed counts, as one line.
std::string join(const std::vector<index_t>& v) {
  std::string s;
  for (const index_t x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

// A patch from base to target bits, tensors as in the table.
std::string patch_digest(const TensorTable& table, const std::vector<bf16_bits>& base,
                         const std::vector<bf16_bits>& target) {
  std::vector<sync::TensorRef> b, t;
  for (const TensorInfo& info : table.tensors()) {
    const std::size_t bytes = std::size_t(info.numel) * sizeof(bf16_bits);
    b.push_back({info.name, "BF16", info.shape, reinterpret_cast<const std::byte*>(base.data() + info.offset), bytes});
    t.push_back({info.name, "BF16", info.shape, reinterpret_cast<const std::byte*>(target.data() + info.offset), bytes});
  }
  return digest(sync::encode_patch(b, t, sync::EncodeOptions{}));
}

// Everything through pulse's kernels in the execution space ExecSpace.
template <class ExecSpace>
Results run_kernels(const Inputs& in) {
  using Mem = typename ExecSpace::memory_space;
  Results r;
  const ExecSpace space;
  const index_t n = in.table.num_elements();
  const auto segs = make_segments<Mem>(in.table.offsets());
  const auto mask = to_device<Mem>(in.table.weight_decay_mask());

  Kokkos::View<bf16_bits*, Mem> cast("cast", n);
  cast_to_bf16(space, to_device<Mem>(in.x), cast);
  r["cast_to_bf16"] = digest(to_host(cast));

  {
    auto master = to_device<Mem>(in.master), grad = to_device<Mem>(in.grad), m = to_device<Mem>(in.m),
         v = to_device<Mem>(in.v);
    auto copy = to_device<Mem>(in.w16);
    std::string changed;
    for (int step = 1; step <= adam_steps; ++step)
      changed += (step > 1 ? "," : "") +
                 std::to_string(adamw_mixed(space, segs, mask, adamw_scalars(hyper(), step, 1.0f, Precision::mixed),
                                            master, grad, m, v, copy, true));
    r["adamw_mixed.changed"] = changed;
    r["adamw_mixed.master"] = digest(to_host(master));
    r["adamw_mixed.m"] = digest(to_host(m));
    r["adamw_mixed.v"] = digest(to_host(v));
    const auto after = to_host(copy);
    r["adamw_mixed.bf16"] = digest(after);

    // Sparsity between the BF16 weights before and after the steps, and the patch between them.
    const auto before_d = to_device<Mem>(in.w16);
    r["sparsity.count"] = std::to_string(count_changed(space, before_d, copy));
    r["sparsity.per_tensor"] = join(count_changed(space, segs, before_d, copy).per_tensor);
    Kokkos::View<index_t*, Mem> indices("indices", n);
    Kokkos::View<bf16_bits*, Mem> values("values", n);
    const index_t c = compact_changed(space, before_d, copy, indices, values);
    r["sparsity.compact.indices"] = digest(to_host(Kokkos::subview(indices, std::make_pair(index_t(0), c))));
    r["sparsity.compact.values"] = digest(to_host(Kokkos::subview(values, std::make_pair(index_t(0), c))));
    r["patch"] = patch_digest(in.table, in.w16, after);
  }

  {
    auto w = to_device<Mem>(in.w16), g = to_device<Mem>(in.g16), m = to_device<Mem>(in.m16), v = to_device<Mem>(in.v16);
    std::string changed;
    for (int step = 1; step <= adam_steps; ++step)
      changed += (step > 1 ? "," : "") +
                 std::to_string(adamw_bf16(space, segs, mask, adamw_scalars(hyper(), step, 1.0f, Precision::bf16), w,
                                           g, m, v));
    r["adamw_bf16.changed"] = changed;
    r["adamw_bf16.w"] = digest(to_host(w));
    r["adamw_bf16.m"] = digest(to_host(m));
    r["adamw_bf16.v"] = digest(to_host(v));
  }

  {
    const auto theta = to_device<Mem>(in.theta), s = to_device<Mem>(in.s);
    Kokkos::View<std::uint8_t*, Mem> fire("fire", n);
    r["gate.fired"] = std::to_string(gate_mask(space, theta, s, fire));
    r["gate.mask"] = digest(to_host(fire));
    Kokkos::View<index_t*, Mem> indices("indices", n);
    Kokkos::View<float*, Mem> values("values", n);
    const index_t c = compact_fired(space, theta, s, indices, values);
    r["gate.compact.indices"] = digest(to_host(Kokkos::subview(indices, std::make_pair(index_t(0), c))));
    r["gate.compact.values"] = digest(to_host(Kokkos::subview(values, std::make_pair(index_t(0), c))));
  }
  return r;
}

// The same outputs from serial host loops over the element functions.
Results run_reference(const Inputs& in) {
  Results r;
  const std::size_t n = in.table.num_elements();
  std::vector<std::uint8_t> decay(n);
  for (const TensorInfo& info : in.table.tensors()) {
    for (index_t i = 0; i < info.numel; ++i) decay[info.offset + i] = info.weight_decay;
  }
  r["cast_to_bf16"] = digest(to_bf16(in.x));

  {
    auto master = in.master, m = in.m, v = in.v;
    auto copy = in.w16;
    std::string changed;
    for (int step = 1; step <= adam_steps; ++step) {
      const AdamWScalars s = adamw_scalars(hyper(), step, 1.0f, Precision::mixed);
      index_t c = 0;
      for (std::size_t i = 0; i < n; ++i) {
        master[i] = detail::adamw_mixed_element(s, decay[i], master[i], in.grad[i], m[i], v[i]);
        const bf16_bits b = float_to_bf16(master[i]);
        c += b != copy[i];
        copy[i] = b;
      }
      changed += (step > 1 ? "," : "") + std::to_string(c);
    }
    r["adamw_mixed.changed"] = changed;
    r["adamw_mixed.master"] = digest(master);
    r["adamw_mixed.m"] = digest(m);
    r["adamw_mixed.v"] = digest(v);
    r["adamw_mixed.bf16"] = digest(copy);

    std::vector<index_t> per_tensor, indices;
    std::vector<bf16_bits> values;
    for (const TensorInfo& info : in.table.tensors()) {
      index_t c = 0;
      for (index_t i = info.offset; i < info.offset + info.numel; ++i) {
        if (in.w16[i] == copy[i]) continue;
        ++c;
        indices.push_back(i);
        values.push_back(copy[i]);
      }
      per_tensor.push_back(c);
    }
    r["sparsity.count"] = std::to_string(indices.size());
    r["sparsity.per_tensor"] = join(per_tensor);
    r["sparsity.compact.indices"] = digest(indices);
    r["sparsity.compact.values"] = digest(values);
    r["patch"] = patch_digest(in.table, in.w16, copy);
  }

  {
    auto w = in.w16, m = in.m16, v = in.v16;
    std::string changed;
    for (int step = 1; step <= adam_steps; ++step) {
      const AdamWScalars s = adamw_scalars(hyper(), step, 1.0f, Precision::bf16);
      index_t c = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const bf16_bits old = w[i];
        w[i] = detail::adamw_bf16_element(s, decay[i], old, in.g16[i], m[i], v[i]);
        c += w[i] != old;
      }
      changed += (step > 1 ? "," : "") + std::to_string(c);
    }
    r["adamw_bf16.changed"] = changed;
    r["adamw_bf16.w"] = digest(w);
    r["adamw_bf16.m"] = digest(m);
    r["adamw_bf16.v"] = digest(v);
  }

  {
    std::vector<std::uint8_t> fire(n);
    std::vector<index_t> indices;
    std::vector<float> values;
    for (std::size_t i = 0; i < n; ++i) {
      fire[i] = gate_fires(in.theta[i], in.s[i]);
      if (!fire[i]) continue;
      indices.push_back(i);
      values.push_back(in.s[i]);
    }
    r["gate.fired"] = std::to_string(indices.size());
    r["gate.mask"] = digest(fire);
    r["gate.compact.indices"] = digest(indices);
    r["gate.compact.values"] = digest(values);
  }
  return r;
}

// Names every line where b differs from a; returns the number of differences.
int compare(const Results& a, const Results& b, const std::string& what) {
  int bad = 0;
  for (const auto& [name, value] : a) {
    const auto it = b.find(name);
    if (it != b.end() && it->second == value) continue;
    std::cerr << "kernel_digest: " << name << " differs in " << what << ": " << value << " vs "
              << (it == b.end() ? "(missing)" : it->second) << "\n";
    ++bad;
  }
  return bad;
}

}  // namespace

// The kernels' code path on ExecSpace now (kernels/segments.hpp).
template <class ExecSpace>
std::string code_path() {
  if (!is_host_space<ExecSpace>) return "device code paths";
  return device_paths_forced() ? "device code paths (forced)" : "host code paths";
}

// Runs the kernels with the device paths forced or not, then restores the setting.
template <class ExecSpace>
Results run_kernels_forced(const Inputs& in, bool forced) {
  const bool before = device_paths_forced();
  set_device_paths_forced(forced);
  Results r = run_kernels<ExecSpace>(in);
  set_device_paths_forced(before);
  return r;
}

template <class ExecSpace>
int digest_main(bool check) {
  const Inputs in = make_inputs();
  const Results r = run_kernels<ExecSpace>(in);
  std::cerr << "kernel_digest: execution space " << ExecSpace::name() << ", " << code_path<ExecSpace>() << "\n";
  for (const auto& [name, value] : r) std::cout << name << " " << value << "\n";
  if (!check) return 0;
  int bad = compare(r, run_kernels<ExecSpace>(in), "a second run") +
            compare(r, run_reference(in), "the host reference");
  // A host backend also runs the other code path: host and device paths agree bit for bit.
  if (is_host_space<ExecSpace>)
    bad += compare(r, run_kernels_forced<ExecSpace>(in, !device_paths_forced()),
                   device_paths_forced() ? "the host code paths" : "the device code paths");
  std::cerr << "kernel_digest: " << r.size() << " outputs, " << bad << " differ\n";
  return bad == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  bool check = false, serial = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--check") {
      check = true;
    } else if (arg == "--serial") {
      serial = true;
    } else {
      std::cerr << "usage: kernel_digest [--check] [--serial]\n";
      return 2;
    }
  }
  try {
    if (!serial) return digest_main<DefaultExec>(check);
#ifdef KOKKOS_ENABLE_SERIAL
    return digest_main<Kokkos::Serial>(check);
#else
    std::cerr << "kernel_digest: --serial needs a Kokkos built with its Serial backend\n";
    return 2;
#endif
  } catch (const std::exception& e) {
    std::cerr << "kernel_digest: " << e.what() << "\n";
    return 1;
  }
}
