// pulse::gemm (and the vendor BLAS, pulse::blas_gemm) against a naive triple loop in double, for
// every transpose combination and odd sizes. Bound: a float dot product of length k is within
// k * eps/2 * sum|a||b| of the exact value (Higham, gamma_k), alpha and beta add two roundings; we
// allow (k + 2) * eps, twice that. Then pulse::gemm's contract bit for bit: each element is the
// k-ordered float sum of rounded products (a scalar loop here), so any row split gives the same bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <limits>
#include <random>
#include <string>

#include "core/error.hpp"
#include "kernels/blas_gemm.hpp"
#include "kernels/gemm.hpp"
#include "support/backends.hpp"

namespace {

std::uint32_t pulse_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

template <class Mem>
using Matrix = Kokkos::View<float**, Kokkos::LayoutRight, Mem>;
using pulse::Transpose;

template <class Mem>
Matrix<Mem> random_matrix(const std::string& label, int rows, int cols, std::mt19937& rng) {
  Matrix<Mem> x(label, rows, cols);
  auto h = Kokkos::create_mirror_view(x);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) h(i, j) = dist(rng);
  Kokkos::deep_copy(x, h);
  return x;
}

// op(X)(i, j) for a row-major X.
template <class HostMatrix>
double op(const HostMatrix& x, Transpose t, int i, int j) {
  return t == Transpose::yes ? x(j, i) : x(i, j);
}

template <class Gemm, class Space, class Mem = typename Space::memory_space>
void check_gemm(const Gemm& gemm, const Space& space, Transpose ta, Transpose tb, int m, int n, int k, float alpha,
                float beta) {
  const std::string where = "ta=" + std::to_string(int(ta)) + " tb=" + std::to_string(int(tb)) +
                            " m=" + std::to_string(m) + " n=" + std::to_string(n) +
                            " k=" + std::to_string(k);
  std::mt19937 rng(m * 10007 + n * 101 + k);
  Matrix<Mem> A = ta == Transpose::yes ? random_matrix<Mem>("A", k, m, rng) : random_matrix<Mem>("A", m, k, rng);
  Matrix<Mem> B = tb == Transpose::yes ? random_matrix<Mem>("B", n, k, rng) : random_matrix<Mem>("B", k, n, rng);
  Matrix<Mem> C = random_matrix<Mem>("C", m, n, rng);
  auto a = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), A);
  auto b = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), B);
  auto c0 = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), C);
  // create_mirror_view_and_copy aliases C on a host build; keep the old C separately.
  Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace> c_old("c_old", m, n);
  Kokkos::deep_copy(c_old, c0);

  gemm(space, ta, tb, m, n, k, alpha, A, B, beta, C);
  auto c = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), C);

  const double eps = std::numeric_limits<float>::epsilon();
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double dot = 0, magnitude = 0;
      for (int p = 0; p < k; ++p) {
        dot += op(a, ta, i, p) * op(b, tb, p, j);
        magnitude += std::abs(op(a, ta, i, p) * op(b, tb, p, j));
      }
      const double want = alpha * dot + beta * double(c_old(i, j));
      const double tol =
          (k + 2) * eps * (std::abs(alpha) * magnitude + std::abs(beta) * std::abs(c_old(i, j)));
      ASSERT_NEAR(c(i, j), want, tol) << where << " at (" << i << ", " << j << ")";
    }
  }
}

const Transpose both[] = {Transpose::no, Transpose::yes};
const int sizes[] = {1, 3, 17, 65};

const auto ordered = [](auto... args) { pulse::gemm(args...); };
const auto vendor = [](auto... args) { pulse::blas_gemm(args...); };

using HostMatrix = Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace>;

// The contract of kernels/gemm.hpp written as the plainest loop (this file is compiled without
// contraction, as the library is).
HostMatrix contract_gemm(Transpose ta, Transpose tb, int m, int n, int k, float alpha, const HostMatrix& a,
                         const HostMatrix& b, float beta, const HostMatrix& c_old) {
  HostMatrix c("c", m, n);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int p = 0; p < k; ++p) {
        const float x = ta == Transpose::yes ? a(p, i) : a(i, p), y = tb == Transpose::yes ? b(j, p) : b(p, j);
        acc = acc + x * y;
      }
      c(i, j) = beta == 0.0f ? alpha * acc : alpha * acc + beta * c_old(i, j);
    }
  return c;
}

// Rows [first, first + rows) of op(A) as a matrix of its own, in A's storage order.
template <class Mem>
Matrix<Mem> row_block(const HostMatrix& a, Transpose ta, int first, int rows, int k) {
  Matrix<Mem> out("block", ta == Transpose::yes ? k : rows, ta == Transpose::yes ? rows : k);
  auto h = Kokkos::create_mirror_view(out);
  for (int r = 0; r < rows; ++r)
    for (int p = 0; p < k; ++p) (ta == Transpose::yes ? h(p, r) : h(r, p)) = ta == Transpose::yes ? a(p, first + r) : a(first + r, p);
  Kokkos::deep_copy(out, h);
  return out;
}

}  // namespace

template <class B>
using Gemm = pulse::test::OnBackend<B>;
TYPED_TEST_SUITE(Gemm, pulse::test::BackendTypes, pulse::test::BackendNames);

TYPED_TEST(Gemm, AllTransposesOddSizesAgainstDoubleLoop) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  for (Transpose ta : both)
    for (Transpose tb : both)
      for (int m : sizes)
        for (int n : sizes)
          for (int k : sizes) check_gemm(ordered, space, ta, tb, m, n, k, 0.75f, -1.25f);
}

template <class B>
using BlasGemm = pulse::test::OnBackend<B>;
TYPED_TEST_SUITE(BlasGemm, pulse::test::BackendTypes, pulse::test::BackendNames);

TYPED_TEST(BlasGemm, AllTransposesOddSizesAgainstDoubleLoop) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  for (Transpose ta : both)
    for (Transpose tb : both)
      for (int m : sizes)
        for (int n : sizes)
          for (int k : sizes) check_gemm(vendor, space, ta, tb, m, n, k, 0.75f, -1.25f);
}

// Every element bit for bit the contract's ordered sum, at sizes that cut tiles and vectors
// anywhere (rows past a multiple of 4 and 8, columns past a multiple of 16), for alpha = 1 and
// beta = 0 or 1 (what the model calls) and the general case; on every backend, the host code
// path (register tiles) and the device one (a thread per element), so all give the same bits.
TYPED_TEST(Gemm, EachElementIsTheOrderedSumBitForBit) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  for (Transpose ta : both)
    for (Transpose tb : both)
      for (int m : {1, 5, 9, 13, 64})
        for (int n : {1, 15, 16, 33, 48})
          for (int k : {1, 7, 64, 200})
            for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, {1.0f, 1.0f}, {0.75f, -1.25f}}) {
              std::mt19937 rng(m * 7919 + n * 131 + k);
              auto A = ta == Transpose::yes ? random_matrix<Mem>("A", k, m, rng) : random_matrix<Mem>("A", m, k, rng);
              auto B = tb == Transpose::yes ? random_matrix<Mem>("B", n, k, rng) : random_matrix<Mem>("B", k, n, rng);
              auto C = random_matrix<Mem>("C", m, n, rng);
              HostMatrix c_old("c_old", m, n);
              Kokkos::deep_copy(c_old, C);
              const HostMatrix want = contract_gemm(ta, tb, m, n, k, alpha,
                                                    Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), A),
                                                    Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), B),
                                                    beta, c_old);
              pulse::gemm(space, ta, tb, m, n, k, alpha, A, B, beta, C);
              auto got = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), C);
              for (int i = 0; i < m; ++i)
                for (int j = 0; j < n; ++j)
                  ASSERT_EQ(pulse_bits(got(i, j)), pulse_bits(want(i, j)))
                      << "ta=" << int(ta) << " tb=" << int(tb) << " m=" << m << " n=" << n << " k=" << k
                      << " alpha=" << alpha << " beta=" << beta << " at (" << i << ", " << j << ")";
            }
}

// The property the model relies on: a row's result does not depend on how many rows share the
// call. The rows of a 61-row product, computed in blocks of 1, 2, 3, 7 and 8 rows, give the same
// bits as in one call.
TYPED_TEST(Gemm, RowsAreTheSameBitsHoweverTheyAreSplit) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  const int m = 61, n = 100, k = 96;
  for (Transpose ta : both)
    for (Transpose tb : both) {
      std::mt19937 rng(17);
      auto A = ta == Transpose::yes ? random_matrix<Mem>("A", k, m, rng) : random_matrix<Mem>("A", m, k, rng);
      auto B = tb == Transpose::yes ? random_matrix<Mem>("B", n, k, rng) : random_matrix<Mem>("B", k, n, rng);
      Matrix<Mem> whole("whole", m, n);
      pulse::gemm(space, ta, tb, m, n, k, 1.0f, A, B, 0.0f, whole);
      const auto a = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), A);
      const auto want = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), whole);
      for (int block : {1, 2, 3, 7, 8})
        for (int first = 0; first < m; first += block) {
          const int rows = std::min(block, m - first);
          Matrix<Mem> part("part", rows, n);
          pulse::gemm(space, ta, tb, rows, n, k, 1.0f, row_block<Mem>(a, ta, first, rows, k), B, 0.0f, part);
          const auto got = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), part);
          for (int r = 0; r < rows; ++r)
            for (int j = 0; j < n; ++j)
              ASSERT_EQ(pulse_bits(got(r, j)), pulse_bits(want(first + r, j)))
                  << "ta=" << int(ta) << " tb=" << int(tb) << " block " << block << " row " << first + r << " col " << j;
        }
    }
}

TYPED_TEST(Gemm, BetaZeroIgnoresOldC) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  Matrix<Mem> A("A", 2, 3), B("B", 3, 2), C("C", 2, 2);
  Kokkos::deep_copy(A, 1.0f);
  Kokkos::deep_copy(B, 2.0f);
  Kokkos::deep_copy(C, std::numeric_limits<float>::quiet_NaN());
  pulse::gemm(space, Transpose::no, Transpose::no, 2, 2, 3, 0.5f, A, B, 0.0f, C);
  auto c = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), C);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) EXPECT_EQ(c(i, j), 3.0f) << i << "," << j;  // 0.5 * 3 * 1 * 2
}

TYPED_TEST(Gemm, RejectsMismatchedShapes) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  Matrix<Mem> A("A", 2, 3), B("B", 3, 4), C("C", 2, 4);
  EXPECT_NO_THROW(pulse::gemm(space, Transpose::no, Transpose::no, 2, 4, 3, 1.0f, A, B, 0.0f, C));
  EXPECT_THROW(pulse::gemm(space, Transpose::yes, Transpose::no, 2, 4, 3, 1.0f, A, B, 0.0f, C),
               pulse::Error);
  EXPECT_THROW(pulse::gemm(space, Transpose::no, Transpose::no, 2, 4, 2, 1.0f, A, B, 0.0f, C),
               pulse::Error);
  EXPECT_THROW(pulse::gemm(space, Transpose::no, Transpose::no, 2, 3, 3, 1.0f, A, B, 0.0f, C),
               pulse::Error);
}
