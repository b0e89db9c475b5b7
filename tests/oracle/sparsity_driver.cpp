// Runs the sparsity, absorption and gate kernels on inputs that tests/oracle/test_sparsity_torch.py
// wrote, so the script can check them against PyTorch.
//
//   sparsity_driver <case directory>
//
// Reads params.json and raw little-endian arrays (names below); writes result.json and raw
// arrays into the same directory. Compactions start from params.capacity and grow and retry as
// the capacity contract says, so the script also sees the first attempt's count.
#include <Kokkos_Core.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/absorption.hpp"
#include "kernels/gate.hpp"
#include "kernels/host_copy.hpp"
#include "kernels/sparsity.hpp"
#include "raw_io.hpp"

namespace {

using pulse::index_t;
using pulse::to_device;
using pulse::oracle::read_raw;
using pulse::oracle::write_raw;

template <class T>
std::vector<T> to_host(const Kokkos::View<T*>& v, std::size_t count) {
  return pulse::to_host(Kokkos::subview(v, std::make_pair(std::size_t(0), count)));
}

// Calls compact(indices, values) from the given capacity, growing once if the count exceeds it.
template <class Value, class Compact>
nlohmann::json compact_with_retry(index_t capacity, const Compact& compact, const std::string& dir,
                                  const std::string& name) {
  Kokkos::View<index_t*> indices("indices", capacity);
  Kokkos::View<Value*> values("values", capacity);
  const index_t first = compact(indices, values);
  index_t count = first;
  if (first > capacity) {
    Kokkos::resize(indices, first);
    Kokkos::resize(values, first);
    count = compact(indices, values);
  }
  write_raw(dir + "/" + name + "_indices.bin", to_host(indices, count));
  write_raw(dir + "/" + name + "_values.bin", to_host(values, count));
  return {{"count", count}, {"first_attempt_count", first}};
}

nlohmann::json histogram_json(const pulse::Log2Histogram& h) {
  return {{"k_min", h.range.k_min}, {"k_max", h.range.k_max}, {"bins", h.bins},
          {"zero", h.zero},         {"below", h.below},       {"above", h.above},
          {"non_finite", h.non_finite}};
}

void run_case(const std::string& dir) {
  std::ifstream params_file(dir + "/params.json");
  PULSE_CHECK(params_file.good(), "cannot open " + dir + "/params.json");
  const auto params = nlohmann::json::parse(params_file);
  const std::size_t n = params.at("n");
  const index_t capacity = params.at("capacity");
  const pulse::DefaultExec space;
  nlohmann::json result;

  // Changed elements between two BF16 snapshots.
  const auto old_bits = to_device(read_raw<pulse::bf16_bits>(dir + "/old.bin", n));
  const auto new_bits = to_device(read_raw<pulse::bf16_bits>(dir + "/new.bin", n));
  result["changed"] = pulse::count_changed(space, old_bits, new_bits);
  const auto segments = pulse::make_segments(params.at("offsets").get<std::vector<index_t>>(),
                                             params.at("max_segment_length").get<index_t>());
  const auto per_tensor = pulse::count_changed(space, segments, old_bits, new_bits);
  result["per_tensor"] = per_tensor.per_tensor;
  result["per_tensor_total"] = per_tensor.total;
  result["compact"] = compact_with_retry<pulse::bf16_bits>(
      capacity,
      [&](const auto& indices, const auto& values) {
        return pulse::compact_changed(space, old_bits, new_bits, indices, values);
      },
      dir, "changed");

  // k-step counts: compare each snapshot with the ring, then push it.
  const std::size_t num_snapshots = params.at("num_snapshots");
  const auto history = read_raw<pulse::bf16_bits>(dir + "/history.bin", num_snapshots * n);
  pulse::SnapshotRing<> ring(params.at("depth").get<int>(), static_cast<index_t>(n));
  const auto ks = params.at("ks").get<std::vector<int>>();
  result["kstep"] = nlohmann::json::array();
  for (std::size_t t = 0; t < num_snapshots; ++t) {
    const auto snapshot = to_device(std::vector<pulse::bf16_bits>(history.begin() + t * n, history.begin() + (t + 1) * n));
    result["kstep"].push_back(ring.count_changed_k(space, snapshot, ks));
    ring.push(space, snapshot);
  }

  // Gradient thresholds.
  const auto grad = to_device(read_raw<float>(dir + "/grad.bin", n));
  result["small"] = pulse::count_small(space, grad, params.at("taus").get<std::vector<float>>());

  // Absorption.
  const auto weights = to_device(read_raw<float>(dir + "/weights.bin", n));
  const auto updates = to_device(read_raw<float>(dir + "/updates.bin", n));
  const auto ratio_range = params.at("ratio_range").get<std::vector<int>>();
  const auto stats = pulse::absorption_stats(space, weights, updates, {ratio_range.at(0), ratio_range.at(1)});
  result["absorption"] = {{"ratio", histogram_json(stats.ratio)},
                          {"weight", histogram_json(stats.weight)},
                          {"absorbed", stats.absorbed}};

  // Gate.
  const auto theta = to_device(read_raw<float>(dir + "/theta.bin", n));
  const auto s = to_device(read_raw<float>(dir + "/s.bin", n));
  Kokkos::View<std::uint8_t*> mask("mask", n);
  result["fired"] = pulse::gate_mask(space, theta, s, mask);
  write_raw(dir + "/mask.bin", to_host(mask, n));
  result["compact_fired"] = compact_with_retry<float>(
      capacity,
      [&](const auto& indices, const auto& values) { return pulse::compact_fired(space, theta, s, indices, values); },
      dir, "fired");

  std::ofstream out(dir + "/result.json");
  out << result.dump();
  PULSE_CHECK(out.good(), "cannot write " + dir + "/result.json");
}

}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  if (argc != 2) {
    std::cerr << "usage: sparsity_driver <case directory>\n";
    return 2;
  }
  try {
    run_case(argv[1]);
  } catch (const std::exception& e) {
    std::cerr << "sparsity_driver: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
