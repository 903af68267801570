// Block logic of the element-wise CUDA kernels around the GEMMs: lifting the
// weights, and the pre-/post-processing and exact fallback of the log and
// entropy products by exp-shift (the CUDA counterpart of exp_shift_gemm.cpp,
// whose comment derives the method):
//
//   logsumexp_k(a_mk + lw_kn) = s_m + t_n + log Σ_k P_mk Q_kn,
//   P = e^{a − s} (s_m = max_k a_mk),  Q = e^{lw − t} (t_n = max_k lw_kn),
//
// with entropy's A = (P∘h)@Q and B = P@(Q∘lw) giving h = (A − B)/Z. The GEMMs
// themselves are cuBLAS (exp_shift.cu); an entry is "suspect" when the bound
// on mass lost to underflow, e^{s+t}·K·FLT_MIN, exceeds (FLT_EPSILON/4)·its
// value, and suspects are recomputed exactly (ExactBlock, an online
// logsumexp over k). Unlike the CPU path there is no middle stage of 64-wide
// k blocks: suspects go straight to the exact kernel.
// All element-wise: one thread per element, 256 per block.
#pragma once

#include <cfloat>

#include "kernels/cuda/block_exec.h"

namespace torch_semiring {
namespace cuda_kernels {

constexpr int kElementwiseThreads = 256;

struct NoState {
  int unused;
};

// The block plumbing every element-wise kernel here shares: one thread per
// element of a (batch, rows, cols) index space, elements numbered row-major.
// Derived supplies extent(p) and element(p, e, z, r, c).
struct Extent {
  int64_t batch, rows, cols;
};

template <class Derived, class P>
struct ElementwiseBlock {
  static constexpr int kThreads = kElementwiseThreads;
  using Params = P;
  using Smem = NoState;
  using Regs = NoState;
  TS_TILE_FN static Dim3 grid(const Params& p) {
    const Extent x = Derived::extent(p);
    return {ceil_div(x.batch * x.rows * x.cols, kThreads), 1, 1};
  }
  template <class Exec>
  TS_TILE_FN static void run(const Params& p, Smem&, Exec& ex) {
    const Extent x = Derived::extent(p);
    const int64_t base = ex.block().x * kThreads;
    ex.each([&](int tid, Regs&) {
      const int64_t e = base + tid;
      if (e >= x.batch * x.rows * x.cols) return;
      Derived::element(p, e, e / (x.cols * x.rows), (e / x.cols) % x.rows, e % x.cols);
    });
  }
};

// Lifting w (batch, K, N; any strides; fp32 or bf16) into a contiguous fp32
// (batch, K, N): log|w| (viterbi, log, entropy), |w| (max_abs), or w with zero
// edges marked NaN (max_prod, PackMark).
enum LiftMode : int { kLiftLogAbs = 0, kLiftAbs = 1, kLiftMarkZero = 2 };

template <class TW>
struct LiftParams {
  int mode;
  int64_t batch, K, N;
  const TW* w;
  int64_t w_b, w_k, w_n;
  float* out;
};

template <class TW>
struct LiftBlock : ElementwiseBlock<LiftBlock<TW>, LiftParams<TW>> {
  using Params = LiftParams<TW>;
  TS_TILE_FN static Extent extent(const Params& p) { return {p.batch, p.K, p.N}; }
  TS_TILE_FN static void element(const Params& p, int64_t e, int64_t z, int64_t k, int64_t n) {
    const float w = to_float(p.w[z * p.w_b + k * p.w_k + n * p.w_n]);
    p.out[e] = p.mode == kLiftLogAbs ? log_f(fabsf(w))
               : p.mode == kLiftAbs  ? fabsf(w)
                                     : kernels::PackMark<kernels::MaxProdPair>::pack_b(w);
  }
};

// out = e^{x − shift} (shift −∞ → 0, so an empty row/column gives 0s) into a
// contiguous (batch, rows, cols); optionally out2 = out·h (h_mode 1: P∘h) or
// out2 = out·x, 0 where out = 0 (h_mode 2: Q∘lw, no 0·(−∞)).
struct ShiftExpParams {
  int64_t batch, rows, cols;
  const float* x;
  int64_t x_b, x_r, x_c;
  const float* shift;  // indexed z·sh_b + r·sh_r + c·sh_c
  int64_t sh_b, sh_r, sh_c;
  float* out;
  int h_mode;
  const float* h;
  int64_t h_b, h_r, h_c;
  float* out2;
};

struct ShiftExpBlock : ElementwiseBlock<ShiftExpBlock, ShiftExpParams> {
  TS_TILE_FN static Extent extent(const Params& p) { return {p.batch, p.rows, p.cols}; }
  TS_TILE_FN static void element(const Params& p, int64_t e, int64_t z, int64_t r, int64_t c) {
    const float x = p.x[z * p.x_b + r * p.x_r + c * p.x_c];
    float s = p.shift[z * p.sh_b + r * p.sh_r + c * p.sh_c];
    if (s == -inf_f()) s = 0.f;
    const float v = exp_f(x - s);
    p.out[e] = v;
    if (p.h_mode == 1) p.out2[e] = v * p.h[z * p.h_b + r * p.h_r + c * p.h_c];
    if (p.h_mode == 2) p.out2[e] = v == 0.f ? 0.f : v * x;
  }
};

// After the GEMMs: ℓ = s + t + log Z, h = (A − B)/Z (0 where Z = 0), the
// suspect flag, and the number of suspects (atomic).
struct FinishParams {
  int64_t batch, M, N, K;
  const float* s;  // (batch, M)
  const float* t;  // (batch, N)
  const float* Z;  // (batch, M, N) contiguous, as A and B
  const float* A;  // entropy only (else nullptr)
  const float* B;
  float* l;  // (batch, M, N) contiguous, as h
  float* h;
  uint8_t* suspect;
  int64_t* n_suspect;
};

struct FinishBlock : ElementwiseBlock<FinishBlock, FinishParams> {
  TS_TILE_FN static Extent extent(const Params& p) { return {p.batch, p.M, p.N}; }
  TS_TILE_FN static void element(const Params& p, int64_t e, int64_t z, int64_t m, int64_t n) {
    const float s = p.s[z * p.M + m], t = p.t[z * p.N + n];
    const bool live = s > -inf_f() && t > -inf_f();
    const float o = (s == -inf_f() ? 0.f : s) + (t == -inf_f() ? 0.f : t);
    const float Z = p.Z[e];
    const float l = o + log_f(Z);  // −∞ where no term survived
    p.l[e] = l;
    if (p.A) p.h[e] = Z == 0.f ? 0.f : (p.A[e] - p.B[e]) / Z;
    const float bound = live ? o + log_f(float(p.K) * FLT_MIN) : -inf_f();
    const bool bad = bound > l + log_f(FLT_EPSILON / 4);
    p.suspect[e] = bad;
    if (bad) atomic_add_i64(p.n_suspect, 1);
  }
};

// Exact recomputation where suspect[e]: ℓ = logsumexp_k a_mk + lw_kn and
// h = Σ_k softmax_k · (h_mk − lw_kn) over the terms > −∞, in one pass
// (online rescaling, as FlashAttention).
struct ExactParams {
  int64_t batch, M, N, K;
  const float* a;
  int64_t a_b, a_m, a_k;
  const float* ha;  // entropy's h of the value, or nullptr
  int64_t h_b, h_m, h_k;
  const float* lw;  // (batch, K, N) contiguous
  const uint8_t* suspect;
  float* l;
  float* h;
};

struct ExactBlock : ElementwiseBlock<ExactBlock, ExactParams> {
  TS_TILE_FN static Extent extent(const Params& p) { return {p.batch, p.M, p.N}; }
  TS_TILE_FN static void element(const Params& p, int64_t e, int64_t z, int64_t m, int64_t n) {
    if (!p.suspect[e]) return;
    float mx = -inf_f(), sum = 0.f, hsum = 0.f;
    for (int64_t k = 0; k < p.K; ++k) {
      const float lw = p.lw[(z * p.K + k) * p.N + n];
      const float x = p.a[z * p.a_b + m * p.a_m + k * p.a_k] + lw;
      if (!(x > -inf_f())) continue;
      const float hv = p.ha ? p.ha[z * p.h_b + m * p.h_m + k * p.h_k] - lw : 0.f;
      if (x > mx) {
        const float scale = exp_f(mx - x);  // 0 for the first term
        sum = sum * scale + 1.f;
        hsum = hsum * scale + hv;
        mx = x;
      } else {
        const float w = exp_f(x - mx);
        sum += w;
        hsum += w * hv;
      }
    }
    p.l[e] = mx == -inf_f() ? -inf_f() : mx + log_f(sum);
    if (p.ha) p.h[e] = sum == 0.f ? 0.f : hsum / sum;
  }
};

}  // namespace cuda_kernels
}  // namespace torch_semiring
