#pragma once
// C = alpha * op(A) * op(B) + beta * C on row-major (LayoutRight) float matrices, where op(X) is
// X or its transpose: pulse's own GEMM, the one the model runs, batch-invariant by construction.
//
// The contract: every element of C is
//     acc = 0;  for p in 0..k-1:  acc = acc + op(A)(i,p) * op(B)(p,j)   (product rounded, then sum)
//     C(i,j) = alpha * acc            (beta == 0: C's old contents are not read, as in BLAS)
//     C(i,j) = alpha * acc + beta * C(i,j)   (beta != 0)
// in float, in that order, with no fused multiply-add (-ffp-contract=off, nvcc's --fmad=false).
// Nothing else enters: not m or n, not which rows share a call, not the tile an element falls
// in, not the thread count, not the CPU's vector width (vectors only compute neighbouring
// elements of C side by side, never parts of one sum), not the backend. So a row of C has the
// same bits however many rows are computed together, on Serial, OpenMP and CUDA, on AVX2 and
// AVX-512 machines alike. A vendor BLAS promises none of that (kernels/blas_gemm.hpp).
//
// Host backends compute register tiles of up to gemm_mr x gemm_nr elements from a packed copy of
// op(B); devices, and host backends with the device paths forced (kernels/segments.hpp), one
// thread per element. Speed against OpenBLAS: make bench
// (BM_Gemm/BM_BlasGemm in pulse-bench-model).
#include <algorithm>
#include <cstring>
#include <utility>
#include <string>
#include <type_traits>

#include "core/error.hpp"
#include "kernels/segments.hpp"
#include "kernels/types.hpp"

namespace pulse {

enum class Transpose { no, yes };

namespace detail {

template <class View>
void check_gemm_operand(const View& x, index_t rows, index_t cols, const char* name) {
  static_assert(Kokkos::is_view<View>::value && View::rank == 2, "pulse::gemm takes 2-D Views");
  static_assert(std::is_same_v<typename View::non_const_value_type, float>, "pulse::gemm takes float Views");
  static_assert(std::is_same_v<typename View::array_layout, Kokkos::LayoutRight>,
                "pulse::gemm takes row-major (LayoutRight) Views");
  PULSE_CHECK(static_cast<index_t>(x.extent(0)) == rows && static_cast<index_t>(x.extent(1)) == cols,
              std::string("gemm: ") + name + " is " + std::to_string(x.extent(0)) + "x" +
                  std::to_string(x.extent(1)) + ", expected " + std::to_string(rows) + "x" + std::to_string(cols));
}

// The checks of a gemm call (pulse::gemm's and pulse::blas_gemm's): writable C, one memory space
// the execution space reaches, and shapes that match m, n, k and the transposes.
template <class ExecSpace, class AView, class BView, class CView>
void check_gemm_call(Transpose trans_a, Transpose trans_b, int m, int n, int k, const AView& A, const BView& B,
                     const CView& C) {
  static_assert(!std::is_const_v<typename CView::value_type>, "gemm: C must be writable");
  using Mem = typename AView::memory_space;
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, Mem>::accessible &&
                    std::is_same_v<Mem, typename BView::memory_space> &&
                    std::is_same_v<Mem, typename CView::memory_space>,
                "gemm: A, B and C must live in one memory space the execution space can access");
  PULSE_CHECK(m >= 0 && n >= 0 && k >= 0,
              "gemm: negative size m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k));
  const bool ta = trans_a == Transpose::yes;
  const bool tb = trans_b == Transpose::yes;
  check_gemm_operand(A, ta ? k : m, ta ? m : k, "A");
  check_gemm_operand(B, tb ? n : k, tb ? k : n, "B");
  check_gemm_operand(C, m, n, "C");
}

// Row stride of a row-major matrix; BLAS wants at least 1 even for empty matrices.
template <class View>
int leading_dimension(const View& x) {
  return x.stride(0) > 0 ? static_cast<int>(x.stride(0)) : 1;
}

// Element (r, c) of op(X) for a row-major X: strides chosen by the transpose.
struct StridedMatrix {
  const float* data;
  index_t row_stride, col_stride;
  KOKKOS_INLINE_FUNCTION float operator()(index_t r, index_t c) const { return data[r * row_stride + c * col_stride]; }
};

inline StridedMatrix op_matrix(const float* data, int ld, bool transposed) {
  return transposed ? StridedMatrix{data, 1, ld} : StridedMatrix{data, ld, 1};
}

// The register tile: up to gemm_mr rows and gemm_nr columns of C, one vector of gemm_nr floats
// per row (a GCC vector: one AVX-512 register, two AVX2 ones). The row count is a register
// budget only (8 accumulators of 32, or 4 of 16 AVX2 registers), never part of a result.
inline constexpr int gemm_nr = 16;
#ifdef __AVX512F__
inline constexpr int gemm_mr = 8;
#else
inline constexpr int gemm_mr = 4;
#endif
typedef float gemm_row __attribute__((vector_size(gemm_nr * sizeof(float))));

KOKKOS_INLINE_FUNCTION float gemm_result(float alpha, float acc, float beta, float old) {
  return beta == 0.0f ? alpha * acc : alpha * acc + beta * old;
}

// Rows i0..i0+Rows-1, columns j0..j0+gemm_nr-1 of C; panel: those columns of op(B), k rows of
// gemm_nr floats.
template <int Rows>
void gemm_tile(index_t k, const StridedMatrix& a, index_t i0, const float* panel, index_t j0, float alpha,
               float beta, float* c, index_t ldc) {
  gemm_row acc[Rows] = {};
  for (index_t p = 0; p < k; ++p) {
    gemm_row brow;
    std::memcpy(&brow, panel + p * gemm_nr, sizeof brow);
    for (int r = 0; r < Rows; ++r) acc[r] = acc[r] + a(i0 + r, p) * brow;
  }
  for (int r = 0; r < Rows; ++r)
    for (int q = 0; q < gemm_nr; ++q) {
      float& out = c[(i0 + r) * ldc + j0 + q];
      out = gemm_result(alpha, acc[r][q], beta, out);
    }
}

template <int... Rows>
void gemm_tile_of(int rows, std::integer_sequence<int, Rows...>, index_t k, const StridedMatrix& a, index_t i0,
                  const float* panel, index_t j0, float alpha, float beta, float* c, index_t ldc) {
  ((rows == Rows + 1 ? gemm_tile<Rows + 1>(k, a, i0, panel, j0, alpha, beta, c, ldc) : void()), ...);
}

// The last panel when n is not a multiple of gemm_nr: the same sum per element, one at a time.
inline void gemm_edge_tile(index_t k, const StridedMatrix& a, index_t i0, int rows, const float* panel, index_t j0,
                           int cols, float alpha, float beta, float* c, index_t ldc) {
  for (int r = 0; r < rows; ++r)
    for (int q = 0; q < cols; ++q) {
      float acc = 0.0f;
      for (index_t p = 0; p < k; ++p) acc = acc + a(i0 + r, p) * panel[p * gemm_nr + q];
      float& out = c[(i0 + r) * ldc + j0 + q];
      out = gemm_result(alpha, acc, beta, out);
    }
}

}  // namespace detail

template <class ExecSpace, class AView, class BView, class CView>
void gemm(const ExecSpace& space, Transpose trans_a, Transpose trans_b, int m, int n, int k, float alpha,
          const AView& A, const BView& B, float beta, const CView& C) {
  detail::check_gemm_call<ExecSpace>(trans_a, trans_b, m, n, k, A, B, C);
  if (m == 0 || n == 0) return;
  const bool ta = trans_a == Transpose::yes;
  const bool tb = trans_b == Transpose::yes;

  const detail::StridedMatrix a = detail::op_matrix(A.data(), detail::leading_dimension(A), ta);
  float* const c = C.data();
  const index_t ldc = detail::leading_dimension(C);
  if constexpr (is_host_space<ExecSpace>) {
    if (takes_host_path(space)) {
      using Mem = typename AView::memory_space;
      // op(B) packed into panels of gemm_nr columns, k rows each (the last one zero-padded), so a
      // tile reads its row of B as one contiguous vector; the packed copy costs k x n moves against
      // the tiles' 2 m n k flops.
      const detail::StridedMatrix b = detail::op_matrix(B.data(), detail::leading_dimension(B), tb);
      const index_t panels = (n + detail::gemm_nr - 1) / detail::gemm_nr;
      Kokkos::View<float*, Mem> packed(Kokkos::view_alloc(Kokkos::WithoutInitializing, "pulse::gemm::packed_b"),
                                       std::size_t(panels) * k * detail::gemm_nr);
      float* const pack = packed.data();
      Kokkos::parallel_for(
          "pulse::gemm::pack_b", FlatPolicy<ExecSpace>(space, 0, panels), [=](const index_t panel) {
            float* const dst = pack + panel * k * detail::gemm_nr;
            const index_t j0 = panel * detail::gemm_nr;
            const int cols = static_cast<int>(std::min<index_t>(detail::gemm_nr, n - j0));
            for (index_t p = 0; p < k; ++p)
              for (int q = 0; q < detail::gemm_nr; ++q) dst[p * detail::gemm_nr + q] = q < cols ? b(p, j0 + q) : 0.0f;
          });
      const index_t tiles_m = (m + detail::gemm_mr - 1) / detail::gemm_mr;
      Kokkos::parallel_for(
          "pulse::gemm::tiles", FlatPolicy<ExecSpace>(space, 0, tiles_m * panels), [=](const index_t t) {
            const index_t panel = t % panels, i0 = (t / panels) * detail::gemm_mr, j0 = panel * detail::gemm_nr;
            const float* const panel_b = pack + panel * k * detail::gemm_nr;
            const int rows = static_cast<int>(std::min<index_t>(detail::gemm_mr, m - i0));
            const int cols = static_cast<int>(std::min<index_t>(detail::gemm_nr, n - j0));
            if (cols == detail::gemm_nr)
              detail::gemm_tile_of(rows, std::make_integer_sequence<int, detail::gemm_mr>(), k, a, i0, panel_b, j0,
                                   alpha, beta, c, ldc);
            else
              detail::gemm_edge_tile(k, a, i0, rows, panel_b, j0, cols, alpha, beta, c, ldc);
          });
      // The packed copy is freed on return: wait for the tiles that read it.
      space.fence();
      return;
    }
  }
  const detail::StridedMatrix b = detail::op_matrix(B.data(), detail::leading_dimension(B), tb);
  Kokkos::parallel_for(
      "pulse::gemm::elements", FlatPolicy<ExecSpace>(space, 0, index_t(m) * n), KOKKOS_LAMBDA(const index_t e) {
        const index_t i = e / n, j = e % n;
        float acc = 0.0f;
        for (index_t p = 0; p < k; ++p) acc = acc + a(i, p) * b(p, j);
        c[i * ldc + j] = detail::gemm_result(alpha, acc, beta, c[i * ldc + j]);
      });
}

}  // namespace pulse
