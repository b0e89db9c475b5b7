// pulse::gemm against a naive triple loop in double, for every transpose combination and odd
// sizes. Bound: a float dot product of length k is within k * eps/2 * sum|a||b| of the exact
// value (Higham, gamma_k), alpha and beta add two roundings; we allow (k + 2) * eps, twice that.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "core/error.hpp"
#include "kernels/gemm.hpp"

namespace {

using Matrix = Kokkos::View<float**, Kokkos::LayoutRight, pulse::DefaultMem>;
using pulse::Transpose;

Matrix random_matrix(const std::string& label, int rows, int cols, std::mt19937& rng) {
  Matrix x(label, rows, cols);
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

void check_gemm(Transpose ta, Transpose tb, int m, int n, int k, float alpha, float beta) {
  const std::string where = "ta=" + std::to_string(int(ta)) + " tb=" + std::to_string(int(tb)) +
                            " m=" + std::to_string(m) + " n=" + std::to_string(n) +
                            " k=" + std::to_string(k);
  std::mt19937 rng(m * 10007 + n * 101 + k);
  Matrix A = ta == Transpose::yes ? random_matrix("A", k, m, rng) : random_matrix("A", m, k, rng);
  Matrix B = tb == Transpose::yes ? random_matrix("B", n, k, rng) : random_matrix("B", k, n, rng);
  Matrix C = random_matrix("C", m, n, rng);
  auto a = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), A);
  auto b = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), B);
  auto c0 = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), C);
  // create_mirror_view_and_copy aliases C on a host build; keep the old C separately.
  Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace> c_old("c_old", m, n);
  Kokkos::deep_copy(c_old, c0);

  pulse::gemm(pulse::DefaultExec(), ta, tb, m, n, k, alpha, A, B, beta, C);
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

}  // namespace

TEST(Gemm, AllTransposesOddSizesAgainstDoubleLoop) {
  for (Transpose ta : both)
    for (Transpose tb : both)
      for (int m : sizes)
        for (int n : sizes)
          for (int k : sizes) check_gemm(ta, tb, m, n, k, 0.75f, -1.25f);
}

TEST(Gemm, BetaZeroIgnoresOldC) {
  Matrix A("A", 2, 3), B("B", 3, 2), C("C", 2, 2);
  Kokkos::deep_copy(A, 1.0f);
  Kokkos::deep_copy(B, 2.0f);
  Kokkos::deep_copy(C, std::numeric_limits<float>::quiet_NaN());
  pulse::gemm(pulse::DefaultExec(), Transpose::no, Transpose::no, 2, 2, 3, 0.5f, A, B, 0.0f, C);
  auto c = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), C);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) EXPECT_EQ(c(i, j), 3.0f) << i << "," << j;  // 0.5 * 3 * 1 * 2
}

TEST(Gemm, RejectsMismatchedShapes) {
  Matrix A("A", 2, 3), B("B", 3, 4), C("C", 2, 4);
  const auto space = pulse::DefaultExec();
  EXPECT_NO_THROW(pulse::gemm(space, Transpose::no, Transpose::no, 2, 4, 3, 1.0f, A, B, 0.0f, C));
  EXPECT_THROW(pulse::gemm(space, Transpose::yes, Transpose::no, 2, 4, 3, 1.0f, A, B, 0.0f, C),
               pulse::Error);
  EXPECT_THROW(pulse::gemm(space, Transpose::no, Transpose::no, 2, 4, 2, 1.0f, A, B, 0.0f, C),
               pulse::Error);
  EXPECT_THROW(pulse::gemm(space, Transpose::no, Transpose::no, 2, 3, 3, 1.0f, A, B, 0.0f, C),
               pulse::Error);
}
