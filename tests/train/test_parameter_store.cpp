// ParameterStore (src/train/parameter_store.hpp): a step equals the gradient norm, clipping and
// AdamW kernels called directly on the same buffers (bit for bit, with and without the changed
// list), for mixed precision and pure BF16; the checkpointed buffers are listed by name in
// checkpoint order.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "kernels/adamw.hpp"
#include "kernels/grad_norm.hpp"
#include "kernels/host_copy.hpp"
#include "train/parameter_store.hpp"

using namespace pulse;

namespace {

// A hand-made table: decayed matrices and undecayed biases and norms of odd sizes.
TensorTable small_table() {
  TensorTable t;
  t.add("embed.weight", {13, 7});
  t.add("norm.weight", {7}, false);
  t.add("fc.weight", {7, 29});
  t.add("fc.bias", {29}, false);
  return t;
}

std::vector<float> normal(std::size_t n, float scale, std::mt19937_64& rng) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> x(n);
  for (auto& v : x) v = d(rng);
  return x;
}

template <class T>
std::vector<std::uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<std::uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// name -> host bytes of every buffer the store lists, in its order.
std::vector<std::pair<std::string, std::vector<std::uint8_t>>> state_of(const ParameterStore& store) {
  std::vector<std::pair<std::string, std::vector<std::uint8_t>>> out;
  store.for_each_state_buffer([&](const std::string& name, const auto& view) { out.push_back({name, bytes_of(to_host(view))}); });
  return out;
}

std::vector<std::string> names_of(const ParameterStore& store) {
  std::vector<std::string> names;
  for (const auto& [name, bytes] : state_of(store)) names.push_back(name);
  return names;
}

// The staged list, gathered by the kernel itself (what ChangeCompactor::gather calls).
std::vector<index_t> staged_indices(const ParameterStore& store) {
  const index_t n = store.segments().num_elements;
  Kokkos::View<index_t*> idx("idx", n);
  Kokkos::View<bf16_bits*> val("val", n);
  const index_t count = gather_changes(DefaultExec(), store.segments(), store.staging(), idx, val);
  std::vector<index_t> i = to_host(idx);
  i.resize(count);
  return i;
}

AdamWHyper hyper() {
  AdamWHyper h;
  h.lr = 1e-3, h.weight_decay = 0.1;
  return h;
}

}  // namespace

TEST(ParameterStore, ListsTheCheckpointedBuffersOfEachPrecision) {
  const TensorTable table = small_table();
  const std::vector<float> initial(table.num_elements(), 0.5f);
  EXPECT_EQ(names_of(ParameterStore(table, Precision::mixed, initial, false)),
            (std::vector<std::string>{"master", "adam_m", "adam_v", "weights"}));
  EXPECT_EQ(names_of(ParameterStore(table, Precision::bf16, initial, false)),
            (std::vector<std::string>{"adam_m", "adam_v", "weights"}));
}

TEST(ParameterStore, MixedStepEqualsTheKernels) {
  std::mt19937_64 rng(5);
  const TensorTable table = small_table();
  const index_t n = table.num_elements();
  const std::vector<float> initial = normal(n, 0.02f, rng);
  ParameterStore listing(table, Precision::mixed, initial, true), plain(table, Precision::mixed, initial, false);
  // The reference: the same kernels on buffers of our own.
  const auto segs = make_segments(table.offsets());
  const auto mask = to_device(table.weight_decay_mask());
  Kokkos::View<float*> master = to_device(initial), m("m", n), v("v", n);
  Kokkos::View<bf16_bits*> weights("w", n);
  cast_to_bf16(DefaultExec(), master, weights);
  const double grad_clip = 0.05;
  for (int t = 1; t <= 3; ++t) {
    const Kokkos::View<float*> grad = to_device(normal(n, 0.01f, rng));
    const std::vector<bf16_bits> before = to_host(weights);
    const float norm = grad_norm(DefaultExec(), segs, grad, Precision::mixed).total;
    const float clip = clip_coefficient(norm, grad_clip, Precision::mixed);
    ASSERT_LT(clip, 1.0f) << "the test should exercise clipping";
    adamw_mixed(DefaultExec(), segs, mask, adamw_scalars(hyper(), t, clip, Precision::mixed), master, grad, m, v,
                weights, false);
    EXPECT_EQ(listing.step(t, grad, hyper(), grad_clip, true), norm);
    EXPECT_EQ(plain.step(t, grad, hyper(), grad_clip, false), norm);
    const std::vector<std::pair<std::string, std::vector<std::uint8_t>>> expected = {
        {"master", bytes_of(to_host(master))}, {"adam_m", bytes_of(to_host(m))},
        {"adam_v", bytes_of(to_host(v))}, {"weights", bytes_of(to_host(weights))}};
    EXPECT_EQ(state_of(listing), expected) << "step " << t;
    EXPECT_EQ(state_of(plain), expected) << "step " << t;
    // The list names exactly the BF16 weights that changed.
    const std::vector<bf16_bits> after = to_host(weights);
    std::vector<index_t> changed;
    for (index_t i = 0; i < n; ++i)
      if (before[i] != after[i]) changed.push_back(i);
    EXPECT_FALSE(changed.empty());
    EXPECT_EQ(staged_indices(listing), changed) << "step " << t;
  }
}

TEST(ParameterStore, Bf16StepEqualsTheKernels) {
  std::mt19937_64 rng(6);
  const TensorTable table = small_table();
  const index_t n = table.num_elements();
  const std::vector<float> initial = normal(n, 0.02f, rng);
  ParameterStore store(table, Precision::bf16, initial, true);
  const auto segs = make_segments(table.offsets());
  const auto mask = to_device(table.weight_decay_mask());
  Kokkos::View<bf16_bits*> weights("w", n), m("m", n), v("v", n), grad16("g", n);
  cast_to_bf16(DefaultExec(), to_device(initial), weights);
  const double grad_clip = 0.05;
  for (int t = 1; t <= 3; ++t) {
    const Kokkos::View<float*> grad = to_device(normal(n, 0.01f, rng));
    const std::vector<bf16_bits> before = to_host(weights);
    cast_to_bf16(DefaultExec(), grad, grad16);
    const float norm = grad_norm(DefaultExec(), segs, grad16, Precision::bf16).total;
    const float clip = clip_coefficient(norm, grad_clip, Precision::bf16);
    ASSERT_LT(clip, 1.0f);
    adamw_bf16(DefaultExec(), segs, mask, adamw_scalars(hyper(), t, clip, Precision::bf16), weights, grad16, m, v);
    EXPECT_EQ(store.step(t, grad, hyper(), grad_clip, true), norm);
    const std::vector<std::pair<std::string, std::vector<std::uint8_t>>> expected = {
        {"adam_m", bytes_of(to_host(m))}, {"adam_v", bytes_of(to_host(v))}, {"weights", bytes_of(to_host(weights))}};
    EXPECT_EQ(state_of(store), expected) << "step " << t;
    const std::vector<bf16_bits> after = to_host(weights);
    std::vector<index_t> changed;
    for (index_t i = 0; i < n; ++i)
      if (before[i] != after[i]) changed.push_back(i);
    EXPECT_FALSE(changed.empty());
    EXPECT_EQ(staged_indices(store), changed) << "step " << t;
  }
}

TEST(ParameterStore, RejectsADivergedStepAndAListWithoutStaging) {
  const TensorTable table = small_table();
  const index_t n = table.num_elements();
  ParameterStore store(table, Precision::mixed, std::vector<float>(n, 0.5f), false);
  std::vector<float> g(n, 0.0f);
  EXPECT_THROW(store.step(1, to_device(g), hyper(), 1.0, true), Error);  // made without staging
  g[3] = std::nanf("");
  EXPECT_THROW(store.step(1, to_device(g), hyper(), 1.0, false), Error);
  EXPECT_THROW(ParameterStore(table, Precision::bf16, std::vector<float>(n - 1), false), Error);
}
