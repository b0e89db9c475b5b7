// pulse-absorb: the absorption mechanism in isolation. AdamW at RL learning rates runs on a
// synthetic parameter buffer with synthetic noisy gradients, and the foundation kernels
// measure what the paper measures on real training: per-step and k-step BF16 sparsity, the
// fraction of updates below half a BF16 ulp, and gradient sparsity. Real gradients from the
// GPT and the GRPO loop replace the synthetic ones in pulse-train.
//   pulse-absorb --out runs/default [--elements N --steps T --lr LR --precision mixed|bf16]
#include <CLI/CLI.hpp>
#include <Kokkos_Core.hpp>
#include <Kokkos_Random.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/conventions.hpp"
#include "cli/json_summary.hpp"
#include "cli/unsigned_option.hpp"
#include "core/tensor_table.hpp"
#include "core/version.hpp"
#include "kernels/absorption.hpp"
#include "kernels/adamw.hpp"
#include "kernels/host_copy.hpp"
#include "kernels/sparsity.hpp"

using namespace pulse;

namespace {

struct Options {
  std::string out = "runs/default";
  index_t elements = index_t(1) << 22;
  int steps = 64;
  double lr = 3e-6;
  std::string precision = name_of(precision_names, Precision::mixed);
  std::uint64_t seed = 1;
  float weight_std = 0.02f;
  float grad_std = 1e-3f;
  float grad_persistence = 0.3f;  // weight of a fixed direction in every step's gradient
};

const std::vector<int> k_values{1, 2, 4, 8, 16, 32};
const std::vector<float> grad_taus{0.0f, 1e-8f, 1e-6f, 1e-4f};

// A GPT-like table: large decayed matrices and small undecayed norm vectors.
TensorTable synthetic_table(index_t elements) {
  TensorTable table;
  const index_t width = 256;
  int block = 0;
  while (table.num_elements() + 4 * width * width + 2 * width <= elements) {
    const std::string p = "blocks." + std::to_string(block++) + ".";
    table.add(p + "ln.weight", {width}, false);
    table.add(p + "attn.qkv.weight", {3 * width, width});
    table.add(p + "ln2.bias", {width}, false);
    table.add(p + "mlp.fc.weight", {width, width});
  }
  PULSE_CHECK(table.size() > 0, "--elements must be at least " + std::to_string(4 * width * width + 2 * width));
  return table;
}

int run(const Options& opt) {
  const Precision precision = *value_named(precision_names, opt.precision);  // a name of the table: --precision checks it
  // Fail on a bad output folder before any work is done.
  std::error_code ec;
  std::filesystem::create_directories(opt.out, ec);
  PULSE_CHECK(!ec && std::filesystem::is_directory(opt.out), "cannot create output folder '" + opt.out + "'");
  const TensorTable table = synthetic_table(opt.elements);
  const index_t n = table.num_elements();
  const auto segs = make_segments(table.offsets());
  const auto decay_mask = to_device(table.weight_decay_mask());

  Kokkos::Random_XorShift64_Pool<DefaultExec> pool(opt.seed);
  Kokkos::View<float*> master("master", n), before("before", n), update("update", n), grad("grad", n);
  Kokkos::View<float*> direction("direction", n), m("m", n), v("v", n);
  Kokkos::View<bf16_bits*> weights("weights", n), grad16("grad16", n), m16("m16", n), v16("v16", n);
  const float weight_std = opt.weight_std;
  Kokkos::parallel_for("pulse_absorb::init", n, KOKKOS_LAMBDA(index_t i) {
    auto gen = pool.get_state();
    master(i) = gen.normal(0.0f, weight_std);
    direction(i) = gen.normal(0.0f, 1.0f);
    pool.free_state(gen);
  });
  cast_to_bf16(DefaultExec(), master, weights);

  SnapshotRing<DefaultMem> ring(k_values.back(), n);
  ring.push(DefaultExec(), weights);
  AdamWHyper hyper;
  hyper.lr = opt.lr;
  hyper.weight_decay = 0.01;

  nlohmann::json steps = nlohmann::json::array();
  std::printf("%6s %10s %9s %9s %9s %9s\n", "step", "changed", "S1", "S8", "S32", "absorbed");
  for (int step = 1; step <= opt.steps; ++step) {
    const float persistence = opt.grad_persistence, scale = opt.grad_std;
    Kokkos::parallel_for("pulse_absorb::gradient", n, KOKKOS_LAMBDA(index_t i) {
      auto gen = pool.get_state();
      const float noise = gen.normal(0.0f, 1.0f);
      pool.free_state(gen);
      grad(i) = scale * (persistence * direction(i) + (1.0f - persistence) * noise);
    });
    const auto small = count_small(DefaultExec(), grad, grad_taus);
    const AdamWScalars s = adamw_scalars(hyper, step, 1.0f, precision);
    index_t changed = 0;
    double absorbed = -1;
    if (precision == Precision::mixed) {
      Kokkos::deep_copy(before, master);
      changed = adamw_mixed(DefaultExec(), segs, decay_mask, s, master, grad, m, v, weights, true);
      Kokkos::parallel_for("pulse_absorb::update", n, KOKKOS_LAMBDA(index_t i) { update(i) = master(i) - before(i); });
      absorbed = double(absorption_stats(DefaultExec(), before, update).absorbed) / n;
    } else {
      cast_to_bf16(DefaultExec(), grad, grad16);
      changed = adamw_bf16(DefaultExec(), segs, decay_mask, s, weights, grad16, m16, v16);
    }
    const auto changed_k = ring.count_changed_k(DefaultExec(), weights, k_values);
    ring.push(DefaultExec(), weights);
    nlohmann::json kstep = nlohmann::json::array();
    for (index_t c : changed_k) kstep.push_back(c < 0 ? nlohmann::json(nullptr) : nlohmann::json(1.0 - double(c) / n));
    nlohmann::json grad_sparsity = nlohmann::json::array();
    for (index_t c : small) grad_sparsity.push_back(double(c) / n);
    steps.push_back({{"step", step}, {"changed", changed}, {"sparsity", 1.0 - double(changed) / n},
                     {"kstep_sparsity", kstep}, {"absorbed_fraction", absorbed},
                     {"grad_sparsity", grad_sparsity}});
    auto fmt = [](const nlohmann::json& x) { return x.is_null() ? std::string("-") : std::to_string(x.get<double>()); };
    std::printf("%6d %10lld %9.5f %9s %9s %9s\n", step, static_cast<long long>(changed), 1.0 - double(changed) / n,
                fmt(kstep[3]).substr(0, 7).c_str(), fmt(kstep[5]).substr(0, 7).c_str(),
                absorbed < 0 ? "-" : std::to_string(absorbed).substr(0, 7).c_str());
  }

  const std::string path = opt.out + "/absorption.json";
  const std::string tmp = path + ".tmp";
  nlohmann::json doc = {{"program", "pulse-absorb"}, {"version", version_string()},
                        {"elements", n}, {"tensors", table.size()}, {"lr", opt.lr}, {"precision", opt.precision},
                        {"seed", opt.seed}, {"weight_std", opt.weight_std}, {"grad_std", opt.grad_std},
                        {"grad_persistence", opt.grad_persistence}, {"k_values", k_values},
                        {"grad_taus", grad_taus}, {"steps", steps}};
  {
    std::ofstream out(tmp);
    out << cli::json_text(doc, 1) << "\n";
    PULSE_CHECK(out.good(), "cannot write " + tmp);
  }
  std::filesystem::rename(tmp, path);  // readers never see a partial file
  std::cout << "wrote " << path << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"pulse-absorb: BF16 absorption of AdamW updates on synthetic gradients"};
  cli::set_conventions(app, "pulse-absorb");
  app.add_option("--out", opt.out, "output folder (absorption.json)");
  app.add_option("--elements", opt.elements, "approximate parameter count")->check(CLI::PositiveNumber);
  app.add_option("--steps", opt.steps, "optimizer steps")->check(CLI::Range(1, 1000000));
  app.add_option("--lr", opt.lr, "AdamW learning rate")->check(CLI::NonNegativeNumber);
  app.add_option("--precision", opt.precision, "mixed (FP32 master) or bf16")->check(CLI::IsMember(names_of(precision_names)));
  app.add_option("--seed", opt.seed, "random seed")->check(cli::unsigned_decimal());
  app.add_option("--weight-std", opt.weight_std, "std of the initial weights")->check(CLI::PositiveNumber);
  app.add_option("--grad-std", opt.grad_std, "std of the gradients")->check(CLI::PositiveNumber);
  app.add_option("--grad-persistence", opt.grad_persistence, "share of a fixed direction in each gradient")
      ->check(CLI::Range(0.0, 1.0));
  cli::JsonSummary summary(app, "pulse-absorb");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return cli::exit_on_parse_error(app, e, "pulse-absorb");
  }
  Kokkos::ScopeGuard kokkos(argc, argv);
  try {
    summary.set("steps", opt.steps);
    return summary.print(run(opt));
  } catch (const std::exception& e) {
    std::cerr << "pulse-absorb: " << e.what() << "\n";
    summary.set("error", e.what());
    return summary.print(1);
  }
}
