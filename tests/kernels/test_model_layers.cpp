// The GPT's layer kernels, each against a naive double-precision loop written here: forward
// outputs directly, backward against central finite differences of that double reference
// (J = sum(R * out) for a random R, so dJ/dx is what the backward computes with dout = R).
// Backwards accumulate, so gradients start from 1 and the test subtracts it.
// Bounds: |pulse - reference| <= tol * max|reference|, tol 1e-5 for outputs and 1e-4 for
// gradients (pulse runs in FP32 over rows of at most a few dozen terms: errors ~1e-6; the
// double finite differences are good to ~1e-9).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/cross_entropy.hpp"
#include "kernels/embedding.hpp"
#include "kernels/gelu.hpp"
#include "kernels/host_copy.hpp"
#include "kernels/layernorm.hpp"
#include "kernels/matmul.hpp"
#include "kernels/residual.hpp"
#include "support/backends.hpp"

namespace {

using Vec = std::vector<double>;
template <class Mem>
using FView = Kokkos::View<float*, Mem>;

Vec randn(std::size_t n, std::mt19937& rng, double scale = 1.0, double shift = 0.0) {
  std::normal_distribution<double> d(0.0, 1.0);
  Vec x(n);
  // Round to float so that pulse and the double reference see the same inputs.
  for (double& v : x) v = static_cast<float>(shift + scale * d(rng));
  return x;
}

template <class Mem>
FView<Mem> dev(const Vec& x) {
  return pulse::to_device<Mem>(std::vector<float>(x.begin(), x.end()));
}
template <class Mem>
FView<Mem> ones(std::size_t n) {
  FView<Mem> v("ones", n);
  Kokkos::deep_copy(v, 1.0f);
  return v;
}
template <class Mem>
Vec host(const FView<Mem>& v) {
  const auto h = pulse::to_host(v);
  return Vec(h.begin(), h.end());
}
template <class Mem>
Vec minus_one(const FView<Mem>& v) {
  Vec h = host(v);
  for (double& x : h) x -= 1.0;
  return h;
}

// dJ/dx by central differences, J = sum(R * f()), f reading x.
Vec numeric_grad(const std::function<Vec()>& f, Vec& x, const Vec& R, double h = 1e-6) {
  Vec g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    double j[2];
    for (int s = 0; s < 2; ++s) {
      x[i] = saved + (s ? -h : h);
      const Vec y = f();
      j[s] = 0;
      for (std::size_t k = 0; k < y.size(); ++k) j[s] += R[k] * y[k];
    }
    x[i] = saved;
    g[i] = (j[0] - j[1]) / (2 * h);
  }
  return g;
}

void expect_close(const Vec& got, const Vec& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0, worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < want.size(); ++i) scale = std::max(scale, std::abs(want[i]));
  for (std::size_t i = 0; i < want.size(); ++i)
    if (std::abs(got[i] - want[i]) > worst) worst = std::abs(got[i] - want[i]), at = i;
  EXPECT_GT(scale, 0.0) << what << ": the reference is all zero, the check would be empty";
  EXPECT_LE(worst, tol * scale) << what << ": element " << at << " is " << got[at] << ", expected " << want[at]
                                << " (max |reference| " << scale << ")";
}

constexpr double out_tol = 1e-5, grad_tol = 1e-4;

// ---- naive double references ----

Vec layernorm_ref(const Vec& x, const Vec& w, const Vec& b, int N, int C) {
  Vec out(x.size());
  for (int r = 0; r < N; ++r) {
    double m = 0, var = 0;
    for (int c = 0; c < C; ++c) m += x[r * C + c] / C;
    for (int c = 0; c < C; ++c) var += (x[r * C + c] - m) * (x[r * C + c] - m) / C;
    for (int c = 0; c < C; ++c) out[r * C + c] = (x[r * C + c] - m) / std::sqrt(var + 1e-5) * w[c] + b[c];
  }
  return out;
}

Vec matmul_ref(const Vec& x, const Vec& w, const Vec& b, int N, int C, int OC) {
  Vec out(std::size_t(N) * OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = b.empty() ? 0.0 : b[o];
      for (int c = 0; c < C; ++c) s += x[n * C + c] * w[o * C + c];
      out[n * OC + o] = s;
    }
  return out;
}

// Returns out [B,T,C] followed by att [B,NH,T,T].
Vec attention_ref(const Vec& qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  Vec out(std::size_t(B) * T * C, 0.0), att(std::size_t(B) * NH * T * T, 0.0);
  auto at = [&](int b, int t, int part, int h, int i) { return qkv[(b * T + t) * 3 * C + part * C + h * hs + i]; };
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        std::vector<double> s(t + 1);
        double maxv = -1e300, sum = 0;
        for (int t2 = 0; t2 <= t; ++t2) {
          s[t2] = 0;
          for (int i = 0; i < hs; ++i) s[t2] += at(b, t, 0, h, i) * at(b, t2, 1, h, i) / std::sqrt(double(hs));
          maxv = std::max(maxv, s[t2]);
        }
        for (int t2 = 0; t2 <= t; ++t2) sum += std::exp(s[t2] - maxv);
        for (int t2 = 0; t2 <= t; ++t2) {
          const double p = std::exp(s[t2] - maxv) / sum;
          att[((b * NH + h) * T + t) * T + t2] = p;
          for (int i = 0; i < hs; ++i) out[(b * T + t) * C + h * hs + i] += p * at(b, t2, 2, h, i);
        }
      }
  out.insert(out.end(), att.begin(), att.end());
  return out;
}

double gelu_ref(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

Vec cross_entropy_ref(const Vec& logits, const std::vector<int>& targets, int N, int V) {
  Vec loss(N);
  for (int r = 0; r < N; ++r) {
    double maxv = -1e300, sum = 0;
    for (int v = 0; v < V; ++v) maxv = std::max(maxv, logits[r * V + v]);
    for (int v = 0; v < V; ++v) sum += std::exp(logits[r * V + v] - maxv);
    loss[r] = std::log(sum) + maxv - logits[r * V + targets[r]];
  }
  return loss;
}

}  // namespace

template <class B>
using Layers = pulse::test::OnBackend<B>;
TYPED_TEST_SUITE(Layers, pulse::test::BackendTypes, pulse::test::BackendNames);

TYPED_TEST(Layers, EmbeddingRepeatedTokens) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  const int B = 2, T = 5, C = 3, V = 4, maxT = 7;
  std::mt19937 rng(1);
  Vec wte = randn(V * C, rng), wpe = randn(maxT * C, rng), R = randn(B * T * C, rng);
  const std::vector<int> tok = {3, 1, 3, 0, 3, 1, 1, 2, 3, 0};  // repeats share rows of dwte
  auto ref = [&] {
    Vec out(B * T * C);
    for (int bt = 0; bt < B * T; ++bt)
      for (int c = 0; c < C; ++c) out[bt * C + c] = wte[tok[bt] * C + c] + wpe[(bt % T) * C + c];
    return out;
  };
  const auto tokens = pulse::to_device<Mem>(tok);
  FView<Mem> out("out", B * T * C), dwte = ones<Mem>(V * C), dwpe = ones<Mem>(maxT * C);
  pulse::embedding_forward(space, out, tokens, dev<Mem>(wte), dev<Mem>(wpe), B, T, C);
  expect_close(host(out), ref(), 0.0 + 1e-7, "embedding out");
  pulse::embedding_backward(space, dwte, dwpe, dev<Mem>(R), tokens, B, T, C);
  expect_close(minus_one(dwte), numeric_grad(ref, wte, R), grad_tol, "dwte");
  expect_close(minus_one(dwpe), numeric_grad(ref, wpe, R), grad_tol, "dwpe");
}

TYPED_TEST(Layers, LayerNorm) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  const int N = 5, C = 7;
  std::mt19937 rng(2);
  Vec x = randn(N * C, rng, 2.0, 3.0), w = randn(C, rng), b = randn(C, rng), R = randn(N * C, rng);
  auto ref = [&] { return layernorm_ref(x, w, b, N, C); };
  const FView<Mem> X = dev<Mem>(x), W = dev<Mem>(w);
  FView<Mem> out("out", N * C), mean("mean", N), rstd("rstd", N);
  FView<Mem> dx = ones<Mem>(N * C), dw = ones<Mem>(C), db = ones<Mem>(C);
  pulse::layernorm_forward(space, out, mean, rstd, X, W, dev<Mem>(b), N, C);
  expect_close(host(out), ref(), out_tol, "layernorm out");
  pulse::layernorm_backward(space, dx, dw, db, dev<Mem>(R), X, W, mean, rstd, N, C);
  expect_close(minus_one(dx), numeric_grad(ref, x, R), grad_tol, "dx");
  expect_close(minus_one(dw), numeric_grad(ref, w, R), grad_tol, "dweight");
  expect_close(minus_one(db), numeric_grad(ref, b, R), grad_tol, "dbias");
}

TYPED_TEST(Layers, MatmulWithAndWithoutBias) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  const int N = 6, C = 5, OC = 3;
  for (bool with_bias : {true, false}) {
    SCOPED_TRACE(with_bias ? "bias" : "no bias");
    std::mt19937 rng(3);
    Vec x = randn(N * C, rng), w = randn(OC * C, rng), R = randn(N * OC, rng);
    Vec b = with_bias ? randn(OC, rng) : Vec{};
    auto ref = [&] { return matmul_ref(x, w, b, N, C, OC); };
    const FView<Mem> X = dev<Mem>(x), W = dev<Mem>(w);
    FView<Mem> out("out", N * OC), dx = ones<Mem>(N * C), dw = ones<Mem>(OC * C), db = ones<Mem>(b.size());
    pulse::matmul_forward(space, out, X, W, dev<Mem>(b), N, C, OC);
    expect_close(host(out), ref(), out_tol, "matmul out");
    pulse::matmul_backward(space, dx, dw, db, dev<Mem>(R), X, W, N, C, OC);
    expect_close(minus_one(dx), numeric_grad(ref, x, R), grad_tol, "dx");
    expect_close(minus_one(dw), numeric_grad(ref, w, R), grad_tol, "dweight");
    if (with_bias) expect_close(minus_one(db), numeric_grad(ref, b, R), grad_tol, "dbias");
  }
}

// matmul on every backend, the host code path (a bias row copy, register-tiled GEMM) and the
// device one (a thread per element): the same bits forward and backward.
TEST(Layers, MatmulEveryBackendGivesTheSameBits) {
  const int N = 13, C = 37, OC = 19;
  pulse::test::expect_same_outputs(pulse::test::on_every_backend([&](auto backend) {
    using Mem = typename decltype(backend)::Mem;
    const typename decltype(backend)::ExecSpace space;
    std::mt19937 rng(4);
    const FView<Mem> X = dev<Mem>(randn(N * C, rng)), W = dev<Mem>(randn(OC * C, rng)), B = dev<Mem>(randn(OC, rng));
    const FView<Mem> dout = dev<Mem>(randn(N * OC, rng));
    FView<Mem> out("out", N * OC), dx = ones<Mem>(N * C), dw = ones<Mem>(OC * C), db = ones<Mem>(OC);
    pulse::matmul_forward(space, out, X, W, B, N, C, OC);
    pulse::matmul_backward(space, dx, dw, db, dout, X, W, N, C, OC);
    using pulse::test::bytes_of;
    return pulse::test::Outputs{{"out", bytes_of(pulse::to_host(out))}, {"dinp", bytes_of(pulse::to_host(dx))},
                                {"dweight", bytes_of(pulse::to_host(dw))}, {"dbias", bytes_of(pulse::to_host(db))}};
  }));
}

TYPED_TEST(Layers, CausalAttentionOddSizes) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  const int B = 2, T = 5, C = 6, NH = 3;  // head size 2, T not a power of two
  std::mt19937 rng(4);
  Vec qkv = randn(B * T * 3 * C, rng), R = randn(B * T * C, rng);
  auto ref_all = [&] { return attention_ref(qkv, B, T, C, NH); };
  auto ref_out = [&] {
    Vec all = ref_all();
    all.resize(std::size_t(B) * T * C);
    return all;
  };
  const FView<Mem> QKV = dev<Mem>(qkv);
  FView<Mem> out("out", B * T * C), att("att", B * NH * T * T), scratch("scratch", B * NH * T * T);
  FView<Mem> dqkv = ones<Mem>(B * T * 3 * C);
  pulse::attention_forward(space, out, att, QKV, B, T, C, NH);
  Vec got = host(out), got_att = host(att);
  got.insert(got.end(), got_att.begin(), got_att.end());
  expect_close(got, ref_all(), out_tol, "attention out and att (zero above the diagonal)");
  pulse::attention_backward(space, dqkv, scratch, dev<Mem>(R), QKV, att, B, T, C, NH);
  expect_close(minus_one(dqkv), numeric_grad(ref_out, qkv, R), grad_tol, "dqkv");
}

// GELU's own tanh against tanh in double: absolute error within 1.2e-7 on a fine grid and
// near 0, odd, exactly +-1 from 9 on and at infinity.
TEST(Layers, GeluTanhAgainstDoubleTanh) {
  double worst = 0;
  for (float u = -20.0f; u <= 20.0f; u += 1e-3f)
    worst = std::max(worst, std::abs(double(pulse::detail::gelu_tanh(u)) - std::tanh(double(u))));
  for (float u = 1e-30f; u < 1.0f; u *= 1.05f) {
    worst = std::max(worst, std::abs(double(pulse::detail::gelu_tanh(u)) - std::tanh(double(u))));
    EXPECT_EQ(pulse::detail::gelu_tanh(-u), -pulse::detail::gelu_tanh(u)) << u;
  }
  EXPECT_LE(worst, 1.2e-7);
  EXPECT_EQ(pulse::detail::gelu_tanh(0.0f), 0.0f);
  EXPECT_EQ(pulse::detail::gelu_tanh(9.0f), 1.0f);
  EXPECT_EQ(pulse::detail::gelu_tanh(1e30f), 1.0f);
  EXPECT_EQ(pulse::detail::gelu_tanh(-std::numeric_limits<float>::infinity()), -1.0f);
}

TYPED_TEST(Layers, GeluIncludingLargeInputs) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  std::mt19937 rng(5);
  Vec x = randn(60, rng, 3.0);
  x.insert(x.end(), {-30.0, -10.0, 0.0, 10.0, 30.0});  // tanh saturates; no overflow
  Vec R = randn(x.size(), rng);
  auto ref = [&] {
    Vec y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = gelu_ref(x[i]);
    return y;
  };
  const FView<Mem> X = dev<Mem>(x);
  FView<Mem> out("out", x.size()), dx = ones<Mem>(x.size());
  pulse::gelu_forward(space, out, X, x.size());
  expect_close(host(out), ref(), out_tol, "gelu out");
  pulse::gelu_backward(space, dx, X, dev<Mem>(R), x.size());
  expect_close(minus_one(dx), numeric_grad(ref, x, R), grad_tol, "dx");
}

TYPED_TEST(Layers, Residual) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  std::mt19937 rng(6);
  const Vec a = randn(9, rng), b = randn(9, rng), R = randn(9, rng);
  FView<Mem> out("out", 9), da = ones<Mem>(9), db = ones<Mem>(9);
  pulse::residual_forward(space, out, dev<Mem>(a), dev<Mem>(b), 9);
  Vec sum(9);
  for (int i = 0; i < 9; ++i) sum[i] = a[i] + b[i];
  expect_close(host(out), sum, 1e-7, "residual out");
  pulse::residual_backward(space, da, db, dev<Mem>(R), 9);
  expect_close(minus_one(da), R, 1e-7, "da");
  expect_close(minus_one(db), R, 1e-7, "db");
}

TYPED_TEST(Layers, CrossEntropyWeightedRows) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  const int N = 4, V = 6;
  std::mt19937 rng(7);
  Vec logits = randn(N * V, rng, 3.0);
  const Vec dloss = randn(N, rng);  // per-row weights (1/N for a mean)
  const std::vector<int> tgt = {0, 5, 2, 2};
  auto ref = [&] { return cross_entropy_ref(logits, tgt, N, V); };
  const auto targets = pulse::to_device<Mem>(tgt);
  FView<Mem> losses("losses", N), probs("probs", N * V), dlogits = ones<Mem>(N * V);
  pulse::cross_entropy_forward(space, losses, probs, dev<Mem>(logits), targets, N, V);
  expect_close(host(losses), ref(), out_tol, "losses");
  pulse::cross_entropy_backward(space, dlogits, dev<Mem>(dloss), probs, targets, N, V);
  expect_close(minus_one(dlogits), numeric_grad(ref, logits, dloss), grad_tol, "dlogits");
}

TYPED_TEST(Layers, CrossEntropyStaysFiniteWhenTheTargetProbabilityUnderflows) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  const Vec logits = {0.0, 200.0, -200.0};  // p(target 2) = e^-400 underflows in FP32
  const auto targets = pulse::to_device<Mem>(std::vector<int>{2});
  FView<Mem> losses("losses", 1), probs("probs", 3);
  pulse::cross_entropy_forward(space, losses, probs, dev<Mem>(logits), targets, 1, 3);
  EXPECT_NEAR(host(losses)[0], 400.0, 1e-3);
}
