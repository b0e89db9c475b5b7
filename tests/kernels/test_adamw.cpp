// AdamW and gradient clipping: hand-derived cases and invariants (the bit-exact comparison with
// PyTorch is tests/oracle/test_adamw_torch.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/error.hpp"
#include "kernels/adamw.hpp"
#include "kernels/grad_norm.hpp"
#include "kernels/host_copy.hpp"
#include "support/backends.hpp"

using namespace pulse;

namespace {

template <class Mem>
struct MixedState {
  Kokkos::View<float*, Mem> master, grad, m, v;
  Kokkos::View<bf16_bits*, Mem> bf16;
};

template <class Space, class Mem = typename Space::memory_space>
MixedState<Mem> mixed_state(const Space& space, const std::vector<float>& w, const std::vector<float>& g) {
  MixedState<Mem> s{to_device<Mem>(w), to_device<Mem>(g), Kokkos::View<float*, Mem>("m", w.size()),
                    Kokkos::View<float*, Mem>("v", w.size()), Kokkos::View<bf16_bits*, Mem>("bf16", w.size())};
  cast_to_bf16(space, s.master, s.bf16);
  return s;
}

template <class B>
using AdamW = test::OnBackend<B>;
TYPED_TEST_SUITE(AdamW, test::BackendTypes, test::BackendNames);
template <class B>
using GradNorms = test::OnBackend<B>;
TYPED_TEST_SUITE(GradNorms, test::BackendTypes, test::BackendNames);

}  // namespace

TYPED_TEST(AdamW, FirstStepMovesEachWeightByAboutLr) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  // Step 1 from zero moments: m_hat = g, v_hat = g^2, so w -= lr * g / (|g| + eps).
  const std::vector<float> w{1.0f, -2.0f, 0.5f, 3.0f}, g{0.1f, -4.0f, 1e-3f, 0.0f};
  auto s = mixed_state(space, w, g);
  auto segs = make_segments<Mem>(4);
  auto mask = to_device<Mem>(std::vector<std::uint8_t>{0});
  AdamWHyper h;
  h.lr = 1e-2;
  adamw_mixed(space, segs, mask, adamw_scalars(h, 1, 1.0f, Precision::mixed), s.master, s.grad, s.m, s.v, s.bf16,
              false);
  const auto out = to_host(s.master);
  for (int i = 0; i < 4; ++i) {
    const double expected = w[i] - h.lr * g[i] / (std::fabs(double(g[i])) + h.eps);
    EXPECT_NEAR(out[i], expected, 2e-7 * std::fabs(expected)) << i;
  }
  EXPECT_EQ(out[3], 3.0f);  // zero gradient, no decay: untouched
}

TYPED_TEST(AdamW, WeightDecayFollowsThePerTensorMask) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  // Zero gradients: only decoupled decay acts, w *= 1 - lr*wd on decayed tensors.
  const std::vector<float> w{1.0f, 2.0f, 3.0f, 4.0f, 5.0f};
  auto s = mixed_state(space, w, std::vector<float>(5, 0.0f));
  auto segs = make_segments<Mem>(std::vector<index_t>{0, 2, 5});
  auto mask = to_device<Mem>(std::vector<std::uint8_t>{1, 0});
  AdamWHyper h;
  h.lr = 1e-2;
  h.weight_decay = 0.5;
  adamw_mixed(space, segs, mask, adamw_scalars(h, 1, 1.0f, Precision::mixed), s.master, s.grad, s.m, s.v, s.bf16,
              false);
  const auto out = to_host(s.master);
  const float decay = static_cast<float>(1.0 - 1e-2 * 0.5);
  EXPECT_EQ(out[0], 1.0f * decay);
  EXPECT_EQ(out[1], 2.0f * decay);
  for (int i = 2; i < 5; ++i) EXPECT_EQ(out[i], w[i]);
}

TYPED_TEST(AdamW, ChangedCountEqualsBitsThatChanged) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  const int n = 10007;
  std::vector<float> w(n), g(n);
  for (int i = 0; i < n; ++i) {
    w[i] = std::ldexp(1.0f + (i % 127) / 128.0f, (i % 20) - 10) * (i % 3 ? 1 : -1);
    g[i] = std::sin(0.37f * i);
  }
  auto s = mixed_state(space, w, g);
  auto segs = make_segments<Mem>(std::vector<index_t>{0, 5000, n}, 999);
  auto mask = to_device<Mem>(std::vector<std::uint8_t>{1, 0});
  const auto before = to_host(s.bf16);
  AdamWHyper h;
  h.lr = 1e-3;
  h.weight_decay = 0.1;
  const index_t changed = adamw_mixed(space, segs, mask, adamw_scalars(h, 1, 1.0f, Precision::mixed), s.master,
                                      s.grad, s.m, s.v, s.bf16, true);
  const auto after = to_host(s.bf16);
  const auto master = to_host(s.master);
  index_t expected = 0;
  for (int i = 0; i < n; ++i) {
    expected += before[i] != after[i];
    ASSERT_EQ(after[i], float_to_bf16(master[i])) << i;
  }
  EXPECT_EQ(changed, expected);
  EXPECT_GT(changed, 0);
  EXPECT_LT(changed, n);  // small weights move by more than half an ulp, large ones do not
}

TYPED_TEST(AdamW, Bf16ModeTinyLearningRateIsAbsorbed) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  const int n = 4096;
  std::vector<bf16_bits> w(n), g(n);
  for (int i = 0; i < n; ++i) {
    w[i] = float_to_bf16(0.5f + i * 1e-4f);
    g[i] = float_to_bf16(std::cos(0.1f * i));
  }
  auto wv = to_device<Mem>(w), gv = to_device<Mem>(g);
  Kokkos::View<bf16_bits*, Mem> m("m", n), v("v", n);
  auto segs = make_segments<Mem>(n);
  auto mask = to_device<Mem>(std::vector<std::uint8_t>{0});
  AdamWHyper h;
  h.lr = 1e-5;  // |update| ~ 1e-5 < half-ulp(0.5) = 2^-9
  EXPECT_EQ(adamw_bf16(space, segs, mask, adamw_scalars(h, 1, 1.0f, Precision::bf16), wv, gv, m, v), 0);
  EXPECT_EQ(to_host(wv), w);
  h.lr = 1e-2;  // now every weight moves
  EXPECT_EQ(adamw_bf16(space, segs, mask, adamw_scalars(h, 2, 1.0f, Precision::bf16), wv, gv, m, v), n);
}

TEST(AdamW, Bf16ScalarsAreRoundedWherePyTorchRoundsThem) {
  AdamWHyper h;
  const auto s = adamw_scalars(h, 3, 1.0f, Precision::bf16);
  EXPECT_EQ(s.beta1, round_to_bf16(0.9f));
  EXPECT_EQ(s.beta2, round_to_bf16(0.999f));
  EXPECT_EQ(s.one_minus_beta2, static_cast<float>(1.0 - 0.999));  // addcmul_ keeps FP32
  EXPECT_EQ(s.neg_step_size, static_cast<float>(-3e-6 / (1.0 - std::pow(0.9, 3.0))));
  EXPECT_THROW(adamw_scalars(h, 0, 1.0f, Precision::bf16), Error);
}

// Host paths multiply by the bias correction's reciprocal instead of dividing by it: for every
// BF16 divisor the predicate admits, every BF16 dividend gives the quotient's BF16 bits.
TEST(AdamW, Bf16QuotientByAdmittedReciprocalIsExact) {
  std::vector<float> dividends(65536);
  for (std::uint32_t a = 0; a < 65536; ++a) dividends[a] = bf16_to_float(static_cast<bf16_bits>(a));
  index_t admitted = 0;
  for (std::uint32_t b_bits = 0; b_bits < 65536; ++b_bits) {
    const float b = bf16_to_float(static_cast<bf16_bits>(b_bits));
    if (!bf16_reciprocal_is_exact(b)) continue;
    ++admitted;
    const float inverse = 1.0f / b;
    index_t differing = 0;
    for (const float a : dividends) differing += rounded_bf16_bits(a * inverse) != rounded_bf16_bits(a / b);
    ASSERT_EQ(differing, 0) << "divisor bits " << b_bits;
  }
  EXPECT_EQ(admitted, 126 * 128 + 1);  // every normal BF16 value in [2^-126, 1)
  for (const float b : {bits_to_float(0x00400000u), 0.0f, -0.5f, 1.0078125f, 0.3f, NAN, INFINITY})
    EXPECT_FALSE(bf16_reciprocal_is_exact(b)) << b;
}

// Both precisions over three steps, on segments split inside tensors: every backend (the host
// code path, a plain loop per segment, and the device one, a team reduction per segment, on
// each execution space) leaves the same bits in every buffer and counts the same changes.
TEST(AdamW, EveryBackendGivesTheSameBits) {
  const std::vector<index_t> offsets = {0, 7, 7, 2500, 2501, 9000, 40000};
  const index_t n = offsets.back();
  test::expect_same_outputs(test::on_every_backend([&](auto backend) {
    using Mem = typename decltype(backend)::Mem;
    const typename decltype(backend)::ExecSpace space;
    std::mt19937_64 rng(21);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto random = [&](float scale) {
      std::vector<float> x(n);
      for (auto& e : x) e = scale * normal(rng);
      return x;
    };
    const auto segs = make_segments<Mem>(offsets, 1000);
    const auto mask = to_device<Mem>(std::vector<std::uint8_t>{1, 0, 1, 0, 1, 1});
    AdamWHyper h;
    h.lr = 1e-4, h.weight_decay = 0.1;
    auto s = mixed_state(space, random(0.02f), random(1e-3f));
    Kokkos::View<bf16_bits*, Mem> w("w", n), g("g", n), m("m", n), v("v", n);
    cast_to_bf16(space, s.master, w);
    std::vector<index_t> counts;
    for (int t = 1; t <= 3; ++t) {
      s.grad = to_device<Mem>(random(1e-3f));
      cast_to_bf16(space, s.grad, g);
      counts.push_back(adamw_mixed(space, segs, mask, adamw_scalars(h, t, 0.7f, Precision::mixed), s.master, s.grad,
                                   s.m, s.v, s.bf16, t != 2));
      counts.push_back(adamw_bf16(space, segs, mask, adamw_scalars(h, t, 1.0f, Precision::bf16), w, g, m, v));
    }
    EXPECT_GT(counts[0], 0);
    return test::Outputs{{"counts", test::bytes_of(counts)},        {"mixed.master", test::bytes_of(to_host(s.master))},
                         {"mixed.m", test::bytes_of(to_host(s.m))}, {"mixed.v", test::bytes_of(to_host(s.v))},
                         {"mixed.bf16", test::bytes_of(to_host(s.bf16))}, {"bf16.w", test::bytes_of(to_host(w))},
                         {"bf16.m", test::bytes_of(to_host(m))},    {"bf16.v", test::bytes_of(to_host(v))}};
  }));
}

// Pure BF16 on every combination of special weights, gradients and moments (zeros, infinities,
// NaNs with any payload, subnormals, the largest finite values, a negative v), with NaN scalars
// of full payload: every backend's host path, which rounds intermediate results without making
// NaNs canonical, leaves the same bits as the device paths, which make every NaN canonical, and every
// NaN it stores is the canonical one.
TEST(AdamW, Bf16SpecialValuesAgreeOnBothPathsWithCanonicalNaNs) {
  const std::vector<bf16_bits> specials = {0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7FFF, 0xFFFF, 0xFF81,
                                           0x7F81, 0x0001, 0x807F, 0x7F7F, 0xFF7F, 0x3F80, 0xBC00, 0x2000};
  const std::size_t k = specials.size(), n = k * k * k * k;
  std::vector<bf16_bits> w0(n), g0(n), m0(n), v0(n);
  for (std::size_t i = 0; i < n; ++i)
    w0[i] = specials[i % k], g0[i] = specials[i / k % k], m0[i] = specials[i / (k * k) % k],
    v0[i] = specials[i / (k * k * k)];
  AdamWHyper h;
  h.lr = 1e-2, h.weight_decay = 0.1;
  auto nan_with_bits = [](std::uint32_t bits) { return bits_to_float(bits); };
  std::vector<AdamWScalars> settings(7, adamw_scalars(h, 2, 0.5f, Precision::bf16));
  settings[1].grad_scale = nan_with_bits(0x7FFFFFFFu);
  settings[2].one_minus_beta2 = nan_with_bits(0xFFFFFFFFu);
  settings[3].neg_step_size = nan_with_bits(0x7FBFFFFFu);  // a signalling NaN
  // Bias corrections whose reciprocal host paths multiply by (the smallest normal), and two they
  // must divide by (above 1; not a BF16 value).
  settings[4].bias_correction2_sqrt = bits_to_float(0x00800000u);
  settings[5].bias_correction2_sqrt = 1.5f;
  settings[6].bias_correction2_sqrt = 0.3f;
  test::expect_same_outputs(test::on_every_backend([&](auto backend) {
    using Mem = typename decltype(backend)::Mem;
    const typename decltype(backend)::ExecSpace space;
    const auto segs = make_segments<Mem>(std::vector<index_t>{0, index_t(n) / 2, index_t(n)}, 1000);
    const auto mask = to_device<Mem>(std::vector<std::uint8_t>{1, 0});
    test::Outputs out;
    for (std::size_t setting = 0; setting < settings.size(); ++setting) {
      const auto w = to_device<Mem>(w0), g = to_device<Mem>(g0), m = to_device<Mem>(m0), v = to_device<Mem>(v0);
      const index_t changed = adamw_bf16(space, segs, mask, settings[setting], w, g, m, v);
      const std::string name = std::to_string(setting);
      out["changed." + name] = test::bytes_of(std::vector<index_t>{changed});
      for (const auto& [buffer, view] : {std::pair{"w.", w}, std::pair{"m.", m}, std::pair{"v.", v}}) {
        const auto bits = to_host(view);
        const auto other_nans = std::count_if(bits.begin(), bits.end(), [](bf16_bits b) {
          return std::isnan(bf16_to_float(b)) && b != bf16_canonical_nan;
        });
        EXPECT_EQ(other_nans, 0) << buffer << name;
        out[buffer + name] = test::bytes_of(bits);
      }
    }
    return out;
  }));
}

TYPED_TEST(AdamW, RejectsMismatchedBuffers) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  auto s = mixed_state(space, std::vector<float>(8, 1.0f), std::vector<float>(8, 0.0f));
  auto segs = make_segments<Mem>(9);
  auto mask = to_device<Mem>(std::vector<std::uint8_t>{0});
  EXPECT_THROW(adamw_mixed(space, segs, mask, adamw_scalars({}, 1, 1.0f, Precision::mixed), s.master, s.grad, s.m,
                           s.v, s.bf16, false),
               Error);
}

TYPED_TEST(GradNorms, HandDerivedNormsAndCoefficient) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  // Tensor 0: (3, 4) -> 5; tensor 1: (12) -> 12; empty tensor 2 -> 0; total 13.
  auto g = to_device<Mem>(std::vector<float>{3.0f, 4.0f, 12.0f});
  auto segs = make_segments<Mem>(std::vector<index_t>{0, 2, 3, 3}, 1);
  const auto norm = grad_norm(space, segs, g, Precision::mixed);
  EXPECT_EQ(norm.per_tensor, (std::vector<float>{5.0f, 12.0f, 0.0f}));
  EXPECT_EQ(norm.total, 13.0f);
  const float coef = clip_coefficient(norm.total, 1.0, Precision::mixed);
  EXPECT_EQ(coef, (1.0f / (13.0f + static_cast<float>(1e-6))) * 1.0f);
  EXPECT_EQ(clip_coefficient(0.5f, 1.0, Precision::mixed), 1.0f);  // below max_norm: no clipping
  EXPECT_TRUE(std::isnan(clip_coefficient(NAN, 1.0, Precision::mixed)));
}
