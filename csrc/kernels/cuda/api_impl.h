// The bodies of the C API (api.h), written once over a Launcher that either
// launches the __global__ kernels (device_launch.cuh) or runs the same block
// code over the grid on the host (emulate_host.cpp). A Launcher has
//   template <class Block> int launch(const typename Block::Params&);
//   int zero(void* p, size_t bytes);  int read_i64(const int64_t* p, int64_t* out);
//   int gemm(batch, M, N, K, A, B, C)   // row-major contiguous C = A @ B, fp32
// Argument checks, the choice of kernel and grid, and the exp-shift pipeline
// are therefore the same code in both.
#pragma once

#include "kernels/cuda/api.h"
#include "kernels/cuda/elementwise_block.h"
#include "kernels/cuda/exp_shift_block.h"
#include "kernels/cuda/max_gemm_block.h"
#include "kernels/cuda/reduce_block.h"

namespace torch_semiring {
namespace cuda_kernels {
namespace impl {

using kernels::MaxPlus;
using kernels::MaxProdPair;
using kernels::MaxTimes;
using kernels::TopKMerge;

template <class Op, class TA, bool ARG, class L>
int max_gemm_typed(L& launcher, int64_t batch, int64_t M, int64_t N, int64_t K, const void* a, int64_t a_c,
                   int64_t a_b, int64_t a_m, int64_t a_k, const float* b, int64_t b_b, int64_t b_k, int64_t b_n,
                   float* c, int64_t c_c, int64_t c_b, int64_t c_m, int32_t* idx, int64_t i_b, int64_t i_m) {
  MaxGemmParams<TA> p{batch, M, N, K, static_cast<const TA*>(a), a_c, a_b, a_m, a_k, b, b_b, b_k, b_n,
                      c,     c_c, c_b, c_m, idx, i_b, i_m};
  return launcher.template launch<MaxGemmBlock<Op, TA, ARG>>(p);
}

template <class TA, class L>
int max_gemm_dtype(L& launcher, int op, int64_t batch, int64_t M, int64_t N, int64_t K, const void* a, int64_t a_c,
                   int64_t a_b, int64_t a_m, int64_t a_k, const float* b, int64_t b_b, int64_t b_k, int64_t b_n,
                   float* c, int64_t c_c, int64_t c_b, int64_t c_m, int32_t* idx, int64_t i_b, int64_t i_m) {
#define TS_GEMM_ARGS launcher, batch, M, N, K, a, a_c, a_b, a_m, a_k, b, b_b, b_k, b_n, c, c_c, c_b, c_m, idx, i_b, i_m
  switch (op) {
    case TS_OP_MAX_PLUS:
      return idx ? max_gemm_typed<MaxPlus, TA, true>(TS_GEMM_ARGS) : max_gemm_typed<MaxPlus, TA, false>(TS_GEMM_ARGS);
    case TS_OP_MAX_TIMES:
      return idx ? max_gemm_typed<MaxTimes, TA, true>(TS_GEMM_ARGS)
                 : max_gemm_typed<MaxTimes, TA, false>(TS_GEMM_ARGS);
    case TS_OP_MAX_PROD:
      return idx ? TS_CUDA_EBADARG : max_gemm_typed<MaxProdPair, TA, false>(TS_GEMM_ARGS);
    default:
      break;
  }
  if (idx) return TS_CUDA_EBADARG;  // kmax: no argmax here
  switch (op - TS_OP_KMAX) {  // the network of the power of two >= k, pruned to k lanes (as on the CPU)
    case 2: return max_gemm_typed<TopKMerge<2>, TA, false>(TS_GEMM_ARGS);
    case 3: return max_gemm_typed<TopKMerge<4, MaxPlus, 3>, TA, false>(TS_GEMM_ARGS);
    case 4: return max_gemm_typed<TopKMerge<4>, TA, false>(TS_GEMM_ARGS);
    case 5: return max_gemm_typed<TopKMerge<8, MaxPlus, 5>, TA, false>(TS_GEMM_ARGS);
    case 6: return max_gemm_typed<TopKMerge<8, MaxPlus, 6>, TA, false>(TS_GEMM_ARGS);
    case 7: return max_gemm_typed<TopKMerge<8, MaxPlus, 7>, TA, false>(TS_GEMM_ARGS);
    case 8: return max_gemm_typed<TopKMerge<8>, TA, false>(TS_GEMM_ARGS);
    default: return TS_CUDA_EBADARG;
  }
#undef TS_GEMM_ARGS
}

template <class L>
int max_gemm(L& launcher, int op, int a_dtype, int64_t batch, int64_t M, int64_t N, int64_t K, const void* a,
             int64_t a_c, int64_t a_b, int64_t a_m, int64_t a_k, const float* b, int64_t b_b, int64_t b_k,
             int64_t b_n, float* c, int64_t c_c, int64_t c_b, int64_t c_m, int32_t* idx, int64_t i_b, int64_t i_m) {
  if (batch < 0 || M < 0 || N < 0 || K < 0) return TS_CUDA_EBADARG;
  if (a_dtype == TS_DTYPE_F32)
    return max_gemm_dtype<float>(launcher, op, batch, M, N, K, a, a_c, a_b, a_m, a_k, b, b_b, b_k, b_n, c, c_c, c_b,
                                 c_m, idx, i_b, i_m);
  if (a_dtype == TS_DTYPE_BF16)
    return max_gemm_dtype<Bf16>(launcher, op, batch, M, N, K, a, a_c, a_b, a_m, a_k, b, b_b, b_k, b_n, c, c_c, c_b,
                                c_m, idx, i_b, i_m);
  return TS_CUDA_EBADARG;
}

template <class L>
int lift_weights(L& launcher, int mode, int w_dtype, int64_t batch, int64_t K, int64_t N, const void* w, int64_t w_b,
                 int64_t w_k, int64_t w_n, float* out) {
  if (mode < kLiftLogAbs || mode > kLiftMarkZero) return TS_CUDA_EBADARG;
  if (w_dtype == TS_DTYPE_F32)
    return launcher.template launch<LiftBlock<float>>(
        LiftParams<float>{mode, batch, K, N, static_cast<const float*>(w), w_b, w_k, w_n, out});
  if (w_dtype == TS_DTYPE_BF16)
    return launcher.template launch<LiftBlock<Bf16>>(
        LiftParams<Bf16>{mode, batch, K, N, static_cast<const Bf16*>(w), w_b, w_k, w_n, out});
  return TS_CUDA_EBADARG;
}

template <class L>
int reduce(L& launcher, int mode, int64_t outer1, int64_t outer2, int64_t R, int64_t inner, const float* x,
           int64_t s_o1, int64_t s_o2, int64_t s_r, int64_t s_i, float* out, int64_t* idx) {
  ReduceParams p{outer1, outer2, R, inner, x, s_o1, s_o2, s_r, s_i, out, idx};
  if (outer2 < 1 || inner < 1) return outer1 * outer2 * inner == 0 ? 0 : TS_CUDA_EBADARG;
  switch (mode) {
    case kReduceAmax: return launcher.template launch<ReduceBlock<kReduceAmax>>(p);
    case kReduceArgmax: return idx ? launcher.template launch<ReduceBlock<kReduceArgmax>>(p) : TS_CUDA_EBADARG;
    case kReduceLogsumexp: return launcher.template launch<ReduceBlock<kReduceLogsumexp>>(p);
    default: return TS_CUDA_EBADARG;
  }
}

template <class L>
int scatter_amax(L& launcher, int64_t n, const float* src, const int64_t* index, float* out, int64_t n_out) {
  return launcher.template launch<ScatterAmaxBlock<>>(ScatterParams{n, src, index, out, n_out});
}

template <class T, class L>
int fused_typed(L& launcher, int op, bool pair, int64_t components, int ndim, const int64_t* size, const void* a,
                int64_t a_c, const int64_t* a_s, const void* b, int64_t b_c, const int64_t* b_s, void* out) {
  FusedParams<T> p{};
  p.n = 1;
  p.ndim = ndim;
  for (int d = 0; d < ndim; ++d) {
    if (size[d] < 0) return TS_CUDA_EBADARG;
    p.size[d] = size[d], p.a_s[d] = a_s[d], p.b_s[d] = b_s[d], p.n *= size[d];
  }
  p.a = static_cast<const T*>(a), p.a_c = a_c, p.b = static_cast<const T*>(b), p.b_c = b_c;
  p.out = static_cast<T*>(out);
  return fused_arithmetic::visit_fused<int>(kernels::Fused(op), pair, components, TS_CUDA_EBADARG,
                                            [&](auto o, auto is_pair) {
                                              using Block = FusedBlock<decltype(o), decltype(is_pair)::value, T>;
                                              return launcher.template launch<Block>(p);
                                            });
}

template <class L>
int fused(L& launcher, int op, bool pair, int64_t components, int dtype, int ndim, const int64_t* size, const void* a,
          int64_t a_c, const int64_t* a_s, const void* b, int64_t b_c, const int64_t* b_s, void* out) {
  if (ndim < 0 || ndim > kFusedMaxDims || op < 0 || op > int(kernels::Fused::LogAddExp)) return TS_CUDA_EBADARG;
  if (dtype == TS_DTYPE_F32) return fused_typed<float>(launcher, op, pair, components, ndim, size, a, a_c, a_s, b, b_c, b_s, out);
  if (dtype == TS_DTYPE_F64) return fused_typed<double>(launcher, op, pair, components, ndim, size, a, a_c, a_s, b, b_c, b_s, out);
  return TS_CUDA_EBADARG;
}

template <class L>
int shift_exp(L& launcher, const ShiftExpParams& p) {
  if (p.h_mode < 0 || p.h_mode > 2) return TS_CUDA_EBADARG;
  return launcher.template launch<ShiftExpBlock>(p);
}

template <class L>
int exp_shift_finish(L& launcher, const FinishParams& p) {
  return launcher.template launch<FinishBlock>(p);
}

template <class L>
int exp_shift_exact(L& launcher, const ExactParams& p) {
  return launcher.template launch<ExactBlock>(p);
}

// Workspace of the exp-shift product, 256-byte aligned pieces.
struct ExpShiftWorkspace {
  float *lw, *s, *t, *P, *Q, *Z, *Ph, *Qlw, *A, *B;
  uint8_t* suspect;
  int64_t* count;
  size_t bytes;
};

inline ExpShiftWorkspace carve(bool entropy, int64_t batch, int64_t M, int64_t N, int64_t K, char* base) {
  ExpShiftWorkspace w{};
  size_t off = 0;
  auto take = [&](size_t bytes) {
    char* p = base ? base + off : nullptr;
    off += (bytes + 255) / 256 * 256;
    return p;
  };
  const size_t f = sizeof(float);
  w.lw = reinterpret_cast<float*>(take(f * batch * K * N));
  w.s = reinterpret_cast<float*>(take(f * batch * M));
  w.t = reinterpret_cast<float*>(take(f * batch * N));
  w.P = reinterpret_cast<float*>(take(f * batch * M * K));
  w.Q = reinterpret_cast<float*>(take(f * batch * K * N));
  w.Z = reinterpret_cast<float*>(take(f * batch * M * N));
  if (entropy) {
    w.Ph = reinterpret_cast<float*>(take(f * batch * M * K));
    w.Qlw = reinterpret_cast<float*>(take(f * batch * K * N));
    w.A = reinterpret_cast<float*>(take(f * batch * M * N));
    w.B = reinterpret_cast<float*>(take(f * batch * M * N));
  }
  w.suspect = reinterpret_cast<uint8_t*>(take(batch * M * N));
  w.count = reinterpret_cast<int64_t*>(take(sizeof(int64_t)));
  w.bytes = off;
  return w;
}

inline size_t exp_shift_workspace_bytes(bool entropy, int64_t batch, int64_t M, int64_t N, int64_t K) {
  return carve(entropy, batch, M, N, K, nullptr).bytes;
}

#define TS_TRY(expr)              \
  do {                            \
    const int ts_rc_ = (expr);    \
    if (ts_rc_ != 0) return ts_rc_; \
  } while (0)

template <class L>
int exp_shift_matmul(L& launcher, bool entropy, int64_t batch, int64_t M, int64_t N, int64_t K, const float* a,
                     int64_t a_b, int64_t a_m, int64_t a_k, const float* ha, int64_t h_b, int64_t h_m, int64_t h_k,
                     int w_dtype, const void* w, int64_t w_b, int64_t w_k, int64_t w_n, float* l, float* h,
                     void* workspace, size_t workspace_bytes, int64_t* n_exact) {
  if (batch < 0 || M < 0 || N < 0 || K < 0 || (entropy && (!ha || !h))) return TS_CUDA_EBADARG;
  *n_exact = 0;
  ExpShiftWorkspace ws = carve(entropy, batch, M, N, K, static_cast<char*>(workspace));
  if (workspace_bytes < ws.bytes) return TS_CUDA_EWORKSPACE;
  if (batch * M * N == 0) return 0;
  // 1. lw = log|w|; the shifts s (row maxima of a) and t (column maxima of lw).
  TS_TRY(lift_weights(launcher, kLiftLogAbs, w_dtype, batch, K, N, w, w_b, w_k, w_n, ws.lw));
  TS_TRY(reduce(launcher, kReduceAmax, batch, M, K, 1, a, a_b, a_m, a_k, 0, ws.s, nullptr));
  TS_TRY(reduce(launcher, kReduceAmax, batch, 1, K, N, ws.lw, K * N, 0, N, 1, ws.t, nullptr));
  // 2. P = e^{a − s} (and P∘h), Q = e^{lw − t} (and Q∘lw).
  TS_TRY(shift_exp(launcher, ShiftExpParams{batch, M, K, a, a_b, a_m, a_k, ws.s, M, 1, 0, ws.P, entropy ? 1 : 0, ha,
                                            h_b, h_m, h_k, ws.Ph}));
  TS_TRY(shift_exp(launcher, ShiftExpParams{batch, K, N, ws.lw, K * N, N, 1, ws.t, N, 0, 1, ws.Q, entropy ? 2 : 0,
                                            nullptr, 0, 0, 0, ws.Qlw}));
  // 3. The GEMMs.
  TS_TRY(launcher.gemm(batch, M, N, K, ws.P, ws.Q, ws.Z));
  if (entropy) {
    TS_TRY(launcher.gemm(batch, M, N, K, ws.Ph, ws.Q, ws.A));
    TS_TRY(launcher.gemm(batch, M, N, K, ws.P, ws.Qlw, ws.B));
  }
  // 4. ℓ, h, suspects; 5. the suspects exactly.
  TS_TRY(launcher.zero(ws.count, sizeof(int64_t)));
  TS_TRY(exp_shift_finish(launcher, FinishParams{batch, M, N, K, ws.s, ws.t, ws.Z, entropy ? ws.A : nullptr,
                                                 entropy ? ws.B : nullptr, l, entropy ? h : nullptr, ws.suspect,
                                                 ws.count}));
  int64_t count = 0;
  TS_TRY(launcher.read_i64(ws.count, &count));
  if (count > 0)
    TS_TRY(exp_shift_exact(launcher, ExactParams{batch, M, N, K, a, a_b, a_m, a_k, entropy ? ha : nullptr, h_b, h_m,
                                                 h_k, ws.lw, ws.suspect, l, entropy ? h : nullptr}));
  *n_exact = count;
  return 0;
}

}  // namespace impl
}  // namespace cuda_kernels
}  // namespace torch_semiring
