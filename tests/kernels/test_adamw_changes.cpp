// AdamW writing the changed list in its own pass (kernels/adamw.hpp, ChangeStaging): the state
// after the step and the list gathered from the staging are bit-identical to the plain step
// followed by the separate diff and compaction (compact_changed), for mixed and pure BF16, over
// several steps, with segments split inside tensors and the capacity contract exercised.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/adamw.hpp"
#include "kernels/host_copy.hpp"
#include "kernels/sparsity.hpp"
#include "support/backends.hpp"

using namespace pulse;

namespace {

// An odd mix of tensor sizes, split into segments of 1000 (so most tensors span several).
const std::vector<index_t> offsets = {0, 7, 7, 2500, 2501, 9000, 40000};
constexpr index_t segment_length = 1000;

std::vector<float> normal(index_t n, float scale, std::mt19937_64& rng) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> x(n);
  for (auto& v : x) v = d(rng);
  return x;
}

template <class View>
bool same_bits(const View& a, const View& b) {
  const auto x = to_host(a), y = to_host(b);
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0;
}

template <class View>
View copy_of(const View& v) {
  View c("copy", v.extent(0));
  Kokkos::deep_copy(c, v);
  return c;
}

using List = std::pair<std::vector<index_t>, std::vector<bf16_bits>>;

// The reference list: compact_changed between two BF16 versions.
template <class Space, class Mem>
List reference_list(const Space& space, const Kokkos::View<bf16_bits*, Mem>& before,
                    const Kokkos::View<bf16_bits*, Mem>& after) {
  const index_t n = before.extent(0);
  Kokkos::View<index_t*, Mem> idx("idx", n);
  Kokkos::View<bf16_bits*, Mem> val("val", n);
  const index_t count = compact_changed(space, before, after, idx, val);
  std::vector<index_t> i = to_host(idx);
  std::vector<bf16_bits> v = to_host(val);
  i.resize(count), v.resize(count);
  return {i, v};
}

// Gathers with too small an output first (the true count comes back, a prefix is written), then
// with room for all.
template <class Space, class Mem>
List gathered_list(const Space& space, const TensorSegments<Mem>& segs, const ChangeStaging<Mem>& staging,
                   const std::vector<index_t>& expected_prefix) {
  const index_t small = index_t(expected_prefix.size() / 2);
  Kokkos::View<index_t*, Mem> idx("idx", small);
  Kokkos::View<bf16_bits*, Mem> val("val", small);
  const index_t count = gather_changes(space, segs, staging, idx, val);
  EXPECT_EQ(count, index_t(expected_prefix.size()));
  const auto prefix = to_host(idx);
  EXPECT_EQ(prefix, std::vector<index_t>(expected_prefix.begin(), expected_prefix.begin() + small));
  Kokkos::View<index_t*, Mem> all_idx("idx", count);
  Kokkos::View<bf16_bits*, Mem> all_val("val", count);
  EXPECT_EQ(gather_changes(space, segs, staging, all_idx, all_val), count);
  return {to_host(all_idx), to_host(all_val)};
}

// The whole gathered list: the count first (from outputs of capacity 0), then the entries.
template <class Space, class Mem>
List all_changes(const Space& space, const TensorSegments<Mem>& segs, const ChangeStaging<Mem>& staging) {
  const index_t count = gather_changes(space, segs, staging, Kokkos::View<index_t*, Mem>("idx", 0),
                                       Kokkos::View<bf16_bits*, Mem>("val", 0));
  Kokkos::View<index_t*, Mem> idx("idx", count);
  Kokkos::View<bf16_bits*, Mem> val("val", count);
  EXPECT_EQ(gather_changes(space, segs, staging, idx, val), count);
  return {to_host(idx), to_host(val)};
}

// What every test steps, in Space's memory: the segments with their staging, a decay mask, an FP32
// master (its first draw from rng) with zero moments and its BF16 copy (mixed), and the master's
// BF16 cast with zero moments (pure BF16).
template <class Space, class Mem = typename Space::memory_space>
struct StepState {
  StepState(const Space& space, std::uint64_t seed, const std::vector<std::uint8_t>& decay)
      : rng(seed), segs(make_segments<Mem>(offsets, segment_length)), staging(make_change_staging(segs)),
        mask(to_device<Mem>(decay)), master(to_device<Mem>(normal(offsets.back(), 0.02f, rng))), m("m", n),
        v("v", n), bf16("bf16", n), w("w", n), m16("m16", n), v16("v16", n) {
    cast_to_bf16(space, master, bf16);
    cast_to_bf16(space, master, w);
  }
  const index_t n = offsets.back();
  std::mt19937_64 rng;
  TensorSegments<Mem> segs;
  ChangeStaging<Mem> staging;
  Kokkos::View<std::uint8_t*, Mem> mask;
  Kokkos::View<float*, Mem> master, m, v;
  Kokkos::View<bf16_bits*, Mem> bf16, w, m16, v16;
};

template <class B>
using AdamWChanges = test::OnBackend<B>;
TYPED_TEST_SUITE(AdamWChanges, test::BackendTypes, test::BackendNames);

}  // namespace

TYPED_TEST(AdamWChanges, MixedListEqualsSeparateCompaction) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  StepState x(space, 11, {1, 0, 1, 0, 1, 1});
  auto ref_master = copy_of(x.master), ref_m = copy_of(x.m), ref_v = copy_of(x.v);
  auto ref_bf16 = copy_of(x.bf16);
  AdamWHyper h;
  h.lr = 1e-4, h.weight_decay = 0.1;
  for (int t = 1; t <= 4; ++t) {
    const auto grad = to_device<Mem>(normal(x.n, t == 3 ? 0.0f : 1e-3f, x.rng));  // step 3: zero gradient
    const auto s = adamw_scalars(h, t, 0.7f, Precision::mixed);
    const auto before = copy_of(ref_bf16);
    const index_t counted = adamw_mixed(space, x.segs, x.mask, s, ref_master, grad, ref_m, ref_v, ref_bf16, true);
    const auto expected = reference_list(space, before, ref_bf16);
    ASSERT_EQ(counted, index_t(expected.first.size()));
    adamw_mixed(space, x.segs, x.mask, s, x.master, grad, x.m, x.v, x.bf16, x.staging);
    EXPECT_TRUE(same_bits(x.master, ref_master) && same_bits(x.m, ref_m) && same_bits(x.v, ref_v) &&
                same_bits(x.bf16, ref_bf16))
        << "step " << t;
    const auto got = gathered_list(space, x.segs, x.staging, expected.first);
    EXPECT_EQ(got.first, expected.first) << "step " << t;
    EXPECT_EQ(got.second, expected.second) << "step " << t;
    EXPECT_GT(expected.first.size(), 0u);
    EXPECT_LT(expected.first.size(), std::size_t(x.n));
  }
}

// Three bf16 steps of x, staged, against the plain pass (weights, moments, count) and a separate
// compaction of the changed weights (list); returns each step's number of changes.
template <class Space, class Mem>
std::vector<std::size_t> expect_bf16_list_of_separate_compaction(const Space& space, StepState<Space, Mem>& x,
                                                                 const AdamWHyper& h) {
  auto ref_w = copy_of(x.w), ref_m = copy_of(x.m16), ref_v = copy_of(x.v16);
  std::vector<std::size_t> changes;
  for (int t = 1; t <= 3; ++t) {
    Kokkos::View<bf16_bits*, Mem> grad("g", x.n);
    cast_to_bf16(space, to_device<Mem>(normal(x.n, 1e-3f, x.rng)), grad);
    const auto s = adamw_scalars(h, t, 1.0f, Precision::bf16);
    const auto before = copy_of(ref_w);
    const index_t counted = adamw_bf16(space, x.segs, x.mask, s, ref_w, grad, ref_m, ref_v);
    const auto expected = reference_list(space, before, ref_w);
    EXPECT_EQ(counted, index_t(expected.first.size())) << "step " << t;
    adamw_bf16(space, x.segs, x.mask, s, x.w, grad, x.m16, x.v16, x.staging);
    EXPECT_TRUE(same_bits(x.w, ref_w) && same_bits(x.m16, ref_m) && same_bits(x.v16, ref_v)) << "step " << t;
    const auto got = gathered_list(space, x.segs, x.staging, expected.first);
    EXPECT_EQ(got.first, expected.first) << "step " << t;
    EXPECT_EQ(got.second, expected.second) << "step " << t;
    changes.push_back(expected.first.size());
  }
  return changes;
}

TYPED_TEST(AdamWChanges, Bf16ListEqualsSeparateCompaction) {
  const typename TypeParam::ExecSpace space;
  StepState x(space, 12, {0, 1, 1, 1, 0, 1});
  AdamWHyper h;
  h.lr = 1e-4, h.weight_decay = 0.01;
  for (const std::size_t changes : expect_bf16_list_of_separate_compaction(space, x, h)) EXPECT_GT(changes, 0u);
}

// At an RL learning rate few weights change (a few percent at these weights, as in a run): the
// host path's blocks then hold mostly empty groups of flags and a few changes each, where the test
// above changes most weights.
TYPED_TEST(AdamWChanges, Bf16SparseListEqualsSeparateCompaction) {
  const typename TypeParam::ExecSpace space;
  StepState x(space, 14, {1, 1, 0, 1, 0, 1});
  AdamWHyper h;
  h.lr = 3e-6;
  for (const std::size_t changes : expect_bf16_list_of_separate_compaction(space, x, h)) {
    EXPECT_GT(changes, 0u);
    EXPECT_LT(changes, std::size_t(x.n / 10));
  }
}

// The staged steps and the gathered lists on every backend: the host code path (blocks of change
// flags) and the device one (a team scan per segment) on each execution space give the same bits.
TEST(AdamWChanges, EveryBackendGivesTheSameBits) {
  test::expect_same_outputs(test::on_every_backend([](auto backend) {
    using Mem = typename decltype(backend)::Mem;
    const typename decltype(backend)::ExecSpace space;
    StepState x(space, 13, {1, 0, 1, 0, 1, 1});
    AdamWHyper h;
    h.lr = 1e-4, h.weight_decay = 0.1;
    test::Outputs out;
    for (int t = 1; t <= 2; ++t) {
      const auto grad = to_device<Mem>(normal(x.n, 1e-3f, x.rng));
      Kokkos::View<bf16_bits*, Mem> grad16("g", x.n);
      cast_to_bf16(space, grad, grad16);
      adamw_mixed(space, x.segs, x.mask, adamw_scalars(h, t, 0.7f, Precision::mixed), x.master, grad, x.m, x.v,
                  x.bf16, x.staging);
      const auto mixed = all_changes(space, x.segs, x.staging);
      adamw_bf16(space, x.segs, x.mask, adamw_scalars(h, t, 1.0f, Precision::bf16), x.w, grad16, x.m16, x.v16,
                 x.staging);
      const auto pure = all_changes(space, x.segs, x.staging);
      const std::string step = std::to_string(t);
      out["mixed.indices." + step] = test::bytes_of(mixed.first);
      out["mixed.values." + step] = test::bytes_of(mixed.second);
      out["bf16.indices." + step] = test::bytes_of(pure.first);
      out["bf16.values." + step] = test::bytes_of(pure.second);
      EXPECT_GT(mixed.first.size(), 0u);
      EXPECT_GT(pure.first.size(), 0u);
    }
    out["mixed.master"] = test::bytes_of(to_host(x.master));
    out["mixed.m"] = test::bytes_of(to_host(x.m)), out["mixed.v"] = test::bytes_of(to_host(x.v));
    out["mixed.bf16"] = test::bytes_of(to_host(x.bf16));
    out["bf16.w"] = test::bytes_of(to_host(x.w));
    out["bf16.m"] = test::bytes_of(to_host(x.m16)), out["bf16.v"] = test::bytes_of(to_host(x.v16));
    return out;
  }));
}

TYPED_TEST(AdamWChanges, StagingMustMatchTheSegments) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  const auto segs = make_segments<Mem>(offsets, segment_length);
  const auto other = make_change_staging(make_segments<Mem>(std::vector<index_t>{0, 10}));
  const index_t n = offsets.back();
  Kokkos::View<float*, Mem> master("w", n), grad("g", n), m("m", n), v("v", n);
  Kokkos::View<bf16_bits*, Mem> bf16("b", n);
  const auto mask = to_device<Mem>(std::vector<std::uint8_t>(6, 0));
  EXPECT_THROW(adamw_mixed(space, segs, mask, adamw_scalars({}, 1, 1.0f, Precision::mixed), master, grad, m, v, bf16,
                           other),
               Error);
}
