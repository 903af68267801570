// Block logic of the CUDA max-semiring GEMMs (max-plus, max-times, the signed
// max_prod pair; max-plus/max-times optionally with argmax), CUTLASS-style
// SIMT: a block computes a BM×BN tile of the output, stepping through k in
// BK-deep slices staged in shared memory; each of its (BM/TM)·(BN/TN)
// threads keeps a TM×TN register tile of accumulators (per component, plus
// the argmax) and updates it with the ⊕/⊗ of tile_arithmetic.h — the very
// functions the CPU micro-kernel uses (Op::update, argmax_update).
//
// out[q, z, m, n] = ⊕_k a[q, z, m, k] ⊗ b[z, k, n], b already lifted
// (log|w| / |w| / w with NaN marks: lift_block.h). a is fp32 or bf16 (Bf16),
// converted to fp32 while staged; accumulation is fp32. Ties of the argmax go
// to the smallest k (k is visited in increasing order by every thread, and
// argmax_update only takes a strictly greater term); −1 where no term beats
// the zero.
//
// Executed per thread on the GPU (max_gemm.cu) and per block on the host by
// the emulation (emulate_host.cpp); see block_exec.h.
#pragma once

#include "kernels/cuda/block_exec.h"

namespace torch_semiring {
namespace cuda_kernels {

template <class TA>
struct MaxGemmParams {
  int64_t batch, M, N, K;
  const TA* a;
  int64_t a_c, a_b, a_m, a_k;  // component, batch, row, k strides (elements)
  const float* b;
  int64_t b_b, b_k, b_n;
  float* c;
  int64_t c_c, c_b, c_m;  // column stride 1
  int32_t* idx;           // argmax or nullptr
  int64_t i_b, i_m;
};

template <class Op, class TA, bool ARG, int BM = 64, int BN = 64, int BK = 16, int TM = 4, int TN = 4>
struct MaxGemmBlock {
  static constexpr int C = Op::kComponents;
  static constexpr int kThreadsX = BN / TN, kThreadsY = BM / TM, kThreads = kThreadsX * kThreadsY;
  static_assert(BN % TN == 0 && BM % TM == 0, "tile sizes");
  static_assert(!ARG || C == 1, "argmax is for one-component semirings");
  using Params = MaxGemmParams<TA>;
  struct Smem {
    float a[C][BK][BM + 1];  // k-major; +1 keeps the transposing stores free of bank conflicts
    float b[BK][BN];
  };
  struct Regs {
    float acc[TM][TN][C];
    int32_t arg[TM][TN];
  };

  TS_TILE_FN static Dim3 grid(const Params& p) { return {ceil_div(p.N, BN), ceil_div(p.M, BM), p.batch}; }

  // Thread (ty, tx) owns rows m0 + ty·TM + i (i < TM) and columns
  // n0 + tx + j·kThreadsX (j < TN): neighbouring threads read neighbouring
  // words of the B slice and store neighbouring output columns.
  template <class Exec>
  TS_TILE_FN static void run(const Params& p, Smem& sm, Exec& ex) {
    const Dim3 blk = ex.block();
    const int64_t m0 = blk.y * BM, n0 = blk.x * BN, z = blk.z;
    const TA* a = p.a + z * p.a_b;
    const float* b = p.b + z * p.b_b;

    ex.each([&](int, Regs& r) {
      TS_UNROLL(8) for (int i = 0; i < TM; ++i)
        TS_UNROLL(8) for (int j = 0; j < TN; ++j) {
          TS_UNROLL(2) for (int q = 0; q < C; ++q) r.acc[i][j][q] = Op::template zero<float>(q);
          r.arg[i][j] = -1;
        }
    });

    for (int64_t k0 = 0; k0 < p.K; k0 += BK) {
      const int kb = int(p.K - k0 < BK ? p.K - k0 : BK);
      // Stage the slices; rows past M / columns past N are 0 (never stored),
      // k past K is never read (the tile loop stops at kb).
      ex.each([&](int tid, Regs&) {
        for (int e = tid; e < BM * BK; e += kThreads) {
          const int mi = e / BK, ki = e % BK;  // consecutive threads: consecutive k (a_k = 1 coalesces)
          const int64_t m = m0 + mi;
          float v[C];
          TS_UNROLL(2) for (int q = 0; q < C; ++q)
            v[q] = (m < p.M && ki < kb) ? to_float(a[q * p.a_c + m * p.a_m + (k0 + ki) * p.a_k]) : 0.f;
          if (m < p.M && ki < kb) kernels::PackMark<Op>::pack_a(v);
          TS_UNROLL(2) for (int q = 0; q < C; ++q) sm.a[q][ki][mi] = v[q];
        }
        for (int e = tid; e < BK * BN; e += kThreads) {
          const int ki = e / BN, ni = e % BN;
          const int64_t n = n0 + ni;
          sm.b[ki][ni] = (n < p.N && ki < kb) ? b[(k0 + ki) * p.b_k + n * p.b_n] : 0.f;
        }
      });
      ex.sync();
      ex.each([&](int tid, Regs& r) {
        const int ty = tid / kThreadsX, tx = tid % kThreadsX;
        for (int k = 0; k < kb; ++k) {
          float av[TM][C], bv[TN];
          TS_UNROLL(8) for (int i = 0; i < TM; ++i)
            TS_UNROLL(2) for (int q = 0; q < C; ++q) av[i][q] = sm.a[q][k][ty * TM + i];
          TS_UNROLL(8) for (int j = 0; j < TN; ++j) bv[j] = sm.b[k][tx + j * kThreadsX];
          TS_UNROLL(8) for (int i = 0; i < TM; ++i)
            TS_UNROLL(8) for (int j = 0; j < TN; ++j) {
              if constexpr (ARG) {
                argmax_update<Op>(r.acc[i][j][0], r.arg[i][j], av[i][0], bv[j], int32_t(k0 + k));
              } else {
                Op::update(r.acc[i][j], av[i], bv[j]);
              }
            }
        }
      });
      ex.sync();
    }

    ex.each([&](int tid, Regs& r) {
      const int ty = tid / kThreadsX, tx = tid % kThreadsX;
      TS_UNROLL(8) for (int i = 0; i < TM; ++i) {
        const int64_t m = m0 + ty * TM + i;
        if (m >= p.M) continue;
        TS_UNROLL(8) for (int j = 0; j < TN; ++j) {
          const int64_t n = n0 + tx + j * kThreadsX;
          if (n >= p.N) continue;
          TS_UNROLL(2) for (int q = 0; q < C; ++q) p.c[q * p.c_c + z * p.c_b + m * p.c_m + n] = r.acc[i][j][q];
          if constexpr (ARG) p.idx[z * p.i_b + m * p.i_m + n] = r.arg[i][j];
        }
      }
    });
  }
};

}  // namespace cuda_kernels
}  // namespace torch_semiring
