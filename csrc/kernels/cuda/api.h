// C API of the CUDA semiring kernels: raw pointers, element strides, sizes,
// so it needs no torch headers (and the emulation library exports the very
// same functions, run on the host: emulate_host.cpp). Pointers are device
// pointers for the CUDA build, host pointers for the emulation; `stream` is a
// cudaStream_t (nullptr: the default stream), ignored by the emulation.
//
// Every function returns 0 on success, a cudaError_t (> 0) when a launch
// failed, or one of the negative codes below. Inputs must satisfy the same
// preconditions as the CPU kernels (cpu_gemm.h): no NaN, finite weights, …;
// callers check them, as the CPU entry points do.
#pragma once

#include <cstddef>
#include <cstdint>

#define TS_CUDA_EBADARG (-1)   // an unknown op/mode/dtype, or argmax asked for max_prod
#define TS_CUDA_ETOOLARGE (-2) // a grid dimension past what CUDA allows (split the batch)
#define TS_CUDA_EWORKSPACE (-3) // workspace smaller than ts_exp_shift_workspace_bytes
#define TS_CUDA_ECUBLAS (-4)   // a cuBLAS call failed

enum { TS_OP_MAX_PLUS = 0, TS_OP_MAX_TIMES = 1, TS_OP_MAX_PROD = 2 };
// kmax(k), 2 <= k <= 8: op TS_OP_KMAX + k; a holds the k descending scores of
// each element at component stride a_c, out the k best of the k·K candidates
// (the network of tile_arithmetic.h's TopKMerge), no argmax.
#define TS_OP_KMAX 16
enum { TS_DTYPE_F32 = 0, TS_DTYPE_BF16 = 1, TS_DTYPE_F64 = 2 };

extern "C" {

// out[q, z, m, n] = ⊕_k a[q, z, m, k] ⊗ b[z, k, n] (q < 2 for max_prod, q < k for kmax, else q = 0);
// b is the lifted weight (ts_lift_weights), a fp32 or bf16; idx (argmax, int32,
// −1 = no path) only for max_plus / max_times, nullptr otherwise.
int ts_max_gemm(int op, int a_dtype, int64_t batch, int64_t M, int64_t N, int64_t K, const void* a, int64_t a_c,
                int64_t a_b, int64_t a_m, int64_t a_k, const float* b, int64_t b_b, int64_t b_k, int64_t b_n, float* c,
                int64_t c_c, int64_t c_b, int64_t c_m, int32_t* idx, int64_t i_b, int64_t i_m, void* stream);

// out (contiguous fp32 batch×K×N) = log|w| (mode 0), |w| (1), w with 0 → NaN (2, max_prod).
int ts_lift_weights(int mode, int w_dtype, int64_t batch, int64_t K, int64_t N, const void* w, int64_t w_b,
                    int64_t w_k, int64_t w_n, float* out, void* stream);

// x viewed as (outer1, outer2, R, inner); out contiguous (outer1·outer2·inner):
// mode 0 amax, 1 amax + argmax (int64, first index, −1 = none > −∞), 2 logsumexp.
int ts_reduce(int mode, int64_t outer1, int64_t outer2, int64_t R, int64_t inner, const float* x, int64_t s_o1,
              int64_t s_o2, int64_t s_r, int64_t s_i, float* out, int64_t* idx, void* stream);

// out[index[e]] = max(out[index[e]], src[e]) for e < n (indices outside [0, n_out) skipped).
int ts_scatter_amax(int64_t n, const float* src, const int64_t* index, float* out, int64_t n_out, void* stream);

// A fused element-wise op (kernels/fused_op.h: op = int(Fused)) of `components`
// components: pair = 0, out = a ⊗ lift(b) (b: the weights); pair = 1,
// out = a ⊕ b (b: a second value). S has ndim ≤ 6 dims (size[]); a and b are
// read at a + c·a_c + Σ i_d·a_s[d] (b likewise; b_c unused for an edge), out
// is (components, S) contiguous. dtype TS_DTYPE_F32 or TS_DTYPE_F64, all
// operands the same. TS_CUDA_EBADARG for an op without that form.
int ts_fused(int op, int pair, int64_t components, int dtype, int ndim, const int64_t* size, const void* a,
             int64_t a_c, const int64_t* a_s, const void* b, int64_t b_c, const int64_t* b_s, void* out,
             void* stream);

// The exp-shift stages (exp_shift_block.h), each one launch:
// out = e^{x − shift}, out2 by h_mode (0 none, 1 out·h, 2 out·x with 0 for out = 0).
int ts_shift_exp(int64_t batch, int64_t rows, int64_t cols, const float* x, int64_t x_b, int64_t x_r, int64_t x_c,
                 const float* shift, int64_t sh_b, int64_t sh_r, int64_t sh_c, float* out, int h_mode, const float* h,
                 int64_t h_b, int64_t h_r, int64_t h_c, float* out2, void* stream);
// ℓ, h (A, B, h nullptr for log), suspect flags and their count (*n_suspect += …).
int ts_exp_shift_finish(int64_t batch, int64_t M, int64_t N, int64_t K, const float* s, const float* t,
                        const float* Z, const float* A, const float* B, float* l, float* h, uint8_t* suspect,
                        int64_t* n_suspect, void* stream);
// Exact recomputation of the suspect entries (ha, h nullptr for log).
int ts_exp_shift_exact(int64_t batch, int64_t M, int64_t N, int64_t K, const float* a, int64_t a_b, int64_t a_m,
                       int64_t a_k, const float* ha, int64_t h_b, int64_t h_m, int64_t h_k, const float* lw,
                       const uint8_t* suspect, float* l, float* h, void* stream);

// The whole log (entropy = 0) or entropy (1) product, l/h contiguous
// (batch, M, N): the stages above around cuBLAS SGEMMs (in the emulation, a
// host GEMM). Needs a workspace of ts_exp_shift_workspace_bytes; stores the
// number of exactly recomputed entries in *n_exact. cublas_handle: a
// cublasHandle_t, or nullptr to create one for the call. Only in builds that
// found cublas_v2.h (TS_CUDA_HAVE_CUBLAS) and in the emulation.
size_t ts_exp_shift_workspace_bytes(int entropy, int64_t batch, int64_t M, int64_t N, int64_t K);
int ts_exp_shift_matmul(int entropy, int64_t batch, int64_t M, int64_t N, int64_t K, const float* a, int64_t a_b,
                        int64_t a_m, int64_t a_k, const float* ha, int64_t h_b, int64_t h_m, int64_t h_k,
                        int w_dtype, const void* w, int64_t w_b, int64_t w_k, int64_t w_n, float* l, float* h,
                        void* workspace, size_t workspace_bytes, int64_t* n_exact, void* cublas_handle,
                        void* stream);
}
