// Block logic of the CUDA ⊕-reductions over one dim and the ⊕-scatter:
//   amax / argmax (the max semirings' ⊕; argmax for path extraction) and
//   logsumexp (the log semiring's ⊕) of x viewed as (outer1, outer2, R, inner)
//   with any strides, into a contiguous (outer1·outer2·inner) output;
//   scatter-amax: out[index[e]] = max(out[index[e]], src[e]) (include_self).
// One block per output element for the reductions: each thread folds a
// strided share of the R elements, then a shared-memory tree combines the
// threads' partials. argmax: the first (smallest) index of the maximum, NaN
// wins (as torch.amax/argmax), −1 when no element is > −∞ (no path; also
// R = 0, where the value is −∞). logsumexp: max-shifted, ±∞/NaN maxima
// returned as they are (−∞ for R = 0).
// Executed per thread on the GPU (reductions.cu) and on the host by the
// emulation (emulate_host.cpp); see block_exec.h.
#pragma once

#include "kernels/cuda/block_exec.h"

namespace torch_semiring {
namespace cuda_kernels {

enum ReduceMode : int { kReduceAmax = 0, kReduceArgmax = 1, kReduceLogsumexp = 2 };

struct ReduceParams {
  int64_t outer1, outer2, R, inner;
  const float* x;
  int64_t s_o1, s_o2, s_r, s_i;
  float* out;    // (outer1·outer2·inner), contiguous
  int64_t* idx;  // argmax only
};

template <int Mode, int Threads = 256>
struct ReduceBlock {
  static constexpr int kThreads = Threads;
  static_assert((Threads & (Threads - 1)) == 0, "tree reduction needs a power of two");
  using Params = ReduceParams;
  struct Smem {
    float v[Threads];
    int64_t i[Threads];
    float shift;
  };
  struct Regs {
    float v;
    int64_t i;
  };

  TS_TILE_FN static Dim3 grid(const Params& p) { return {p.outer1 * p.outer2 * p.inner, 1, 1}; }

  template <class Exec>
  TS_TILE_FN static void run(const Params& p, Smem& sm, Exec& ex) {
    const int64_t e = ex.block().x;
    const int64_t o = e / p.inner, in = e % p.inner;
    const float* x = p.x + (o / p.outer2) * p.s_o1 + (o % p.outer2) * p.s_o2 + in * p.s_i;

    // 1. max with its first index: per thread, then the tree.
    ex.each([&](int tid, Regs& r) {
      r.v = -inf_f();
      r.i = -1;
      for (int64_t j = tid; j < p.R; j += Threads) {
        const float v = x[j * p.s_r];
        if (argmax_better(v, j, r.v, r.i)) r.v = v, r.i = j;
      }
      sm.v[tid] = r.v;
      sm.i[tid] = r.i;
    });
    ex.sync();
    for (int s = Threads / 2; s > 0; s /= 2) {
      ex.each([&](int tid, Regs&) {
        if (tid < s && argmax_better(sm.v[tid + s], sm.i[tid + s], sm.v[tid], sm.i[tid])) {
          sm.v[tid] = sm.v[tid + s];
          sm.i[tid] = sm.i[tid + s];
        }
      });
      ex.sync();
    }
    if constexpr (Mode != kReduceLogsumexp) {
      ex.each([&](int tid, Regs&) {
        if (tid != 0) return;
        p.out[e] = sm.v[0];
        if constexpr (Mode == kReduceArgmax) p.idx[e] = sm.i[0];
      });
    } else {
      // 2. Σ e^{x − max}, the same tree as a sum.
      ex.each([&](int tid, Regs& r) {
        const float m = sm.v[0];
        r.v = 0.f;
        if (m > -inf_f() && m < inf_f())
          for (int64_t j = tid; j < p.R; j += Threads) r.v += exp_f(x[j * p.s_r] - m);
      });
      ex.sync();  // every thread has read sm.v[0]
      ex.each([&](int tid, Regs& r) {
        if (tid == 0) sm.shift = sm.v[0];
        sm.v[tid] = r.v;
      });
      ex.sync();
      for (int s = Threads / 2; s > 0; s /= 2) {
        ex.each([&](int tid, Regs&) {
          if (tid < s) sm.v[tid] += sm.v[tid + s];
        });
        ex.sync();
      }
      ex.each([&](int tid, Regs&) {
        if (tid != 0) return;
        const float m = sm.shift;
        p.out[e] = (m > -inf_f() && m < inf_f()) ? m + log_f(sm.v[0]) : m;
      });
    }
  }
};

struct ScatterParams {
  int64_t n;
  const float* src;
  const int64_t* index;  // entries outside [0, n_out) are skipped (validate before)
  float* out;
  int64_t n_out;
};

template <int Threads = 256>
struct ScatterAmaxBlock : PerElementBlock<ScatterAmaxBlock<Threads>, ScatterParams, Threads> {
  TS_TILE_FN static void element(const ScatterParams& p, int64_t e) {
    const int64_t t = p.index[e];
    if (t >= 0 && t < p.n_out) atomic_max_float(p.out + t, p.src[e]);
  }
};

}  // namespace cuda_kernels
}  // namespace torch_semiring
