// Sparsity kernels against naive host loops: change counts (total and per tensor), compaction
// with its capacity contract, the k-step snapshot ring and gradient thresholds, on random and
// adversarial inputs (+0/-0 flips, NaN payloads, empty and odd-sized buffers, tiny segments).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/sparsity.hpp"
#include "kernels/host_copy.hpp"
#include "support/backends.hpp"

namespace {

using pulse::bf16_bits;
using pulse::index_t;
using Bits = std::vector<bf16_bits>;

const std::vector<index_t> odd_sizes = {0, 1, 7, 33, 1000003};

// A pair of snapshots (old, new) of one kind.
enum class Kind { random, all_changed, none_changed, signed_zero_flips, nan_payloads };

std::pair<Bits, Bits> make_pair(Kind kind, index_t n, std::mt19937_64& rng) {
  Bits old_bits(n), new_bits(n);
  std::uniform_int_distribution<int> any(0, 0xFFFF);
  std::bernoulli_distribution flip(0.02);
  for (index_t i = 0; i < n; ++i) {
    old_bits[i] = static_cast<bf16_bits>(any(rng));
    switch (kind) {
      case Kind::random:
        new_bits[i] = flip(rng) ? static_cast<bf16_bits>(any(rng)) : old_bits[i];
        break;
      case Kind::all_changed:
        new_bits[i] = static_cast<bf16_bits>(old_bits[i] ^ (1u << (i % 16)));
        break;
      case Kind::none_changed:
        new_bits[i] = old_bits[i];
        break;
      case Kind::signed_zero_flips:  // +0 <-> -0 on every third element, equal zeros elsewhere
        old_bits[i] = (i % 2) ? 0x8000 : 0x0000;
        new_bits[i] = (i % 3 == 0) ? static_cast<bf16_bits>(old_bits[i] ^ 0x8000) : old_bits[i];
        break;
      case Kind::nan_payloads:  // NaNs whose payload or sign changes on odd elements
        old_bits[i] = static_cast<bf16_bits>(0x7FC0 | (i & 0x3F));
        new_bits[i] = (i % 2) ? static_cast<bf16_bits>(old_bits[i] ^ (i % 4 == 1 ? 0x0001 : 0x8000)) : old_bits[i];
        break;
    }
  }
  return {old_bits, new_bits};
}

const std::vector<Kind> all_kinds = {Kind::random, Kind::all_changed, Kind::none_changed, Kind::signed_zero_flips,
                                     Kind::nan_payloads};

index_t naive_count(const Bits& a, const Bits& b) {
  index_t c = 0;
  for (std::size_t i = 0; i < a.size(); ++i) c += a[i] != b[i];
  return c;
}

template <class B>
using CountChanged = pulse::test::OnBackend<B>;
TYPED_TEST_SUITE(CountChanged, pulse::test::BackendTypes, pulse::test::BackendNames);

TYPED_TEST(CountChanged, HandDerived) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  // +0 -> -0, NaN payload 0x7FC1 -> 0x7FC0, equal 1.0, equal -inf, 1.0 -> next value up.
  const auto old_bits = pulse::to_device<Mem>(Bits{0x0000, 0x7FC1, 0x3F80, 0xFF80, 0x3F80});
  const auto new_bits = pulse::to_device<Mem>(Bits{0x8000, 0x7FC0, 0x3F80, 0xFF80, 0x3F81});
  EXPECT_EQ(pulse::count_changed(space, old_bits, new_bits), 3);
}

TYPED_TEST(CountChanged, MatchesNaiveLoop) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  std::mt19937_64 rng(1);
  for (const index_t n : odd_sizes)
    for (const Kind kind : all_kinds) {
      const auto [a, b] = make_pair(kind, n, rng);
      const index_t expected = naive_count(a, b);
      EXPECT_EQ(pulse::count_changed(space, pulse::to_device<Mem>(a), pulse::to_device<Mem>(b)), expected)
          << "n " << n << " kind " << int(kind);
      if (kind == Kind::all_changed) {
        EXPECT_EQ(expected, n);
      }
      if (kind == Kind::none_changed) {
        EXPECT_EQ(expected, 0);
      }
    }
}

TYPED_TEST(CountChanged, RejectsLengthMismatch) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  EXPECT_THROW(pulse::count_changed(space, Kokkos::View<bf16_bits*, Mem>("a", 3),
                                    Kokkos::View<bf16_bits*, Mem>("b", 4)),
               pulse::Error);
}

template <class B>
using CountChangedPerTensor = pulse::test::OnBackend<B>;
TYPED_TEST_SUITE(CountChangedPerTensor, pulse::test::BackendTypes, pulse::test::BackendNames);

TYPED_TEST(CountChangedPerTensor, MatchesNaiveLoopAcrossSegmentBoundaries) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  std::mt19937_64 rng(2);
  // Tensor sizes with empty and one-element tensors, sizes off any vector width.
  const std::vector<index_t> sizes = {0, 1, 7, 0, 33, 1, 100003, 0, 2, 64, 65};
  std::vector<index_t> offsets = {0};
  for (const index_t s : sizes) offsets.push_back(offsets.back() + s);
  const index_t n = offsets.back();
  for (const index_t max_length : {index_t(1), index_t(3), index_t(64), pulse::default_segment_length})
    for (const Kind kind : all_kinds) {
      const auto segments = pulse::make_segments<Mem>(offsets, max_length);
      const auto [a, b] = make_pair(kind, n, rng);
      const auto counts = pulse::count_changed(space, segments, pulse::to_device<Mem>(a), pulse::to_device<Mem>(b));
      ASSERT_EQ(counts.per_tensor.size(), sizes.size());
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        const Bits ta(a.begin() + offsets[t], a.begin() + offsets[t + 1]);
        const Bits tb(b.begin() + offsets[t], b.begin() + offsets[t + 1]);
        EXPECT_EQ(counts.per_tensor[t], naive_count(ta, tb))
            << "tensor " << t << " max_length " << max_length << " kind " << int(kind);
      }
      EXPECT_EQ(counts.total, naive_count(a, b));
    }
}

TYPED_TEST(CountChangedPerTensor, EmptyBufferAndMismatch) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  const auto empty = pulse::make_segments<Mem>(std::vector<index_t>{0, 0, 0});
  const Kokkos::View<bf16_bits*, Mem> none("none", 0);
  const auto counts = pulse::count_changed(space, empty, none, none);
  EXPECT_EQ(counts.total, 0);
  EXPECT_EQ(counts.per_tensor, (std::vector<index_t>{0, 0}));
  const Kokkos::View<bf16_bits*, Mem> five("five", 5);
  EXPECT_THROW(pulse::count_changed(space, pulse::make_segments<Mem>(4), five, five), pulse::Error);
}

// Runs compact_changed with a given capacity and checks the contract: true count returned, the
// first min(count, capacity) entries are the sorted changed indices and new bits, and nothing
// beyond them is written.
template <class Space, class Mem = typename Space::memory_space>
void check_compaction(const Space& space, const Bits& a, const Bits& b, index_t capacity) {
  std::vector<index_t> expected_indices;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) expected_indices.push_back(static_cast<index_t>(i));
  const index_t sentinel_index = -7;
  const bf16_bits sentinel_value = 0xABCD;
  const auto indices = pulse::to_device<Mem>(std::vector<index_t>(capacity, sentinel_index));
  const auto values = pulse::to_device<Mem>(std::vector<bf16_bits>(capacity, sentinel_value));
  const index_t count = pulse::compact_changed(space, pulse::to_device<Mem>(a), pulse::to_device<Mem>(b), indices, values);
  ASSERT_EQ(count, static_cast<index_t>(expected_indices.size())) << "capacity " << capacity;
  const auto got_indices = pulse::to_host(indices);
  const auto got_values = pulse::to_host(values);
  for (index_t j = 0; j < capacity; ++j) {
    if (j < count) {
      ASSERT_EQ(got_indices[j], expected_indices[j]) << "entry " << j << " capacity " << capacity;
      ASSERT_EQ(got_values[j], b[expected_indices[j]]) << "entry " << j;
    } else {
      ASSERT_EQ(got_indices[j], sentinel_index) << "entry " << j << " written beyond the count";
      ASSERT_EQ(got_values[j], sentinel_value) << "entry " << j << " written beyond the count";
    }
  }
}

template <class B>
using CompactChanged = pulse::test::OnBackend<B>;
TYPED_TEST_SUITE(CompactChanged, pulse::test::BackendTypes, pulse::test::BackendNames);

TYPED_TEST(CompactChanged, MatchesNaiveLoopAtEveryCapacity) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  std::mt19937_64 rng(3);
  for (const index_t n : odd_sizes)
    for (const Kind kind : all_kinds) {
      const auto [a, b] = make_pair(kind, n, rng);
      const index_t count = naive_count(a, b);
      for (const index_t capacity : {index_t(0), index_t(1), count / 2, count, count + 5})
        if (capacity >= 0) check_compaction(space, a, b, capacity);
    }
}

TYPED_TEST(CompactChanged, GrowAndRetryReachesEveryChange) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  std::mt19937_64 rng(4);
  const auto [a, b] = make_pair(Kind::random, 33333, rng);
  const auto old_bits = pulse::to_device<Mem>(a), new_bits = pulse::to_device<Mem>(b);
  Kokkos::View<index_t*, Mem> indices("indices", 10);
  Kokkos::View<bf16_bits*, Mem> values("values", 10);
  index_t count = pulse::compact_changed(space, old_bits, new_bits, indices, values);
  ASSERT_GT(count, 10);
  Kokkos::resize(indices, count);
  Kokkos::resize(values, count);
  EXPECT_EQ(pulse::compact_changed(space, old_bits, new_bits, indices, values), count);
  const auto got = pulse::to_host(values);
  const auto got_indices = pulse::to_host(indices);
  for (index_t j = 0; j < count; ++j) ASSERT_EQ(got[j], b[got_indices[j]]);
  EXPECT_EQ(count, naive_count(a, b));
}

TYPED_TEST(CompactChanged, RejectsUnequalOutputCapacities) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  const Kokkos::View<bf16_bits*, Mem> x("x", 4);
  EXPECT_THROW(pulse::compact_changed(space, x, x, Kokkos::View<index_t*, Mem>("i", 3),
                                      Kokkos::View<bf16_bits*, Mem>("v", 2)),
               pulse::Error);
}

template <class B>
using SnapshotRing = pulse::test::OnBackend<B>;
TYPED_TEST_SUITE(SnapshotRing, pulse::test::BackendTypes, pulse::test::BackendNames);

TYPED_TEST(SnapshotRing, KStepCountsMatchNaiveHistoryThroughWrapAround) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  std::mt19937_64 rng(5);
  for (const index_t n : {index_t(1), index_t(33), index_t(10007)}) {
    const int depth = 4;
    pulse::SnapshotRing<Mem> ring(depth, n);
    const std::vector<int> ks = {1, 2, 3, 4, 5, 8, 2};
    std::vector<Bits> history;  // every snapshot ever pushed
    Bits current = make_pair(Kind::random, n, rng).first;
    for (int step = 0; step < 11; ++step) {
      // Change a few elements each step, including a +0/-0 flip and a NaN payload change.
      Bits next = make_pair(Kind::random, n, rng).second;
      for (index_t i = 0; i < n; ++i) next[i] = (rng() % 10 == 0) ? next[i] : current[i];
      next[0] = step % 2 ? 0x8000 : 0x0000;
      if (n > 1) next[n - 1] = static_cast<bf16_bits>(0x7FC0 | (step % 3));
      current = next;

      const auto counts = ring.count_changed_k(space, pulse::to_device<Mem>(current), ks);
      ASSERT_EQ(counts.size(), ks.size());
      for (std::size_t j = 0; j < ks.size(); ++j) {
        const int k = ks[j];
        const bool held = k <= std::min<int>(history.size(), depth);
        const index_t expected = held ? naive_count(history[history.size() - k], current) : -1;
        EXPECT_EQ(counts[j], expected) << "n " << n << " step " << step << " k " << k;
      }
      ring.push(space, pulse::to_device<Mem>(current));
      history.push_back(current);
      EXPECT_EQ(ring.size(), std::min<int>(history.size(), depth));
      for (int k = 1; k <= ring.size(); ++k) ASSERT_EQ(pulse::to_host(ring.snapshot(k)), history[history.size() - k]);
    }
  }
}

// The fused pass against count_changed_k then push on a twin ring: the same counts and the same
// snapshots, from an empty ring (nothing to compare, only the push) through wrap-arounds where
// the row written is the row of k = depth that the pass compares with.
TYPED_TEST(SnapshotRing, CountAndPushInOnePassMatchesCountThenPush) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  std::mt19937_64 rng(9);
  for (const index_t n : {index_t(1), index_t(4097), index_t(3 * 4096 + 5)}) {
    const int depth = 4;
    pulse::SnapshotRing<Mem> fused(depth, n), reference(depth, n);
    for (const std::vector<int>& ks : {std::vector<int>{2, 4}, std::vector<int>{4, 1, 3, 9}}) {
      for (int step = 0; step < 9; ++step) {
        Bits current = reference.size() ? pulse::to_host(reference.snapshot(1)) : Bits(n, 0x3f80);
        for (index_t i = 0; i < n; ++i)
          if (rng() % 5 == 0) current[i] = static_cast<bf16_bits>(rng());
        const auto device_current = pulse::to_device<Mem>(current);
        const auto want = reference.count_changed_k(space, device_current, ks);
        reference.push(space, device_current);
        EXPECT_EQ(fused.count_changed_k_and_push(space, device_current, ks), want) << "n " << n << " step " << step;
        ASSERT_EQ(fused.size(), reference.size());
        for (int k = 1; k <= fused.size(); ++k)
          ASSERT_EQ(pulse::to_host(fused.snapshot(k)), pulse::to_host(reference.snapshot(k))) << "n " << n << " k " << k;
      }
    }
  }
}

// Host backends count a block of 4096 elements in 16 bits: whole blocks of changes must not wrap.
TYPED_TEST(SnapshotRing, CountsBlocksInWhichEveryElementChanged) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  const index_t n = 3 * 4096 + 5;
  pulse::SnapshotRing<Mem> ring(2, n);
  ring.push(space, pulse::to_device<Mem>(Bits(n, 0x3f80)));
  ring.push(space, pulse::to_device<Mem>(Bits(n, 0x3f81)));
  Bits current(n, 0x3f82);
  current[4096] = 0x3f81;  // equal to the newest snapshot only
  EXPECT_EQ(ring.count_changed_k(space, pulse::to_device<Mem>(current), {1, 2}),
            (std::vector<index_t>{n - 1, n}));
}

TYPED_TEST(SnapshotRing, RejectsBadArguments) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  EXPECT_THROW(pulse::SnapshotRing<Mem>(0, 5), pulse::Error);
  pulse::SnapshotRing<Mem> ring(2, 5);
  const Kokkos::View<bf16_bits*, Mem> x("x", 5), y("y", 6);
  EXPECT_THROW(ring.push(space, y), pulse::Error);
  EXPECT_THROW(ring.count_changed_k(space, x, {0}), pulse::Error);
  EXPECT_THROW(ring.snapshot(1), pulse::Error);
  EXPECT_EQ(ring.count_changed_k(space, x, {1, 2}), (std::vector<index_t>{-1, -1}));
}

float from_bits(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

template <class B>
using CountSmall = pulse::test::OnBackend<B>;
TYPED_TEST_SUITE(CountSmall, pulse::test::BackendTypes, pulse::test::BackendNames);

TYPED_TEST(CountSmall, HandDerived) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const auto grad = pulse::to_device<Mem>(std::vector<float>{0.0f, -0.0f, 1e-9f, -1e-8f, 2e-8f, -1e-4f, nan, -nan, inf, -inf, 1.0f,
                                    from_bits(0x00000001)});
  const auto counts = pulse::count_small(space, grad, {0.0f, 1e-8f, 1e-6f, 1e-4f, -1.0f, inf});
  // tau 0: the two zeros; 1e-8: + 1e-9, -1e-8, the subnormal; 1e-4: + 2e-8, -1e-4; inf: all but NaNs.
  EXPECT_EQ(counts, (std::vector<index_t>{2, 5, 6, 7, 0, 10}));
}

TYPED_TEST(CountSmall, MatchesNaiveLoop) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  std::mt19937_64 rng(6);
  const std::vector<float> taus = {0.0f, 1e-8f, 1e-6f, 1e-4f};
  std::uniform_real_distribution<double> log_mag(-40, 2);
  for (const index_t n : odd_sizes) {
    std::vector<float> grad(n);
    for (index_t i = 0; i < n; ++i) {
      switch (rng() % 8) {
        case 0: grad[i] = (rng() % 2) ? 0.0f : -0.0f; break;
        case 1: grad[i] = from_bits(0x7FC00000u | static_cast<std::uint32_t>(rng() & 0x803FFFFFu)); break;  // NaNs
        case 2: grad[i] = taus[rng() % taus.size()] * ((rng() % 2) ? 1.0f : -1.0f); break;  // exactly at tau
        case 3: grad[i] = from_bits(static_cast<std::uint32_t>(rng() & 0x807FFFFFu)); break;  // subnormals
        default: grad[i] = static_cast<float>(std::pow(10.0, log_mag(rng))) * ((rng() % 2) ? 1.0f : -1.0f);
      }
    }
    std::vector<index_t> expected(taus.size(), 0);
    for (const float g : grad)
      for (std::size_t j = 0; j < taus.size(); ++j) expected[j] += std::fabs(g) <= taus[j];
    EXPECT_EQ(pulse::count_small(space, pulse::to_device<Mem>(grad), taus), expected) << "n " << n;
  }
  EXPECT_TRUE(pulse::count_small(space, pulse::to_device<Mem>(std::vector<float>{1.0f}), {}).empty());
}

// Host backends count a block of 4096 elements in 16 bits: whole blocks of small gradients must not wrap.
TYPED_TEST(CountSmall, CountsBlocksInWhichEveryGradientIsSmall) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  const index_t n = 2 * 4096 + 3;
  std::vector<float> grad(n, -0.0f);
  grad[n - 1] = 1.0f;
  EXPECT_EQ(pulse::count_small(space, pulse::to_device<Mem>(grad), {0.0f, 2.0f}),
            (std::vector<index_t>{n - 1, n}));
}

// Every kernel here on every backend, on the host code paths (blocked loops, flag words) and on
// the device ones (team reductions, element-wise scans): the same counts, and the same bits in
// and beyond the compacted entries.
TEST(Sparsity, EveryBackendGivesTheSameBits) {
  using pulse::test::bytes_of;
  pulse::test::expect_same_outputs(pulse::test::on_every_backend([](auto backend) {
    using Mem = typename decltype(backend)::Mem;
    const typename decltype(backend)::ExecSpace space;
    std::mt19937_64 rng(7);
    pulse::test::Outputs out;
    const index_t n = 100003;
    const std::vector<index_t> offsets = {0, 5, 5, 40000, 40001, n};
    for (const Kind kind : {Kind::random, Kind::nan_payloads, Kind::signed_zero_flips}) {
      const std::string name = std::to_string(int(kind));
      const auto [a, b] = make_pair(kind, n, rng);
      const auto old_bits = pulse::to_device<Mem>(a), new_bits = pulse::to_device<Mem>(b);
      const index_t count = pulse::count_changed(space, old_bits, new_bits);
      out["count." + name] = bytes_of(std::vector<index_t>{count});
      for (const index_t max_length : {index_t(64), pulse::default_segment_length})
        out["per_tensor." + name + "." + std::to_string(max_length)] = bytes_of(
            pulse::count_changed(space, pulse::make_segments<Mem>(offsets, max_length), old_bits, new_bits)
                .per_tensor);
      for (const index_t capacity : {count / 2, count + 5}) {
        const auto indices = pulse::to_device<Mem>(std::vector<index_t>(capacity, -7));
        const auto values = pulse::to_device<Mem>(std::vector<bf16_bits>(capacity, 0xABCD));
        EXPECT_EQ(pulse::compact_changed(space, old_bits, new_bits, indices, values), count);
        const std::string at = name + "." + std::to_string(capacity);
        out["compact.indices." + at] = bytes_of(pulse::to_host(indices));
        out["compact.values." + at] = bytes_of(pulse::to_host(values));
      }
    }
    pulse::SnapshotRing<Mem> ring(3, n);
    for (int step = 0; step < 5; ++step) {
      const auto current = pulse::to_device<Mem>(make_pair(Kind::random, n, rng).second);
      out["count_k." + std::to_string(step)] = bytes_of(ring.count_changed_k(space, current, {1, 2, 3}));
      ring.push(space, current);
    }
    std::vector<float> grad(n);
    std::uniform_real_distribution<double> log_mag(-12, 0);
    for (auto& g : grad) g = static_cast<float>(std::pow(10.0, log_mag(rng))) * ((rng() % 2) ? 1.0f : -1.0f);
    out["count_small"] = bytes_of(pulse::count_small(space, pulse::to_device<Mem>(grad), {0.0f, 1e-8f, 1e-4f}));
    return out;
  }));
}

}  // namespace
