// CUDA log / entropy semiring products by exp-shift (exp_shift_block.h): the
// lifting, shift/exp pre-processing, post-processing and exact-fallback
// kernels, always; the whole product around cuBLAS SGEMMs
// (ts_exp_shift_matmul) only where cublas_v2.h is found — the CUDA toolkit of
// a full install has it; a compiler-only install (as on the machine these were
// written on) does not, and then only the stages are compiled.
#include "kernels/cuda/device_launch.cuh"

#define TS_LAUNCHER torch_semiring::cuda_kernels::DeviceLauncher
#define TS_API_EXP_SHIFT
#include "kernels/cuda/api_defs.inc"
#undef TS_API_EXP_SHIFT
#undef TS_LAUNCHER

#if __has_include(<cublas_v2.h>)
#include <cublas_v2.h>
#define TS_CUDA_HAVE_CUBLAS 1

namespace torch_semiring {
namespace cuda_kernels {

struct CublasLauncher : DeviceLauncher {
  cublasHandle_t handle;
  bool own;
  CublasLauncher(void* s, void* h)
      : DeviceLauncher(s, nullptr), handle(static_cast<cublasHandle_t>(h)), own(h == nullptr) {
    if (own && cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) handle = nullptr;
    if (handle && cublasSetStream(handle, stream) != CUBLAS_STATUS_SUCCESS) {
      if (own) cublasDestroy(handle);
      handle = nullptr;
    }
  }
  CublasLauncher(const CublasLauncher&) = delete;
  ~CublasLauncher() {
    if (handle && restore_mode) cublasSetMathMode(handle, saved_mode);
    if (own && handle) cublasDestroy(handle);
  }
  bool ok() const { return handle != nullptr; }
  // Full fp32 GEMMs whatever the handle's mode (torch's allows TF32 when the
  // user asked for it): entropy subtracts its GEMMs' results, where TF32's
  // 10-bit products would show; log may keep the handle's choice.
  int exact_fp32() {
    if (cublasGetMathMode(handle, &saved_mode) != CUBLAS_STATUS_SUCCESS) return TS_CUDA_ECUBLAS;
    restore_mode = true;
    return cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH) == CUBLAS_STATUS_SUCCESS ? 0 : TS_CUDA_ECUBLAS;
  }
  cublasMath_t saved_mode = CUBLAS_DEFAULT_MATH;
  bool restore_mode = false;

  // Row-major C (M×N) = A (M×K) @ B (K×N), contiguous, per batch entry:
  // column-major Cᵀ (N×M) = Bᵀ (N×K) · Aᵀ (K×M). fp32 (the handle's math mode
  // decides about TF32 — see exact_fp32; a handle made here has no TF32).
  int gemm(int64_t batch, int64_t M, int64_t N, int64_t K, const float* A, const float* B, float* C) {
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX || batch > INT_MAX) return TS_CUDA_ETOOLARGE;
    const float one = 1.f, zero = 0.f;
    const int n = int(N), m = int(M), k = int(K);
    const cublasStatus_t st = cublasSgemmStridedBatched(
        handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &one, B, n > 1 ? n : 1, K * N, A, k > 1 ? k : 1, M * K, &zero, C,
        n > 1 ? n : 1, M * N, int(batch));
    return st == CUBLAS_STATUS_SUCCESS ? 0 : TS_CUDA_ECUBLAS;
  }
};

}  // namespace cuda_kernels
}  // namespace torch_semiring

#define TS_LAUNCHER torch_semiring::cuda_kernels::CublasLauncher
#define TS_API_EXP_SHIFT_MATMUL
#include "kernels/cuda/api_defs.inc"
#endif
