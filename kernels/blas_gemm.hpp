#pragma once
// The vendor BLAS behind the same call as pulse::gemm: C = alpha * op(A) * op(B) + beta * C on
// row-major float matrices, OpenBLAS on host execution spaces, cuBLAS on Kokkos::Cuda (a build
// has one or the other, PULSE_HAVE_CUBLAS, as pulse links one BLAS). The model does not use it:
// a BLAS picks its kernel by CPU, matrix shape and thread count, so a row's result depends on
// how many rows share the call (Debian's OpenBLAS on AVX-512 kernels, measured). It stays as the
// speed reference of pulse::gemm in make bench and as a second opinion in test_gemm.
// As in BLAS, beta == 0 means C's old contents are not read (NaNs there do not propagate).
#include <string>
#include <type_traits>

#include "core/error.hpp"
#include "kernels/gemm.hpp"

#if defined(PULSE_HAVE_CUBLAS) && defined(KOKKOS_ENABLE_CUDA)
#define PULSE_GEMM_CUBLAS
#include <cublas_v2.h>
#elif !defined(PULSE_HAVE_CUBLAS)
#define PULSE_GEMM_CBLAS
#include <cblas.h>
#endif

namespace pulse {

namespace detail {

#ifdef KOKKOS_ENABLE_CUDA
template <class ExecSpace>
inline constexpr bool is_cuda = std::is_same_v<ExecSpace, Kokkos::Cuda>;
#else
template <class ExecSpace>
inline constexpr bool is_cuda = false;
#endif

#ifdef PULSE_GEMM_CUBLAS
inline void check_cublas(cublasStatus_t status, const char* what) {
  PULSE_CHECK(status == CUBLAS_STATUS_SUCCESS,
              std::string(what) + " failed with cuBLAS status " + std::to_string(int(status)));
}

// One handle per process, created on first use and never destroyed: destroying it at exit
// could run after the CUDA context is gone. Each call binds it to the caller's stream.
inline cublasHandle_t cublas_handle() {
  static cublasHandle_t handle = [] {
    cublasHandle_t h;
    check_cublas(cublasCreate(&h), "cublasCreate");
    return h;
  }();
  return handle;
}
#endif

}  // namespace detail

template <class ExecSpace, class AView, class BView, class CView>
void blas_gemm(const ExecSpace& space, Transpose trans_a, Transpose trans_b, int m, int n, int k,
          float alpha, const AView& A, const BView& B, float beta, const CView& C) {
  detail::check_gemm_call<ExecSpace>(trans_a, trans_b, m, n, k, A, B, C);
  if (m == 0 || n == 0) return;
  const bool ta = trans_a == Transpose::yes;
  const bool tb = trans_b == Transpose::yes;

  constexpr bool on_host = Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible;
  if constexpr (detail::is_cuda<ExecSpace>) {
#ifdef PULSE_GEMM_CUBLAS
    // cuBLAS is column-major, and a row-major X is a column-major X^T with the same leading
    // dimension; so compute C^T = op(B)^T * op(A)^T, i.e. swap the operands and m with n.
    cublasHandle_t handle = detail::cublas_handle();
    detail::check_cublas(cublasSetStream(handle, space.cuda_stream()), "cublasSetStream");
    detail::check_cublas(
        cublasSgemm(handle, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m,
                    k, &alpha, B.data(), detail::leading_dimension(B), A.data(),
                    detail::leading_dimension(A), &beta, C.data(), detail::leading_dimension(C)),
        "cublasSgemm");
#else
    static_assert(!detail::is_cuda<ExecSpace>, "pulse::blas_gemm on Kokkos::Cuda needs cuBLAS");
#endif
  } else if constexpr (on_host) {
#ifdef PULSE_GEMM_CBLAS
    // OpenBLAS knows nothing of Kokkos: let pending kernels on this space finish first.
    space.fence();
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
                n, k, alpha, A.data(), detail::leading_dimension(A), B.data(),
                detail::leading_dimension(B), beta, C.data(), detail::leading_dimension(C));
#else
    static_assert(!on_host, "pulse::blas_gemm: a cuBLAS build has no host BLAS");
#endif
  } else {
    static_assert(on_host, "pulse::blas_gemm: no BLAS for this execution space");
  }
}

}  // namespace pulse
