// Runs pulse's AdamW (with optional gradient clipping) over a gradient sequence written by
// tests/oracle/test_adamw_torch.py, and writes the final state for comparison with PyTorch.
//   adamw_driver DIR   reads DIR/config.json, DIR/init.f32, DIR/grads.f32; writes DIR/out_*.
#include <Kokkos_Core.hpp>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "core/tensor_table.hpp"
#include "kernels/adamw.hpp"
#include "kernels/grad_norm.hpp"
#include "kernels/host_copy.hpp"
#include "raw_io.hpp"

using namespace pulse;

namespace {

template <class T>
void save(const std::string& path, const Kokkos::View<T*>& v) {
  oracle::write_raw(path, to_host(v));
}

int run(const std::string& dir) {
  nlohmann::json cfg;
  std::ifstream(dir + "/config.json") >> cfg;
  const bool bf16 = cfg["mode"] == "bf16";
  const Precision precision = bf16 ? Precision::bf16 : Precision::mixed;
  TensorTable table;
  const auto sizes = cfg["sizes"].get<std::vector<index_t>>();
  const auto decay = cfg["decay"].get<std::vector<int>>();
  for (std::size_t t = 0; t < sizes.size(); ++t) table.add("t" + std::to_string(t), {sizes[t]}, decay[t] != 0);
  const index_t n = table.num_elements();
  const auto segs = make_segments(table.offsets());
  const auto mask_host = table.weight_decay_mask();
  const auto mask = to_device(mask_host);

  AdamWHyper hyper;
  hyper.beta1 = cfg["beta1"];
  hyper.beta2 = cfg["beta2"];
  hyper.eps = cfg["eps"];
  hyper.weight_decay = cfg["weight_decay"];
  const double max_norm = cfg["max_norm"];  // 0: no clipping
  // PyTorch's own total norms, when the test isolates clipping from the norm reduction.
  const bool given_norms = cfg.value("use_given_norms", false);
  const auto norms = given_norms ? oracle::read_raw<float>(dir + "/given_norms.f32") : std::vector<float>{};
  const auto lrs = cfg["lrs"].get<std::vector<double>>();

  const auto init = oracle::read_raw<float>(dir + "/init.f32");
  const auto grads = oracle::read_raw<float>(dir + "/grads.f32");
  PULSE_CHECK(init.size() == std::size_t(n) && grads.size() == lrs.size() * n, "input sizes do not match config");

  Kokkos::View<float*> master = to_device(init, "master");
  Kokkos::View<bf16_bits*> weights("weights", n), grad_bf16("grad_bf16", n), m16("m16", n), v16("v16", n);
  Kokkos::View<float*> grad("grad", n), m("m", n), v("v", n);
  cast_to_bf16(DefaultExec(), master, weights);

  nlohmann::json log = nlohmann::json::array();
  for (std::size_t step = 0; step < lrs.size(); ++step) {
    Kokkos::deep_copy(grad, Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                                grads.data() + step * n, n));
    if (bf16) cast_to_bf16(DefaultExec(), grad, grad_bf16);
    float scale = 1.0f, total = 0.0f;
    if (max_norm > 0) {
      total = bf16 ? grad_norm(DefaultExec(), segs, grad_bf16, precision).total
                   : grad_norm(DefaultExec(), segs, grad, precision).total;
      scale = clip_coefficient(given_norms ? norms.at(step) : total, max_norm, precision);
    }
    hyper.lr = lrs[step];
    const AdamWScalars s = adamw_scalars(hyper, static_cast<std::int64_t>(step + 1), scale, precision);
    const index_t changed = bf16 ? adamw_bf16(DefaultExec(), segs, mask, s, weights, grad_bf16, m16, v16)
                                 : adamw_mixed(DefaultExec(), segs, mask, s, master, grad, m, v, weights, true);
    log.push_back({{"total_norm", total}, {"clip_coef", scale}, {"changed", changed}});
  }
  std::ofstream(dir + "/out_log.json") << log.dump();
  save(dir + "/out_weights.u16", weights);
  if (bf16) {
    save(dir + "/out_m.u16", m16);
    save(dir + "/out_v.u16", v16);
  } else {
    save(dir + "/out_master.f32", master);
    save(dir + "/out_m.f32", m);
    save(dir + "/out_v.f32", v);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  if (argc != 2) {
    std::cerr << "usage: adamw_driver DIR\n";
    return 2;
  }
  try {
    return run(argv[1]);
  } catch (const std::exception& e) {
    std::cerr << "adamw_driver: " << e.what() << "\n";
    return 1;
  }
}
