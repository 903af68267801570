// Register-blocked CPU GEMMs for the max semirings (max-plus, max-times, the
// signed max_prod pair, kmax's top-k lists; max-plus/max-times optionally with
// argmax), GotoBLAS-style:
//
//   B = lift(w), packed panel-major (NR lanes), once per weight version
//   for each block of KC along k:            (B micro-panel KC×NR ≈ 16 KB: L1)
//     for each block of MC rows of g:        (packed A block ≈ 192 KB: L2)
//       pack the rows, MR at a time, k-major
//       for each panel of NR columns:
//         for each MR rows: micro-kernel — MR×NR accumulators in registers
//
// Cost per product: M·K·N terms in the micro-kernel (see the instruction counts
// at the Ops) + one pass over g (packing A, which also checks g's range: no
// separate min/max pass, no host read) + the packing of B. B is the lifted
// weight (log|w| with ATen's vectorised log, |w|, or w with zero edges marked
// NaN), range-checked while packing; for a leaf weight (a parameter, frozen
// or between optimizer steps) the packed B is kept in the lift cache
// (lift_cache.h) and reused until the weight's version changes, so a product
// with it costs the micro-kernel and the packing of g only.
//
// Packing reads g and w through their strides, so transposed or broadcast
// (stride-0) operands cost nothing extra; each distinct batch entry of w is
// packed once. Single-threaded: the engine calls many small products, and the
// benchmarks pin one thread.
//
// Instruction choices follow the FP pipes of the Zen 4 core these kernels
// were tuned on (measured with independent instruction streams): vmaxps /
// vminps / vaddps issue on two pipes, vmulps / FMA / vcmpps-to-mask on the
// other two, vblendmps and integer min/max on any of the four. So a max-plus
// term is an FMA (b·1 + a) plus a max — one op on each pair, as fast as an
// SGEMM's FMA — and the kernels with more maxes per term (max_prod, kmax)
// move what they can to blends. Per term and vector: max-plus / max-times
// 2 ops (0.5 cycle on the 4 pipes), max_prod 6 (1.5); kmax(4) a filter of
// 2 ops plus, for the vector-steps where a list can change (~17 % of a
// 512-deep product of real lists, 3 % of a 1376-deep one, with the lists
// warm-started: see kWarmPicks), a merge of 16 (see TopKMergeKernel::run_tile);
// products with K >= 256 take kmax's pruned rows instead (run_pruned_topk). On an Intel core (Sapphire
// Rapids) 512-bit FP ops issue on two ports only, so each op costs twice
// that (max-plus 1 cycle a vector: ≥ 2× an SGEMM's time at best).
// Measured at 64 tokens on the Llama shapes with a cached weight (1 thread,
// benchmarks/kernels.py): viterbi / max_abs ~0.9–1.0×, max_prod ~2.8–3.1×,
// kmax(4) ~7.5–9.4× the time of torch.mm of the same shape (Zen 4, per-step
// kmax merges); on Sapphire Rapids viterbi ~2.1–2.4×, kmax(4) with the
// segmented filter 6.6–12× (was 11–18×; benchmarks/README.md, 2026-11-26).
//
// One source, three instruction sets: the kernel is written with GCC vector
// extensions (tile_arithmetic.h) and instantiated inside functions marked
// __attribute__((target(...), flatten)), so the whole loop nest is compiled for
// AVX-512, AVX2 or the baseline ISA without any special build flag; the choice
// is made at run time with __builtin_cpu_supports.
#include "kernels/cpu_gemm.h"
#include "kernels/device_gemm.h"

// Vector types in template arguments trigger GCC's "ABI changed" notes; these
// functions are all internal, so the ABI of vector arguments never matters.
// (Before tile_arithmetic.h: its templates are instantiated with vectors.)
#pragma GCC diagnostic ignored "-Wpsabi"
#include "kernels/cpu_vectors.h"
#include "kernels/tile_arithmetic.h"

#include "kernels/lift_cache.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace torch_semiring {
namespace kernels {

bool kernel_dtype(const Tensor& g, const Tensor& w) {
  auto t = g.scalar_type();
  return g.device().is_cpu() && w.device().is_cpu() && (t == at::kFloat || t == at::kDouble) &&
         w.scalar_type() == t &&
         // The kernels are not differentiable: leave a graph-building call
         // (create_graph) to the generic ATen path. The engine otherwise runs
         // with grad mode off, where saved weights that require grad are fine.
         !(at::GradMode::is_enabled() && (g.requires_grad() || w.requires_grad()));
}

std::pair<double, double> range_of(const Tensor& t) {
  auto mm = at::aminmax(t);
  return {std::get<0>(mm).item<double>(), std::get<1>(mm).item<double>()};
}

namespace {

// One product of a batch: A = the value's components (strided), B = the
// packed lifted weights (pack_weight), C = output components, contiguous
// (M, N) each.
template <class T>
struct Job {
  int64_t M, N, K;
  const T* a;
  int64_t a_c, a_m, a_k;
  int64_t a_components;  // components present in g; packing pads the rest with the zero (kmax)
  const T* bpack;        // panel-major: panel p, then k, then NR lanes
  const T* colmax;       // (panels, colmax_stride(K)): max over panel p's columns of B[k, n] (pack_panels)
  T* c;
  int64_t c_c;
  int32_t* idx;  // argmax (M, N) per component, or nullptr
  int64_t i_c;   // component stride of idx
  T* apack;
};

// The packed B of one entry: the panels (panels·K·NR), then each panel's
// column maxima (panels·colmax_stride(K), for the pruned rows, run_pruned),
// the stride rounded up to 16 so a vector load past K stays inside.
inline int64_t colmax_stride(int64_t K) { return (K + 15) / 16 * 16; }
inline int64_t packed_entry_elems(int64_t K, int64_t N, int64_t NR) {
  const int64_t panels = (N + NR - 1) / NR;
  return panels * (K * NR + colmax_stride(K));
}

// Blocking: the B micro-panel (KC × NR) fills ~16 KB of L1, the packed A block
// (MC × KC × C) ~192 KB of L2.
constexpr int64_t kL1PanelBytes = 16 * 1024;
constexpr int64_t kL2BlockBytes = 192 * 1024;

template <class T, int C, int NR>
constexpr int64_t block_k() {
  return std::min<int64_t>(512, std::max<int64_t>(16, kL1PanelBytes / (NR * int64_t(sizeof(T)))));
}
template <class T, int C, int MR, int NR>
constexpr int64_t block_m() {
  return std::max<int64_t>(MR, kL2BlockBytes / (block_k<T, C, NR>() * C * int64_t(sizeof(T))) / MR * MR);
}

// One term with argmax bookkeeping: argmax_update for the one-component
// products (the index is k), the Op's own update_arg for the pairs of
// max_prod and kmax's lists (an index per component, see tile_arithmetic.h).
template <class Op, class V, class IV, class T, class I>
TS_TILE_FN void update_with_arg(V* acc, IV* arg, const T* a, V b, I k) {
  if constexpr (Op::kComponents == 1) {
    argmax_update<Op>(acc[0], arg[0], a[0], b, IV{} + k);
  } else {
    Op::update_arg(acc, arg, a, b, k);
  }
}

// Ops that run a whole tile themselves (kmax's TopKMergeKernel: a filter
// pass, then the merges) define `run_tile`; the others take one k at a time.
template <class Op, class = void>
struct has_segments : std::false_type {};
template <class Op>
struct has_segments<Op, std::void_t<decltype(Op::kSegment)>> : std::true_type {};

// acc (MR × NR per component) ⊕= ⊕_k A[:, k] ⊗ B[k, :] over kc steps.
// c: the tile in the output (ldc = row stride, cc = component stride), read
// back unless `first`; ix likewise for the argmax (ic = its component
// stride). A is packed in strips of PACKED >= MR rows (an edge kernel reads
// the first MR rows of a strip).
template <class Op, class T, class V, int MR, int NV, bool ARG, int PACKED>
TS_TILE_FN void micro_kernel_steps(int64_t kc, int64_t k0, const T* ap, const T* bp, T* c, int64_t ldc, int64_t cc,
                                   int32_t* ix, int64_t ldi, int64_t ic, bool first) {
  constexpr int L = sizeof(V) / sizeof(T), C = Op::kComponents, NR = NV * L;
  using I = LaneInt<T>;  // lane-wise masks: integers of T's width
  using IV = typename VecOf<I, sizeof(V)>::type;
  V acc[MR][NV][C];
  IV arg[MR][NV][ARG ? C : 1];
  _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) {
    _Pragma("GCC unroll 4") for (int j = 0; j < NV; ++j) {
      _Pragma("GCC unroll 2") for (int q = 0; q < C; ++q) {
        if (first) {
          acc[i][j][q] = V{} + Op::template zero<T>(q);
        } else {
          acc[i][j][q] = load<V>(c + q * cc + i * ldc + j * L);
        }
      }
      if constexpr (ARG) {
        _Pragma("GCC unroll 8") for (int q = 0; q < C; ++q) {
          if (first) {
            arg[i][j][q] = IV{} - 1;
          } else {
            for (int l = 0; l < L; ++l) arg[i][j][q][l] = ix[q * ic + i * ldi + j * L + l];
          }
        }
      }
    }
  }
  for (int64_t k = 0; k < kc; ++k) {
    V b[NV];
    _Pragma("GCC unroll 4") for (int j = 0; j < NV; ++j) b[j] = load<V>(bp + k * NR + j * L);
    const T* a = ap + k * PACKED * C;
    if constexpr (ARG) {
      const I kk = I(k0 + k);
      _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) {
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; ++j) {
          // strict >: ties → smallest k (the same function as the CUDA kernel's)
          update_with_arg<Op>(acc[i][j], arg[i][j], a + i * C, b[j], kk);
        }
      }
    } else {
      _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) {
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; ++j) Op::update(acc[i][j], a + i * C, b[j]);
      }
    }
  }
  _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) {
    _Pragma("GCC unroll 4") for (int j = 0; j < NV; ++j) {
      _Pragma("GCC unroll 2") for (int q = 0; q < C; ++q) store(c + q * cc + i * ldc + j * L, acc[i][j][q]);
      if constexpr (ARG)
        for (int q = 0; q < C; ++q)
          for (int l = 0; l < L; ++l) ix[q * ic + i * ldi + j * L + l] = int32_t(arg[i][j][q][l]);
    }
  }
}

template <class Op, class T, class V, int MR, int NV, bool ARG, int PACKED = MR>
TS_TILE_FN void micro_kernel(int64_t kc, int64_t k0, const T* ap, const T* bp, T* c, int64_t ldc, int64_t cc,
                             int32_t* ix, int64_t ldi, int64_t ic, bool first) {
  if constexpr (has_segments<Op>::value) {  // kmax (never with argmax: see WinnersJob)
    static_assert(!ARG, "kmax's tile runs without argmax");
    Op::template run_tile<T, V, MR, NV, PACKED>(kc, ap, bp, c, ldc, cc, first);
  } else {
    micro_kernel_steps<Op, T, V, MR, NV, ARG, PACKED>(kc, k0, ap, bp, c, ldc, cc, ix, ldi, ic, first);
  }
}

// The kernels' variants of an Op share its input marking (PackMark).
template <class Op>
using MarkingOf = typename std::conditional<std::is_base_of<MaxProdPair, Op>::value, MaxProdPair, Op>::type;

// Packs MR rows of g (k-major, components innermost) for kc steps from k0;
// rows past M are padded with 0 (never stored), missing components (kmax
// lists shorter than KP) with the zero. Every present entry is checked with
// Op::accepts and marked (PackMark); returns false if one is rejected.
template <class Op, class T, int MR>
TS_TILE_FN bool pack_a_strip(const Job<T>& J, int64_t r0, int64_t k0, int64_t kc, T* dst, int64_t from = 0,
                             bool ok = true) {
  constexpr int C = Op::kComponents;
  const int64_t comps = J.a_components;
  for (int64_t k = from; k < kc; ++k) {
    for (int i = 0; i < MR; ++i) {
      T* d = dst + (k * MR + i) * C;
      const int64_t m = r0 + i;
      if (m >= J.M) {
        for (int q = 0; q < C; ++q) d[q] = T(0);
        continue;
      }
      const T* src = J.a + m * J.a_m + (k0 + k) * J.a_k;
      for (int q = 0; q < C; ++q) d[q] = q < comps ? src[q * J.a_c] : Op::template zero<T>(q);
      ok &= Op::accepts(d, int(comps));
      PackMark<MarkingOf<Op>>::pack_a(d);
    }
  }
  return ok;
}

// kmax(4)'s strips, L k-steps at a time (contiguous k, a full strip, all four
// components present): four vector loads per row, a 4 × L transpose in two
// rounds of two-source shuffles, and L stores of the (k, component) quads —
// where the scalar loop above made 4·L strided loads, 4·L stores and 4·L
// compares (15 % of MiniLM-64's kmax(4) kernel in perf). The check is kmax's
// accepts (every score < +∞; NaN fails) as a lane compare; a transposed g's
// strips (m contiguous) one vector per component and k. viterbi's and
// max_abs's one-component strips below. Returns the k-steps packed (kmax(4):
// a multiple of L; the scalar loop does the rest) and clears `ok` on a
// rejected entry.
template <class Op, class T, class V, int MR>
TS_TILE_FN int64_t pack_a_strip_lanes(const Job<T>& J, int64_t r0, int64_t k0, int64_t kc, T* dst, bool& ok) {
  constexpr int L = sizeof(V) / sizeof(T);
  if constexpr (has_segments<Op>::value && Op::kComponents == 4 && (L == 16 || L == 8)) {
    const V inf = V{} + std::numeric_limits<T>::infinity();
    auto below_inf = V{} < inf;  // all lanes true
    if constexpr (MR <= L / 2) {
      // A transposed g (m contiguous: the attention's k and v products): per k, the strip's rows of each
      // component are one vector (its lanes past MR: entries of the next rows, which their own strips
      // check anyway), transposed into the MR (component) quads by two rounds of two-source shuffles
      // (AVX-512: rows 0-7, AVX2: rows 0-3, of which MR are kept; the scalar loop took 8 % of MiniLM-128's
      // kmax(4) kernel on AVX2).
      if (J.a_k != 1 && J.a_m == 1 && J.a_components == 4 && r0 + L <= J.M) {
        for (int64_t k = 0; k < kc; ++k) {
          const T* src = J.a + r0 + (k0 + k) * J.a_k;
          V x[4];
          for (int q = 0; q < 4; ++q) {
            x[q] = load<V>(src + q * J.a_c);
            below_inf &= x[q] < inf;
          }
          T quads[2 * L];  // L / 2 rows' quads
          if constexpr (L == 16) {
            const V y0 = __builtin_shufflevector(x[0], x[1], 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
            const V y2 = __builtin_shufflevector(x[2], x[3], 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
            store(quads, __builtin_shufflevector(y0, y2, 0, 1, 16, 17, 2, 3, 18, 19, 4, 5, 20, 21, 6, 7, 22, 23));
            store(quads + L, __builtin_shufflevector(y0, y2, 8, 9, 24, 25, 10, 11, 26, 27, 12, 13, 28, 29, 14, 15, 30, 31));
          } else {
            const V y0 = __builtin_shufflevector(x[0], x[1], 0, 8, 1, 9, 2, 10, 3, 11);
            const V y2 = __builtin_shufflevector(x[2], x[3], 0, 8, 1, 9, 2, 10, 3, 11);
            store(quads, __builtin_shufflevector(y0, y2, 0, 1, 8, 9, 2, 3, 10, 11));
            store(quads + L, __builtin_shufflevector(y0, y2, 4, 5, 12, 13, 6, 7, 14, 15));
          }
          std::memcpy(dst + k * MR * 4, quads, MR * 4 * sizeof(T));
        }
        for (int l = 0; l < L; ++l) ok &= below_inf[l] != 0;
        return kc;
      }
    }
    if (J.a_k != 1 || J.a_components != 4 || r0 + MR > J.M) return 0;
    const int64_t steps = kc / L * L;
    for (int i = 0; i < MR; ++i) {
      const T* src = J.a + (r0 + i) * J.a_m + k0;
      for (int64_t k = 0; k < steps; k += L) {
        V x[4];
        for (int q = 0; q < 4; ++q) {
          x[q] = load<V>(src + q * J.a_c + k);
          below_inf &= x[q] < inf;
        }
        V z[4];  // z[u]: the lists of k-steps k + uL/4 … k + (u+1)L/4 − 1, components innermost
        if constexpr (L == 16) {
          const V y0 = __builtin_shufflevector(x[0], x[1], 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
          const V y1 = __builtin_shufflevector(x[0], x[1], 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
          const V y2 = __builtin_shufflevector(x[2], x[3], 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
          const V y3 = __builtin_shufflevector(x[2], x[3], 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
          z[0] = __builtin_shufflevector(y0, y2, 0, 1, 16, 17, 2, 3, 18, 19, 4, 5, 20, 21, 6, 7, 22, 23);
          z[1] = __builtin_shufflevector(y0, y2, 8, 9, 24, 25, 10, 11, 26, 27, 12, 13, 28, 29, 14, 15, 30, 31);
          z[2] = __builtin_shufflevector(y1, y3, 0, 1, 16, 17, 2, 3, 18, 19, 4, 5, 20, 21, 6, 7, 22, 23);
          z[3] = __builtin_shufflevector(y1, y3, 8, 9, 24, 25, 10, 11, 26, 27, 12, 13, 28, 29, 14, 15, 30, 31);
          for (int u = 0; u < 4; ++u) {
            T* d = dst + ((k + 4 * u) * MR + i) * 4;
            store(d, __builtin_shufflevector(z[u], z[u], 0, 1, 2, 3));
            store(d + MR * 4, __builtin_shufflevector(z[u], z[u], 4, 5, 6, 7));
            store(d + 2 * MR * 4, __builtin_shufflevector(z[u], z[u], 8, 9, 10, 11));
            store(d + 3 * MR * 4, __builtin_shufflevector(z[u], z[u], 12, 13, 14, 15));
          }
        } else {
          const V y0 = __builtin_shufflevector(x[0], x[1], 0, 8, 1, 9, 2, 10, 3, 11);
          const V y1 = __builtin_shufflevector(x[0], x[1], 4, 12, 5, 13, 6, 14, 7, 15);
          const V y2 = __builtin_shufflevector(x[2], x[3], 0, 8, 1, 9, 2, 10, 3, 11);
          const V y3 = __builtin_shufflevector(x[2], x[3], 4, 12, 5, 13, 6, 14, 7, 15);
          z[0] = __builtin_shufflevector(y0, y2, 0, 1, 8, 9, 2, 3, 10, 11);
          z[1] = __builtin_shufflevector(y0, y2, 4, 5, 12, 13, 6, 7, 14, 15);
          z[2] = __builtin_shufflevector(y1, y3, 0, 1, 8, 9, 2, 3, 10, 11);
          z[3] = __builtin_shufflevector(y1, y3, 4, 5, 12, 13, 6, 7, 14, 15);
          for (int u = 0; u < 4; ++u) {
            T* d = dst + ((k + 2 * u) * MR + i) * 4;
            store(d, __builtin_shufflevector(z[u], z[u], 0, 1, 2, 3));
            store(d + MR * 4, __builtin_shufflevector(z[u], z[u], 4, 5, 6, 7));
          }
        }
      }
    }
    for (int l = 0; l < L; ++l) ok &= below_inf[l] != 0;
    return steps;
  } else if constexpr ((std::is_base_of<MaxPlus, Op>::value || std::is_base_of<MaxTimes, Op>::value) && L > 1) {
    // viterbi's and max_abs's strips (one component, a full strip; g with contiguous k): each row's kc entries
    // checked L at a time by one compare (viterbi: g < +inf; max_abs: g in [0, +inf), as (g + 0)'s bits
    // below +inf's), then copied into the strip — the scalar loop checked and marked one entry at a time,
    // ~5 instructions each: more than the micro-kernel spends per entry of A on the attention's k and v
    // products (N = the head dim).
    // A transposed g (m contiguous: the attention's k and v products) takes each k's MR values as one
    // piece, checked by the vectors that cover them (up to L − 1 entries of the next rows too: entries of
    // the same g, which its own strips check anyway).
    constexpr int kCover = (MR + L - 1) / L * L;
    if (J.a_components != 1 || r0 + MR > J.M || (J.a_k != 1 && (J.a_m != 1 || r0 + kCover > J.M))) return 0;
    using I = LaneInt<T>;
    using IV = typename VecOf<I, sizeof(V)>::type;
    using UV = typename VecOf<std::make_unsigned_t<I>, sizeof(V)>::type;
    const V inf = V{} + std::numeric_limits<T>::infinity();
    IV fine = IV{} - 1;
    auto check = [&](V x) __attribute__((always_inline)) {
      if constexpr (std::is_base_of<MaxTimes, Op>::value) fine &= (IV)((UV)(x + T(0)) < (UV)inf);
      else fine &= x < inf;
    };
    if (J.a_k != 1) {
      for (int64_t k = 0; k < kc; ++k) {
        const T* src = J.a + r0 + (k0 + k) * J.a_k;
        for (int c = 0; c < kCover; c += L) check(load<V>(src + c));
        std::memcpy(dst + k * MR, src, MR * sizeof(T));
      }
      for (int l = 0; l < L; ++l) ok &= fine[l] != 0;
      return kc;
    }
    for (int i = 0; i < MR; ++i) {
      const T* src = J.a + (r0 + i) * J.a_m + k0;
      int64_t k = 0;
      for (; k + L <= kc; k += L) check(load<V>(src + k));
      for (; k < kc; ++k) ok &= Op::accepts(src + k, 1);
      for (k = 0; k < kc; ++k) dst[k * MR + i] = src[k];
    }
    for (int l = 0; l < L; ++l) ok &= fine[l] != 0;
    return kc;
  } else {
    return 0;
  }
}

// A tile of mv <= MR rows and nv <= NR columns with an MR-row kernel reading
// strips packed PACKED rows high: straight into C when it fits exactly, else
// on a scratch tile whose valid part is copied.
template <class Op, class T, class V, int MR, int NV, bool ARG, int PACKED>
TS_TILE_FN void edge_tile(int64_t kc, int64_t k0, const T* ap, const T* bp, T* c, int64_t N, int64_t cc, int32_t* ix,
                          int64_t ic, bool first, int64_t mv, int64_t nv, T* tile, int32_t* tile_ix) {
  constexpr int L = sizeof(V) / sizeof(T), C = Op::kComponents, NR = NV * L;
  if (mv == MR && nv == NR) {
    micro_kernel<Op, T, V, MR, NV, ARG, PACKED>(kc, k0, ap, bp, c, N, cc, ix, N, ic, first);
    return;
  }
  if (!first) {
    for (int q = 0; q < C; ++q)
      for (int64_t i = 0; i < mv; ++i)
        for (int64_t n = 0; n < nv; ++n) tile[(q * MR + i) * NR + n] = c[q * cc + i * N + n];
    if (ARG)
      for (int q = 0; q < C; ++q)
        for (int64_t i = 0; i < mv; ++i)
          for (int64_t n = 0; n < nv; ++n) tile_ix[(q * MR + i) * NR + n] = ix[q * ic + i * N + n];
  }
  micro_kernel<Op, T, V, MR, NV, ARG, PACKED>(kc, k0, ap, bp, tile, NR, MR * NR, tile_ix, NR, MR * NR, first);
  for (int q = 0; q < C; ++q)
    for (int64_t i = 0; i < mv; ++i)
      for (int64_t n = 0; n < nv; ++n) c[q * cc + i * N + n] = tile[(q * MR + i) * NR + n];
  if (ARG)
    for (int q = 0; q < C; ++q)
      for (int64_t i = 0; i < mv; ++i)
        for (int64_t n = 0; n < nv; ++n) ix[q * ic + i * N + n] = tile_ix[(q * MR + i) * NR + n];
}

// The heights of the edge kernels for the last, partial strip of rows: a
// third and two thirds of MR (12 → 4, 8; 6 → 2, 4; 3 → 1, 2), else a half.
// M = 64 tokens with MR = 12 would otherwise compute 72 rows.
constexpr int edge_rows(int mr, int which) {
  return mr % 3 == 0 ? mr / 3 * which : std::max(1, mr / 2);
}

// kmax's warm start. The merges (TopKMergeKernel::run_tile) run for every
// vector-step in which a lane beats its list's E-th score, and a list filled
// from −∞ lets nearly every early step through. So each list starts instead
// as E copies of θ, the E-th best of a few of its own candidates — those of
// the row's kWarmPicks largest g[m, k, 0] — computed with the kernel's own
// merge and addition. θ ≤ the true E-th best t_E, and the lists end exactly
// as from −∞: every candidate above the running threshold (≤ t_E) is still
// merged, so the E-th score ends at t_E, the scores above it are all the
// candidates above it, and a slot left holding θ can only remain where θ =
// t_E, the same value. benchmarks/kmax_hits.py: on the decoder's real lists
// the share of vector-steps that merge drops from 0.23 to 0.17 (K = 512) and
// from 0.07 to 0.03 (K = 1376), for kWarmPicks merges per row and vector.
constexpr int64_t kWarmPicks = 8;

// The most picks a row takes (kWarmPicks here, kTopKPicks for the pruned rows).
constexpr int64_t kMaxPicks = 16;
static_assert(kWarmPicks <= kMaxPicks, "warm_picks holds at most kMaxPicks");

// picks (M, R): per row m the k of its R largest g[m, k, 0] (R <= min(kMaxPicks, K)),
// ties to the smaller k.
//
// Cost: a scalar insertion test per entry mispredicts at each insertion
// (~R·ln(K/R) a row, 7 % of MiniLM-64's kmax(4) kernel in perf), so where g's
// rows are contiguous the row is first reduced to W lane maxima (G vectors
// of L lanes, W = G·L >= R, over the residue classes of k mod W) — W
// entries of the row, so their R-th largest τ is at most the row's R-th
// largest — and only the entries ≥ τ (a mask per vector: R to a few times R)
// go through the insertion. An entry below τ has R entries above it: it is
// never among the picks, and skipping it changes none (the insertion keeps
// the R largest, first come first kept, whatever else it saw).
template <class T, class V>
TS_TILE_FN void warm_picks(const Job<T>& J, int64_t R, int32_t* picks) {
  constexpr int L = sizeof(V) / sizeof(T);
  constexpr int kMaxG = (kMaxPicks + L - 1) / L;
  T best[kMaxPicks];
  for (int64_t m = 0; m < J.M; ++m) {
    int32_t* row = picks + m * R;
    int64_t n = 0;
    const T* a = J.a + m * J.a_m;
    auto insert = [&](int64_t k) __attribute__((always_inline)) {
      const T x = a[k * J.a_k];
      if (n == R && !(x > best[R - 1])) return;
      int64_t q = n < R ? n++ : R - 1;  // insertion into the descending best[0, n)
      for (; q > 0 && best[q - 1] < x; --q) best[q] = best[q - 1], row[q] = row[q - 1];
      best[q] = x, row[q] = int32_t(k);
    };
    const int64_t G = (R + L - 1) / L, W = G * L;
    const int64_t vec_k = J.a_k == 1 ? J.K / W * W : 0;
    if (vec_k > 0) {
      V lane_max[kMaxG];
      for (int g = 0; g < kMaxG; ++g) lane_max[g] = V{} - std::numeric_limits<T>::infinity();
      for (int64_t k = 0; k < vec_k; k += W)
        for (int64_t g = 0; g < G; ++g) lane_max[g] = max_keep(lane_max[g], load<V>(a + k + g * L));  // (NaN: never kept)
      T lanes[kMaxG * L];
      for (int64_t g = 0; g < G; ++g)
        for (int l = 0; l < L; ++l) lanes[g * L + l] = lane_max[g][l];
      std::nth_element(lanes, lanes + (R - 1), lanes + W, [](T x, T y) { return x > y; });
      const V tau = V{} + lanes[R - 1];
      for (int64_t k = 0; k < vec_k; k += L)
        for (uint32_t h = lanes_where<kAtLeast>(load<V>(a + k), tau); h; h &= h - 1) insert(k + __builtin_ctz(h));
      for (int64_t k = vec_k; k < J.K; ++k) insert(k);
    }
    if (n < R) {  // (no vector pass, or fewer than R entries passed it: NaN lanes) the plain scan
      n = 0;
      for (int64_t k = 0; k < J.K; ++k) insert(k);
    }
    for (; n < R; ++n) row[n] = row[0];  // (K < R cannot happen: R ≤ K; NaN never passes the compares)
  }
}

// The lists of the tile's outputs (rows r0 + [0, mv), columns n0 + [0, nv) of
// panel p) start as E copies of θ (see kWarmPicks).
template <class Op, class T, class V, int NV>
TS_TILE_FN void warm_fill(const Job<T>& J, const int32_t* picks, int64_t R, int64_t p, int64_t r0, int64_t mv,
                          int64_t n0, int64_t nv) {
  constexpr int L = sizeof(V) / sizeof(T), E = Op::kComponents, NR = NV * L;
  const int64_t comps = J.a_components;
  for (int64_t i = 0; i < mv; ++i) {
    const int64_t m = r0 + i;
    V acc[NV][E];
    for (int j = 0; j < NV; ++j)
      for (int q = 0; q < E; ++q) acc[j][q] = V{} - std::numeric_limits<T>::infinity();
    for (int64_t r = 0; r < R; ++r) {
      const int64_t k = picks[m * R + r];
      T a[E];
      const T* src = J.a + m * J.a_m + k * J.a_k;
      for (int q = 0; q < E; ++q) a[q] = q < comps ? src[q * J.a_c] : -std::numeric_limits<T>::infinity();
      for (int j = 0; j < NV; ++j)
        Op::merge(acc[j], a, load<V>(J.bpack + (p * J.K + k) * NR + j * L), typename Op::Exchange{});
    }
    T* c = J.c + m * J.N + n0;
    for (int j = 0; j < NV; ++j) {
      if ((j + 1) * L <= nv) {
        for (int q = 0; q < E; ++q) store(c + q * J.c_c + j * L, acc[j][E - 1]);
      } else {
        alignas(64) T theta[L];
        store(theta, acc[j][E - 1]);
        for (int64_t n = j * L; n < nv; ++n)
          for (int q = 0; q < E; ++q) c[q * J.c_c + n] = theta[n - j * L];
      }
    }
  }
}

// ---- max-plus / max-times / max_prod with the k that cannot win skipped -------
//
// viterbi's and max_abs's products (and their argmax versions) and max_prod's
// by rows, where they beat the blocked kernel (pruned_rows_pay: below AVX-512
// viterbi's and max_abs's plain products take the blocked kernel): each row and panel of NR columns visits only the k that can reach
// an output. An output's maximum is at least θ, the smallest over the panel's
// columns of the row's candidates from its picks (the largest g[m, k] of each
// residue class k mod L: real terms, so lower bounds); a k whose bound
// g[m, k] ⊗ max_n B[k, n] (n over the panel; the column maxima are packed with
// B, once per weight version) is below θ has every term below every output's
// maximum, strictly, so it changes neither a value nor (ties → smallest k) an
// argmax. Both roundings are monotone (B[k, n] ≤ max ⇒ fl(g ⊗ B[k, n]) ≤
// fl(g ⊗ max)), so the bound holds in floating point and the result is
// bit-identical to the blocked kernel's. max_prod's pair (M, m) bounds both
// ends at once: every term of k has |term| ≤ fl(a_k · max_n |w[k, n]|), a_k =
// max(|M_k|, |m_k|) (the picks: the largest a_k), so k is skipped when that is
// below both θ_M (the picks' smallest maximum, a lower bound on every M out)
// and −θ_m (θ_m the picks' largest minimum, an upper bound on every m out) —
// only where the panel's outputs have M > 0 > m, as a transformer's do. Its
// picks are the two largest a_k of each class: a pick helps θ_M only on the
// columns where w's sign meets the larger of its M, |m|, so one per class left
// MiniLM-64's products keeping 19–62 % of the k; two keep 13–57 % (the
// decoder's max_prod backward: 4.3–4.4 → 3.6–3.7 × stock). viterbi and
// max_abs gained nothing from a second pick.
// The survivors are visited in increasing k with the same term, in kChains
// interleaved accumulators (one chain is bound by the max's latency), merged
// as ⊕ with ties to the smaller k. Panels outer, rows inner, so a panel's B
// stays in cache for all rows.
// Measured (AVX-512, an Intel Xeon, 2026-11-27): on MiniLM-64's viterbi backward 80 % of the k are skipped; with a
// cached weight, µs a product: 64×384×384 253 → 145, 64×1536×384 1039 → 385,
// the decoder's 64×1376×512 1226 → 530 (a 12 × 32 tile's own bound, the
// blocked kernel's granularity, skips only 5–35 %: its rows' maxima differ
// too much). Where the first panel keeps more than a third of the k (max_prod: a half; rows whose
// maxima spread little), the blocked kernel takes the product over.
// Cost per row and panel: L·NV terms for θ, K/L bound vectors (an add or
// multiply and a compare each), survivors·NV terms.
constexpr int64_t kPruneMinK = 256;
// More than this share of the k surviving the first panel: the blocked kernel. max_prod's pair takes the
// rows up to a half: on MiniLM's output.dense products (K 384, 35-40 % kept) the rows took 2.6-2.8 ms where
// the blocked kernel took 3.3 (Sapphire Rapids, 1 thread). With update_row, the whole max_prod backward
// (alternating builds, 2026-11-27): MiniLM-64 4.37-4.77 -> 4.16-4.61 x stock, MiniLM-128 5.31-5.80 -> 4.78-5.21.
constexpr int64_t kPruneMaxKept[2][2] = {{1, 3}, {1, 2}};  // [one component, max_prod's pair]

// viterbi's and max_abs's kernels (MaxPlus, MaxTimes and their instruction-choice subclasses), with or
// without argmax; max_prod's pair without (its argmax version, for paths, keeps the blocked kernel).
template <class Op, bool ARG>
constexpr bool prunable() {
  return std::is_base_of<MaxPlus, Op>::value || std::is_base_of<MaxTimes, Op>::value ||
         (std::is_base_of<MaxProdPair, Op>::value && !ARG);
}

// Where the pruned rows beat the blocked kernel, as measured: max_prod's pair (6 operations a term in the
// blocked tile), kmax's lists of k >= 2 and the argmax products (their tiles hold half the rows) on every
// ISA; the one-value products (viterbi, max_abs, kmax(1)) only with 512-bit vectors (where they were measured
// faster on an Intel Xeon, 2026-11-27: see run_pruned; no AVX-512 machine since to re-measure). On AVX2 (Zen 3, 1
// thread, each linear layer's product with its real values, 2026-12-06) the blocked tile — 16 ymm, no
// spill since 430a645 — is faster at every transformer shape measured: MiniLM-128's 36 products viterbi
// 46.0 → 38.9 ms, max_abs 53.3 → 36.0 (torch.mm 32.5), BERT-base's 72: 406 → 326 and 399 → 274 (mm 274-292);
// the portable ISA's pruned rows ran 3.4× its blocked kernel. The pruned rows' scan of every k per row and
// panel costs more there than the ~80 % of the terms it skips. (The whole MiniLM-128 backward: viterbi
// 2.79 → 2.61 × stock, max_abs 2.53 → 2.25, kmax(1) 3.47 → 3.23; kmax(4) 7.86 with them, 9.58 without;
// max_prod 4.00 with, 4.75 without; top_paths(k=1) 226 with, 287 ms without.)
template <class Op, class V, bool ARG>
constexpr bool pruned_rows_pay() {
  return ARG || Op::kComponents > 1 || sizeof(V) == 64;
}

// TORCH_SEMIRING_GEMM_PRUNE (read per product): unset, the pruned rows where they pay (pruned_rows_pay);
// 0, never; 1, wherever they apply — so the tests compare them with the blocked kernel on every ISA.
bool take_pruned_rows(bool pays) {
  const char* v = std::getenv("TORCH_SEMIRING_GEMM_PRUNE");
  if (!v) return pays;
  return std::strcmp(v, "0") != 0;
}

// The largest (Max) or smallest lane of v: halving shuffles down to 4 lanes, then those.
template <bool Max, class V>
TS_TILE_FN auto reduce_lanes(V v) {
  constexpr int L = sizeof(V) / sizeof(v[0]);
  auto pick = [](V x, V y) __attribute__((always_inline)) { return Max ? max_keep(x, y) : min_keep(x, y); };
  if constexpr (L == 16) {
    v = pick(v, __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
    v = pick(v, __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));
  } else if constexpr (L == 8) {
    v = pick(v, __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3));
  }
  auto out = v[0];
  for (int l = 1; l < (L < 4 ? L : 4); ++l) out = Max ? (v[l] > out ? v[l] : out) : (v[l] < out ? v[l] : out);
  return out;
}

enum class Pruned { kDone, kDeclined, kNotPaying };

template <class Op, class T, class V, int NV, bool ARG>
TS_TILE_FN Pruned run_pruned(const Job<T>& J) {
  constexpr int L = sizeof(V) / sizeof(T), NR = NV * L;
  constexpr int kChains = ARG ? 2 : 4;
  constexpr bool kTimes = std::is_base_of<MaxTimes, Op>::value;
  constexpr bool kPair = std::is_base_of<MaxProdPair, Op>::value;  // max_prod: (M, m), both ends bounded
  constexpr int C = kPair ? 2 : 1;  // components of a value
  constexpr int kRows = kPair ? 3 : 1;  // per row of g: its components, and for the pair a_k = max(|M|, |m|)
  static_assert(!(kPair && ARG), "max_prod's argmax product is not pruned");
  constexpr T inf = std::numeric_limits<T>::infinity();
  using I = LaneInt<T>;
  using IV = typename VecOf<I, sizeof(V)>::type;
  const int64_t M = J.M, N = J.N, K = J.K, panels = (N + NR - 1) / NR;
  const int64_t Kv = (K + L - 1) / L * L;
  thread_local std::vector<T> scratch;
  thread_local std::vector<int32_t> survivors, all_picks;
  scratch.resize(size_t(M * Kv * kRows));
  survivors.resize(size_t(Kv + 16));
  constexpr int kPicks = kPair ? 2 * L : L;  // the pair: the two largest keys of each class
  all_picks.resize(size_t(M * kPicks));
  const int64_t cm_stride = colmax_stride(K);
  IV lane;
  for (int l = 0; l < L; ++l) lane[l] = I(l);
  int32_t* surv = survivors.data();
  // Each row of g once: copied (padded: no term), checked, its picks — the
  // largest bound key (g; the pair's a_k) of each residue class k mod L, one vector pass.
  for (int64_t m = 0; m < M; ++m) {
    const T* a = J.a + m * J.a_m;
    T* row = scratch.data() + m * Kv * kRows;
    T* key = row + (kRows - 1) * Kv;
    if constexpr (kPair) {
      // L k at a time where g's entries are contiguous: MaxProdPairKernel::accepts (no NaN; M >= m or
      // M = -inf) as bit masks of single compares, the empty value marked by selects on one compare each
      // (GCC builds masks joined by & or | lane by lane), key = max(|M|, |m|) (NaN when empty) — the scalar
      // loop below, which takes the rest, did it one k at a time (~14 % of a MiniLM max_prod product)
      int64_t k = 0;
      if (J.a_k == 1) {
        constexpr uint32_t kAll = L >= 32 ? ~0u : (1u << L) - 1;
        const V nan = V{} + std::numeric_limits<T>::quiet_NaN(), minus_inf = V{} - inf;
        for (; k + L <= K; k += L) {
          const V hi = load<V>(a + k), lo = load<V>(a + J.a_c + k);
          const uint32_t ordered = lanes_where<kAtLeast>(hi, lo);  // M >= m, neither NaN
          const uint32_t empty = lanes_where<kEqual>(hi, minus_inf) & lanes_where<kEqual>(lo, lo);
          if ((ordered | empty) != kAll) return Pruned::kDeclined;
          const V M_k = hi == minus_inf ? nan : hi, m_k = hi == minus_inf ? nan : lo;
          const V aM = M_k < T(0) ? -M_k : M_k, am = m_k < T(0) ? -m_k : m_k;
          store(row + k, M_k), store(row + Kv + k, m_k), store(key + k, aM > am ? aM : am);
        }
      }
      for (; k < K; ++k) {
        T v[2] = {a[k * J.a_k], a[J.a_c + k * J.a_k]};
        if (!Op::accepts(v, 2)) return Pruned::kDeclined;
        PackMark<MaxProdPair>::pack_a(v);  // an empty value: NaN, no term (its key NaN: never survives)
        row[k] = v[0], row[Kv + k] = v[1];
        const T hi = std::abs(v[0]), lo = std::abs(v[1]);
        key[k] = hi > lo ? hi : lo;
      }
      for (int64_t k = K; k < Kv; ++k) row[k] = row[Kv + k] = key[k] = std::numeric_limits<T>::quiet_NaN();
    } else {
      if (J.a_k == 1) {
        std::memcpy(row, a, size_t(K) * sizeof(T));
      } else {
        for (int64_t k = 0; k < K; ++k) row[k] = a[k * J.a_k];
      }
      for (int64_t k = K; k < Kv; ++k) row[k] = Op::template zero<T>(0);
    }
    V top = V{} + (kPair ? T(-1) : Op::template zero<T>(0)), second = top;
    IV at = lane, at2 = lane, fine = IV{} - 1;  // Op::accepts: g < +∞, no NaN; max_abs: g ≥ 0
    for (int64_t k0 = 0; k0 < Kv; k0 += L) {
      const V x = load<V>(key + k0);
      if constexpr (kTimes) {
        // x in [0, +inf), no NaN, by one compare (GCC builds two compares joined by & lane by lane):
        // x + 0 makes -0 into +0, then as unsigned integers exactly [+0, +inf) lie below +inf's bits
        using UV = typename VecOf<std::make_unsigned_t<I>, sizeof(V)>::type;
        fine &= (UV)(x + T(0)) < (UV)(V{} + inf);
      }
      else if constexpr (!kPair) fine &= x < inf;
      const auto better = x > top;
      if constexpr (kPair) {
        const auto runner_up = x > second;
        second = better ? top : (runner_up ? x : second);
        at2 = better ? at : (runner_up ? lane + I(k0) : at2);
      }
      top = better ? x : top;
      at = better ? lane + I(k0) : at;
    }
    for (int l = 0; l < L; ++l) {
      if (!fine[l]) return Pruned::kDeclined;
      all_picks[m * kPicks + l] = int32_t(at[l]);
      if constexpr (kPair) all_picks[m * kPicks + L + l] = int32_t(at2[l]);
    }
  }
  // One term of k into a value's accumulators (acc[0 .. C)).
  auto add_term = [](V* acc, const T* row, int64_t Kv_, int64_t k, V b) __attribute__((always_inline)) {
    if constexpr (kPair) {
      Op::update_row(acc[0], acc[1], row[k], row[Kv_ + k], b);
    } else {
      acc[0] = max_keep(acc[0], Op::term(row[k], b));
    }
  };
  int64_t kept = 0;  // survivors of the first panel, all rows
  // Panels outer, rows inner: a panel's B is reused by every row while it is in cache.
  for (int64_t p = 0; p < panels; ++p) {
    for (int64_t m = 0; m < M; ++m) {
      const T* row = scratch.data() + m * Kv * kRows;
      const T* key = row + (kRows - 1) * Kv;
      const int32_t* picks = all_picks.data() + m * kPicks;
      constexpr int np = kPicks;
      const int64_t nv = std::min<int64_t>(NR, N - p * NR);
      const T* bp = J.bpack + p * K * NR;
      // θ: the smallest over the panel's columns of the picks' best terms
      // (the pair: also the largest of their smallest, θ_m)
      V lower[NV][C];
      _Pragma("GCC unroll 4") for (int j = 0; j < NV; ++j) {
        for (int c = 0; c < C; ++c) lower[j][c] = V{} + Op::template zero<T>(c);
      }
      _Pragma("GCC unroll 16") for (int r = 0; r < np; ++r) {
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; ++j)
          add_term(lower[j], row, Kv, picks[r], load<V>(bp + picks[r] * NR + j * L));
      }
      V low = V{} + inf, high = V{} - inf;
      _Pragma("GCC unroll 4") for (int j = 0; j < NV; ++j) {
        const auto in_panel = lane + I(j * L) < I(nv);
        low = min_keep(low, in_panel ? lower[j][0] : V{} + inf);
        if constexpr (kPair) high = max_keep(high, in_panel ? lower[j][1] : V{} - inf);
      }
      T theta = reduce_lanes<false>(low);
      if constexpr (kPair) {
        const T theta_m = reduce_lanes<true>(high);
        theta = -theta_m < theta ? -theta_m : theta;  // k survives if its |term| bound reaches either end
      }
      // the survivors, in increasing k
      const V theta_v = V{} + theta;
      const T* cm = J.colmax + p * cm_stride;
      int64_t ns = 0;
      for (int64_t k0 = 0; k0 < Kv; k0 += L) {
        const V g = load<V>(key + k0), c = load<V>(cm + k0);
        uint32_t h = lanes_where<kAtLeast>(kTimes || kPair ? g * c : g + c, theta_v);
        if (k0 + L > K) h &= (1u << (K - k0)) - 1;  // the padding
        ns += append_lanes<V>(surv + ns, h, int32_t(k0));
      }
      if (p == 0) kept += ns;
      // the survivors' terms, kChains interleaved chains per vector
      V acc[kChains][NV][C];
      IV arg[kChains][NV];
      _Pragma("GCC unroll 4") for (int q = 0; q < kChains; ++q) {
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; ++j) {
          for (int c = 0; c < C; ++c) acc[q][j][c] = V{} + Op::template zero<T>(c);
          arg[q][j] = IV{} - 1;
        }
      }
      int64_t s = 0;
      for (; s + kChains <= ns; s += kChains) {
        _Pragma("GCC unroll 4") for (int q = 0; q < kChains; ++q) {
          const int64_t k = surv[s + q];
          _Pragma("GCC unroll 4") for (int j = 0; j < NV; ++j) {
            const V b = load<V>(bp + k * NR + j * L);
            if constexpr (ARG) argmax_update<Op>(acc[q][j][0], arg[q][j], row[k], b, IV{} + I(k));
            else add_term(acc[q][j], row, Kv, k, b);
          }
        }
      }
      for (; s < ns; ++s) {  // the rest on chain 0 (constant indices: acc stays in registers; still increasing k)
        const int64_t k = surv[s];
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; ++j) {
          const V b = load<V>(bp + k * NR + j * L);
          if constexpr (ARG) argmax_update<Op>(acc[0][j][0], arg[0][j], row[k], b, IV{} + I(k));
          else add_term(acc[0][j], row, Kv, k, b);
        }
      }
      // ⊕ of the chains: the larger value (the pair's m: the smaller); equal values to the smaller k
      // (−1: nothing yet)
      _Pragma("GCC unroll 4") for (int q = 1; q < kChains; ++q) {
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; ++j) {
          if constexpr (ARG) {
            const auto take = (acc[q][j][0] > acc[0][j][0]) |
                              ((acc[q][j][0] == acc[0][j][0]) & (arg[q][j] >= 0) &
                               ((arg[0][j] < 0) | (arg[q][j] < arg[0][j])));
            acc[0][j][0] = take ? acc[q][j][0] : acc[0][j][0];
            arg[0][j] = take ? arg[q][j] : arg[0][j];
          } else {
            acc[0][j][0] = max_keep(acc[0][j][0], acc[q][j][0]);
            if constexpr (kPair) acc[0][j][1] = min_keep(acc[0][j][1], acc[q][j][1]);
          }
        }
      }
      T* c = J.c + m * N + p * NR;
      int32_t* ix = J.idx ? J.idx + m * N + p * NR : nullptr;
      for (int j = 0; j < NV; ++j)
        for (int l = 0; l < L && j * L + l < nv; ++l) {
          for (int q = 0; q < C; ++q) c[q * J.c_c + j * L + l] = acc[0][j][q][l];
          if constexpr (ARG) ix[j * L + l] = int32_t(arg[0][j][l]);
        }
    }
    // Rows whose maxima spread too little for the bound: the blocked kernel
    // (which overwrites C) is faster than terms visited one row at a time.
    if (p == 0 && panels > 1 && kept * kPruneMaxKept[kPair][1] > M * K * kPruneMaxKept[kPair][0]) return Pruned::kNotPaying;
  }
  return Pruned::kDone;
}

// ---- kmax with the k that cannot enter a list skipped ------------------------
//
// kmax's products by rows, as run_pruned does for the max semirings: each row
// and panel of NR columns visits only the k that can enter one of the
// panel's lists. The row's R = kTopKPicks largest g[m, k, 0] (its picks) are
// merged first, for real, into the panel's lists; θ, the smallest over the
// panel's columns of their E-th scores, is at most every output's final E-th
// score t_E. g's lists descend, so every candidate of k is at most
// fl(g[m, k, 0] + max_n B[k, n]) (both roundings monotone); a k whose bound
// is below θ has every candidate below every column's t_E — none of them in
// a list, whose values are the top E of the union — and is skipped. The
// picks' g[m, k, 0] are then NaN in the row's copy (their candidates are in
// the lists already; NaN never passes the bound), so no candidate is merged
// twice. The survivors' candidates are filtered and merged one row at a
// time, with the lists and their E-th scores in registers: the threshold is
// fresh after every merge, where the blocked kernel's is a segment old. A
// list holds values only, and the top E of a union do not depend on the
// order of its parts: the lists are bit-identical to the blocked kernel's.
// Measured on MiniLM-128's kmax(4) backward (AVX2, 2026-11-28): the first
// panel keeps 5-42 % of the k of its 36 products (median 15 %; a replay in
// float64 kept ~1.6× as many with 8 picks); the backward went from 421 to
// 351 ms, of which a branch per survivor and vector (the merges'
// mispredictions) had cost 26 ms: hence the filter's hit lists.
// Cost per row and panel: R·NV merges, K/L bound vectors (an add and a
// compare), survivors·NV filter terms (an add, a compare, a mask test) and
// a merge per hit; each row of g is copied once (E components, checked).
constexpr int64_t kTopKPicks = 16;
// More than this share of the k surviving the first panel: the blocked kernel.
constexpr int64_t kPruneTopKMaxKept[2] = {1, 2};
static_assert(kTopKPicks <= kMaxPicks, "warm_picks holds at most kMaxPicks");

template <class Op, class T, class V, int NV>
TS_TILE_FN Pruned run_pruned_topk(const Job<T>& J) {
  constexpr int L = sizeof(V) / sizeof(T), NR = NV * L, E = Op::kComponents;
  static_assert(std::is_base_of<MaxPlus, typename Op::Addition>::value, "kmax's terms are sums a + b");
  using I = LaneInt<T>;
  using IV = typename VecOf<I, sizeof(V)>::type;
  constexpr T inf = std::numeric_limits<T>::infinity();
  const T nan = std::numeric_limits<T>::quiet_NaN();
  const int64_t M = J.M, N = J.N, K = J.K, panels = (N + NR - 1) / NR, comps = J.a_components;
  const int64_t Kv = (K + L - 1) / L * L, R = std::min(kTopKPicks, K);
  thread_local std::vector<T> scratch, pick_values;
  thread_local std::vector<int32_t> survivors, all_picks, hit_lists;
  scratch.resize(size_t(M * Kv * E));
  pick_values.resize(size_t(M * R * E));
  hit_lists.resize(size_t(NV * (Kv + 16)));
  int32_t* hits = hit_lists.data();
  V thr[NV];
  survivors.resize(size_t(Kv + 16));
  all_picks.resize(size_t(M * R));
  // Each row of g once: its components copied (component-major; k past K: NaN, no term), each present
  // entry checked as Op::accepts does (< +∞, no NaN), absent components the zero (−∞).
  for (int64_t m = 0; m < M; ++m) {
    T* row = scratch.data() + m * Kv * E;
    const T* a = J.a + m * J.a_m;
    for (int q = 0; q < E; ++q) {
      T* rq = row + q * Kv;
      if (q >= comps) {
        std::fill(rq, rq + Kv, -inf);
        continue;
      }
      const T* src = a + q * J.a_c;
      if (J.a_k == 1) {
        std::memcpy(rq, src, size_t(K) * sizeof(T));
      } else {
        for (int64_t k = 0; k < K; ++k) rq[k] = src[k * J.a_k];
      }
      std::fill(rq + K, rq + Kv, nan);
      IV fine = IV{} - 1;
      for (int64_t k0 = 0; k0 + L <= K; k0 += L) fine &= load<V>(rq + k0) < inf;
      for (int l = 0; l < L; ++l)
        if (!fine[l]) return Pruned::kDeclined;
      for (int64_t k = K / L * L; k < K; ++k)
        if (!(rq[k] < inf)) return Pruned::kDeclined;
    }
  }
  {  // the picks (the row's copy read as a contiguous g), their lists kept, their g[m, k, 0] marked
    Job<T> rows = J;
    rows.a = scratch.data(), rows.a_m = Kv * E, rows.a_k = 1;
    warm_picks<T, V>(rows, R, all_picks.data());
    for (int64_t m = 0; m < M; ++m) {
      T* row = scratch.data() + m * Kv * E;
      for (int64_t r = 0; r < R; ++r) {
        const int64_t k = all_picks[m * R + r];
        for (int q = 0; q < E; ++q) pick_values[(m * R + r) * E + q] = row[q * Kv + k];
      }
      for (int64_t r = 0; r < R; ++r) row[all_picks[m * R + r]] = nan;
    }
  }
  IV lane;
  for (int l = 0; l < L; ++l) lane[l] = I(l);
  int32_t* surv = survivors.data();
  const int64_t cm_stride = colmax_stride(K);
  int64_t kept = 0;  // survivors of the first panel, all rows
  // Panels outer, rows inner: a panel's B is reused by every row while it is in cache.
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t nv = std::min<int64_t>(NR, N - p * NR);
    const T* bp = J.bpack + p * K * NR;
    const T* cm = J.colmax + p * cm_stride;
    uint32_t in_panel[NV];  // the lanes of each vector that are columns (an edge panel's others: padding)
    for (int j = 0; j < NV; ++j) {
      const int64_t cols = std::max<int64_t>(0, std::min<int64_t>(L, nv - j * L));
      in_panel[j] = cols == 32 ? ~0u : (1u << cols) - 1;
    }
    for (int64_t m = 0; m < M; ++m) {
      const T* row = scratch.data() + m * Kv * E;
      V list[NV][E];
      _Pragma("GCC unroll 4") for (int j = 0; j < NV; ++j) {
        _Pragma("GCC unroll 8") for (int q = 0; q < E; ++q) list[j][q] = V{} - inf;
      }
      for (int64_t r = 0; r < R; ++r) {
        const T* a = pick_values.data() + (m * R + r) * E;
        const int64_t k = all_picks[m * R + r];
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; ++j)
          Op::merge(list[j], a, load<V>(bp + k * NR + j * L), typename Op::Exchange{});
      }
      V low = V{} + inf;
      _Pragma("GCC unroll 4") for (int j = 0; j < NV; ++j) {
        low = min_keep(low, lane + I(j * L) < I(nv) ? list[j][E - 1] : V{} + inf);
      }
      const V theta = V{} + reduce_lanes<false>(low);
      int64_t ns = 0;
      for (int64_t k0 = 0; k0 < Kv; k0 += L) {  // (NaN: a pick or the padding, never kept)
        const V bound = load<V>(row + k0) + load<V>(cm + k0);
        ns += append_lanes<V>(surv + ns, lanes_where<kAtLeast>(bound, theta), int32_t(k0));
      }
      if (p == 0) kept += ns;
      // the filter, without a branch: per survivor and vector, is a[0] + b above the E-th score the picks
      // left? The hits' k are listed per vector, then merged (a merge that no longer beats the list, its
      // E-th score having risen since, changes nothing).
      int64_t nh[NV] = {};
      _Pragma("GCC unroll 4") for (int j = 0; j < NV; ++j) thr[j] = list[j][E - 1];
      for (int64_t s = 0; s < ns; ++s) {
        const int32_t k = surv[s];
        const V a0 = V{} + row[k];  // (one broadcast for the NV vectors)
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; ++j) {
          const uint32_t hit = lanes_where<kGreater>(a0 + load<V>(bp + k * NR + j * L), thr[j]);
          hits[j * (Kv + 16) + nh[j]] = k;
          nh[j] += (hit & in_panel[j]) != 0;
        }
      }
      _Pragma("GCC unroll 4") for (int j = 0; j < NV; ++j) {
        for (int64_t h = 0; h < nh[j]; ++h) {
          const int64_t k = hits[j * (Kv + 16) + h];
          T a[E];
          _Pragma("GCC unroll 8") for (int q = 0; q < E; ++q) a[q] = row[q * Kv + k];
          Op::merge(list[j], a, load<V>(bp + k * NR + j * L), typename Op::Exchange{});
        }
      }
      T* c = J.c + m * N + p * NR;
      for (int j = 0; j < NV; ++j) {
        if ((j + 1) * L <= nv) {
          _Pragma("GCC unroll 8") for (int q = 0; q < E; ++q) store(c + q * J.c_c + j * L, list[j][q]);
        } else {
          for (int q = 0; q < E; ++q)
            for (int64_t l = 0; l < nv - j * L; ++l) c[q * J.c_c + j * L + l] = list[j][q][l];
        }
      }
    }
    // Rows whose candidates spread too little for the bound: the blocked kernel (which overwrites C).
    if (p == 0 && panels > 1 && kept * kPruneTopKMaxKept[1] > M * K * kPruneTopKMaxKept[0]) return Pruned::kNotPaying;
  }
  return Pruned::kDone;
}

// The pruned rows copy every row of g first (viterbi's and max_abs's once,
// max_prod's three rows a row, kmax's its E components), into a scratch kept
// per thread: products whose copy would pass this take the blocked kernel,
// which packs a block at a time. (MiniLM's and BERT-base's products at 512
// tokens copy at most 25 MiB.) Taking the rows in blocks of a bounded copy
// instead measured 4 % slower on MiniLM-128's kmax(4) backward (7.34-7.43 ->
// 7.64-7.65 x stock, alternating builds while CI shared the other core,
// 2026-11-28 — near what such runs resolve), so it was left for later.
constexpr int64_t kPruneScratchBytes = int64_t(64) << 20;
inline bool pruned_scratch_fits(int64_t M, int64_t K, int64_t bytes_per_entry) {
  return M * (K + 16) * bytes_per_entry <= kPruneScratchBytes;
}

// The whole product of one batch entry; false (and a partial C) when an entry
// of g is outside what Op::accepts.
template <class Op, class T, class V, int MR, int NV, bool ARG>
TS_TILE_FN bool run_job(const Job<T>& J) {
  constexpr int L = sizeof(V) / sizeof(T), C = Op::kComponents, NR = NV * L;
  constexpr int64_t KC = block_k<T, C, NR>(), MC = block_m<T, C, MR, NR>();
  constexpr int kEdge1 = edge_rows(MR, 1), kEdge2 = edge_rows(MR, 2);
  const int64_t M = J.M, N = J.N, K = J.K;
  const int64_t panels = (N + NR - 1) / NR;

  if constexpr (prunable<Op, ARG>()) {
    constexpr int kCopies = std::is_base_of<MaxProdPair, Op>::value ? 3 : 1;
    if (K >= kPruneMinK && take_pruned_rows(pruned_rows_pay<Op, V, ARG>()) &&
        pruned_scratch_fits(M, K, kCopies * sizeof(T))) {
      const Pruned r = run_pruned<Op, T, V, NV, ARG>(J);
      if (r != Pruned::kNotPaying) return r == Pruned::kDone;
    }
  } else if constexpr (has_segments<Op>::value) {
    if (K >= kPruneMinK && take_pruned_rows(pruned_rows_pay<Op, V, ARG>()) && pruned_scratch_fits(M, K, C * sizeof(T))) {
      const Pruned r = run_pruned_topk<Op, T, V, NV>(J);
      if (r != Pruned::kNotPaying) return r == Pruned::kDone;
    }
  }
  alignas(64) T tile[C * MR * NR];
  alignas(64) int32_t tile_ix[ARG ? C * MR * NR : 1];
  constexpr bool kWarm = has_segments<Op>::value;  // kmax: lists warm-started (warm_fill)
  const int64_t R = kWarm ? std::min(kWarmPicks, K) : 0;
  std::vector<int32_t> picks(kWarm ? M * R : 0);
  if (kWarm && R > 0) warm_picks<T, V>(J, R, picks.data());
  for (int64_t k0 = 0; k0 < K; k0 += KC) {
    const int64_t kc = std::min(KC, K - k0);
    const bool first = k0 == 0 && !(kWarm && R > 0);
    for (int64_t m0 = 0; m0 < M; m0 += MC) {
      const int64_t mc = std::min(MC, M - m0);
      const int64_t strips = (mc + MR - 1) / MR;
      for (int64_t s = 0; s < strips; ++s) {
        bool ok = true;
        T* dst = J.apack + s * kc * MR * C;
        const int64_t done = pack_a_strip_lanes<Op, T, V, MR>(J, m0 + s * MR, k0, kc, dst, ok);
        if (!pack_a_strip<Op, T, MR>(J, m0 + s * MR, k0, kc, dst, done, ok)) return false;
      }
      for (int64_t p = 0; p < panels; ++p) {
        const int64_t n0 = p * NR, nv = std::min<int64_t>(NR, N - n0);
        const T* bp = J.bpack + (p * K + k0) * NR;
        for (int64_t s = 0; s < strips; ++s) {
          const int64_t r0 = m0 + s * MR, mv = std::min<int64_t>(MR, M - r0);
          const T* ap = J.apack + s * kc * MR * C;
          T* c = J.c + r0 * N + n0;
          int32_t* ix = J.idx ? J.idx + r0 * N + n0 : nullptr;
          if constexpr (kWarm) {
            if (k0 == 0 && R > 0) warm_fill<Op, T, V, NV>(J, picks.data(), R, p, r0, mv, n0, nv);
          }
          if (nv == NR && mv == MR) {
            micro_kernel<Op, T, V, MR, NV, ARG>(kc, k0, ap, bp, c, N, J.c_c, ix, N, J.i_c, first);
          } else if (mv <= kEdge1) {  // the last rows of M: a kernel that wastes fewer rows
            edge_tile<Op, T, V, kEdge1, NV, ARG, MR>(kc, k0, ap, bp, c, N, J.c_c, ix, J.i_c, first, mv, nv, tile,
                                                     tile_ix);
          } else if (mv <= kEdge2) {
            edge_tile<Op, T, V, kEdge2, NV, ARG, MR>(kc, k0, ap, bp, c, N, J.c_c, ix, J.i_c, first, mv, nv, tile,
                                                     tile_ix);
          } else {
            edge_tile<Op, T, V, MR, NV, ARG, MR>(kc, k0, ap, bp, c, N, J.c_c, ix, J.i_c, first, mv, nv, tile,
                                                 tile_ix);
          }
        }
      }
    }
  }
  return true;
}

#if defined(__x86_64__)
// viterbi's a + b computed as fma(b, 1, a): the same single rounding (b·1 is
// exact), so bit-identical, but it runs on the FMA pipes instead of competing
// with the ⊕ (vmaxps) for the FP-add pipes. On this Zen 4 core a micro-kernel
// went from ~25 to ~35 G terms/s. The asm is only emitted for 32/64-byte
// vectors, which are only instantiated in the AVX2+FMA / AVX-512 functions.
struct MaxPlusOnFma : MaxPlus {
  // `a` by reference: it is read straight from the packed A block (an
  // embedded-broadcast memory operand on AVX-512).
  template <class V, class T>
  TS_TILE_FN static V term(const T& a, V b) {
    if constexpr (sizeof(V) == 32 || sizeof(V) == 64) {
      const V one = V{} + T(1);  // a constant: folded at compile time
      V t = b;                   // t = one·t + a = b + a, one rounding
      if constexpr (sizeof(V) == 64 && sizeof(T) == 4) {
        asm("vfmadd213ps %[a]%{1to16%}, %[one], %[t]" : [t] "+v"(t) : [one] "v"(one), [a] "m"(a));
      } else if constexpr (sizeof(V) == 64) {
        asm("vfmadd213pd %[a]%{1to8%}, %[one], %[t]" : [t] "+v"(t) : [one] "v"(one), [a] "m"(a));
      } else if constexpr (sizeof(T) == 4) {
        V s;
        asm("vbroadcastss %[a], %[s]" : [s] "=v"(s) : [a] "m"(a));
        asm("vfmadd213ps %[s], %[one], %[t]" : [t] "+v"(t) : [s] "v"(s), [one] "v"(one));
      } else {
        V s;
        asm("vbroadcastsd %[a], %[s]" : [s] "=v"(s) : [a] "m"(a));
        asm("vfmadd213pd %[s], %[one], %[t]" : [t] "+v"(t) : [s] "v"(s), [one] "v"(one));
      }
      return t;
    } else {
      return a + b;
    }
  }
  // The blocked tile's term (micro_kernel_steps). On AVX2 `term` keeps a row's broadcast in a register for
  // both of its vectors and copies b before the FMA overwrites it: with the 6×2 accumulators, b and the
  // constant 1 that is 17 ymm registers, and GCC spilled an accumulator (a load and a store on every k,
  // ~14 % of the kernel's perf samples). Broadcasting into the result register itself, once per
  // vector (a load, which the load ports absorb), needs 16. The pruned rows keep `term`: there the
  // extra broadcasts cost more than they save (MiniLM-128 viterbi 2.75 → 2.85 × stock with them).
  template <class V, class T>
  TS_TILE_FN static void update(V* acc, const T* a, V b) {
    if constexpr (sizeof(V) == 32) {
      const V one = V{} + T(1);
      V t;
      if constexpr (sizeof(T) == 4) {
        asm("vbroadcastss %[a], %[t]\n\tvfmadd213ps %[b], %[one], %[t]"
            : [t] "=&v"(t) : [a] "m"(a[0]), [b] "v"(b), [one] "v"(one));
      } else {
        asm("vbroadcastsd %[a], %[t]\n\tvfmadd213pd %[b], %[one], %[t]"
            : [t] "=&v"(t) : [a] "m"(a[0]), [b] "v"(b), [one] "v"(one));
      }
      acc[0] = max_keep(acc[0], t);
    } else {
      acc[0] = max_keep(acc[0], term(a[0], b));
    }
  }
};
using MaxPlusKernel = MaxPlusOnFma;
#else
using MaxPlusKernel = MaxPlus;
#endif

// a·b with `a` read as an embedded-broadcast memory operand on AVX-512. Left
// to itself GCC broadcasts a into a register once per row and multiplies
// register by register: one more instruction per row on the FP pipes.
template <class V, class T>
TS_TILE_FN V times_broadcast(const T& a, V b) {
  V t;
#if defined(__x86_64__)
  if constexpr (sizeof(V) == 64 && sizeof(T) == 4) {
    asm("vmulps %[a]%{1to16%}, %[b], %[t]" : [t] "=v"(t) : [b] "v"(b), [a] "m"(a));
    return t;
  } else if constexpr (sizeof(V) == 64) {
    asm("vmulpd %[a]%{1to8%}, %[b], %[t]" : [t] "=v"(t) : [b] "v"(b), [a] "m"(a));
    return t;
  }
#endif
  t = a * b;
  return t;
}

struct MaxTimesKernel : MaxTimes {
  template <class V, class T>
  TS_TILE_FN static V term(const T& a, V b) { return times_broadcast(a, b); }
  template <class V, class T>
  TS_TILE_FN static void update(V* acc, const T* a, V b) { acc[0] = max_keep(acc[0], term(a[0], b)); }
};

// max_prod's pair: which of M·w, m·w is the larger follows from the sign of
// w alone when M >= m (true of every value the semiring makes; the kernel
// declines others), so each term takes a blend (any FP pipe) where a max and
// a min (the FP-add pipes, the bottleneck) were needed: per term 2 mul + 2
// blend + 2 max/min instead of 2 mul + 4 max/min. A zero edge (NaN) has no
// sign and an empty value is (NaN, NaN): both terms stay NaN and are dropped.
struct MaxProdPairKernel : MaxProdPair {
  template <class T>
  TS_TILE_FN static bool accepts(const T* v, int present) {
    return MaxProdPair::accepts(v, present) && (v[0] == -std::numeric_limits<T>::infinity() || v[0] >= v[1]);
  }
  template <class V, class T>
  TS_TILE_FN static void update(V* acc, const T* a, V b) {
    const V p = times_broadcast(a[0], b), q = times_broadcast(a[1], b);
    const auto negative = b < V{};  // the same for every row: computed once per k
    acc[0] = max_keep(acc[0], negative ? q : p);
    acc[1] = min_keep(acc[1], negative ? p : q);
  }
  // One row at a time (the pruned rows, run_pruned), where the sign compare is not shared by rows:
  // the extremes of the two products, 2 mul + 4 max/min, one op fewer than compare + 2 blends + max/min
  // (4 % of MiniLM's max_prod products, 15 % of its attention.output ones). M, m by reference: the
  // embedded broadcast reads them where they lie (by value they were stored to the stack first).
  // A NaN-marked zero edge or empty value makes both products NaN: dropped alike.
  template <class V, class T>
  TS_TILE_FN static void update_row(V& hi, V& lo, const T& M, const T& m, V b) {
    const V p = times_broadcast(M, b), q = times_broadcast(m, b);
    hi = max_keep(hi, max_keep(p, q));
    lo = min_keep(lo, min_keep(p, q));
  }
  // With argmax (tile_arithmetic.h): per term and vector 2 mul, 2 compares
  // (FMA pipes), 6 blends (any pipe) — 4 cycles' worth of ops on the 4
  // pipes for 3 rows, about twice the plain pair.
  template <class V, class IV, class T, class I>
  TS_TILE_FN static void update_arg(V* acc, IV* arg, const T* a, V b, I k) {
    update_arg_terms(acc, arg, times_broadcast(a[0], b), times_broadcast(a[1], b), b, k);
  }
};

// A compare-exchange (hi, lo) = (max, min)(x, y) as one compare and two
// blends: on AVX-512 the compare runs on the FMA pipes and the blends on any
// FP pipe, where max + min both need the FP-add pipes. (Written in asm: GCC
// folds `x > y ? x : y` back into a max.) Equal values may go either way;
// inputs are never NaN (kmax's g and w are checked).
template <class V>
TS_TILE_FN void exchange_by_blend(V& x, V& y) {
#if defined(__x86_64__)
  if constexpr (sizeof(V) == 64 && sizeof(x[0]) == 4) {
    unsigned short k;  // an AVX-512 mask register
    V hi, lo;
    asm("vcmpps $14, %[y], %[x], %[k]" : [k] "=Yk"(k) : [x] "v"(x), [y] "v"(y));  // x > y
    asm("vblendmps %[x], %[y], %[hi]%{%[k]%}" : [hi] "=v"(hi) : [x] "v"(x), [y] "v"(y), [k] "Yk"(k));
    asm("vblendmps %[y], %[x], %[lo]%{%[k]%}" : [lo] "=v"(lo) : [x] "v"(x), [y] "v"(y), [k] "Yk"(k));
    x = hi, y = lo;
    return;
  } else if constexpr (sizeof(V) == 64) {
    unsigned char k;
    V hi, lo;
    asm("vcmppd $14, %[y], %[x], %[k]" : [k] "=Yk"(k) : [x] "v"(x), [y] "v"(y));
    asm("vblendmpd %[x], %[y], %[hi]%{%[k]%}" : [hi] "=v"(hi) : [x] "v"(x), [y] "v"(y), [k] "Yk"(k));
    asm("vblendmpd %[y], %[x], %[lo]%{%[k]%}" : [lo] "=v"(lo) : [x] "v"(x), [y] "v"(y), [k] "Yk"(k));
    x = hi, y = lo;
    return;
  }
#endif
  const V hi = max_keep(y, x), lo = min_keep(y, x);
  x = hi, y = lo;
}


// Bit s set where m[s] != 0, s < 32: 32 uint16 slots on AVX-512 (one test of the 64 bytes), 32 uint8 slots
// on AVX2 (a byte compare and a byte mask), else slot by slot.
template <class V, class Slot>
TS_TILE_FN uint32_t nonzero_slots(const Slot* m) {
#if defined(__x86_64__)
  if constexpr (sizeof(V) == 64 && sizeof(Slot) == 2) {
    typedef uint16_t W __attribute__((vector_size(64)));
    const W v = load<W>(m);
    unsigned int k;
    asm("vptestmw %[v], %[v], %[k]" : [k] "=Yk"(k) : [v] "v"(v));
    return k;
  } else if constexpr (sizeof(V) == 32 && sizeof(Slot) == 1) {
    typedef uint8_t W __attribute__((vector_size(32)));
    const W v = load<W>(m);
    W zero;
    uint32_t z;
    asm("vpxor %[t], %[t], %[t]\n\tvpcmpeqb %[t], %[v], %[t]\n\tvpmovmskb %[t], %[z]"
        : [z] "=r"(z), [t] "=&x"(zero) : [v] "x"(v));
    return ~z;
  }
#endif
  uint32_t bits = 0;
  for (int s = 0; s < 32; ++s) bits |= uint32_t(m[s] != 0) << s;
  return bits;
}

// kmax's top-E merge (TopKMerge) with the first kBlended compare-exchanges of
// the bitonic network done by exchange_by_blend. Per term and vector: the
// adds (FMA pipes), the maxes of the front and of the half exchanges, and 2
// ops per full exchange, all on the FP-add pipes. Moving the fewest full
// exchanges that balance the pipes, (S − F)/5 rounded up with F, S the ops
// on each pair of pipes, gives KP = E = 4: 6 → 4.5 cycles, KP = E = 8:
// 16 → ~11.3, E = 5 (KP = 8): 5 adds + 21 max/min → ~6.
template <int KP, class Term, int E = KP>
struct TopKMergeKernel : TopKMerge<KP, Term, E> {
  using Base = TopKMerge<KP, Term, E>;
  static constexpr int kFront = 2 * E - KP;  // lanes with both lists present: a max
  static constexpr int kTerms = E;
  static constexpr int kFull = Base::exchanges(true), kHalf = Base::exchanges(false);
  static constexpr int kSlow = kFront + 2 * kFull + kHalf, kFast = kTerms;
  static constexpr int kBlended = kSlow > kFast ? (kSlow - kFast + 4) / 5 : 0;
  struct Exchange {
    template <class V>
    TS_TILE_FN void operator()(V& x, V& y, int n) const {
      if (n < kBlended) {
        exchange_by_blend(x, y);
      } else {
        const V hi = max_keep(y, x), lo = min_keep(y, x);
        x = hi, y = lo;
      }
    }
  };
  // A tile's k block, kSegment steps at a time, in two passes, with the
  // lists in the output tile c (L1) and only their E-th scores in registers.
  // Nothing enters a list where the best term of g's list, a[0] + b, does
  // not beat its E-th score (a's list descends; a term equal to it leaves
  // the values as they are). The filter: per step and tile vector one add
  // and one compare — is a[0] + b above the E-th score as it was when the
  // segment began? — no branch: a max-plus product's pace. The merges: the
  // network run for each hit, in any order (the lists hold values only, and
  // the top E of a union do not depend on the order of its parts), with no
  // further test (the E-th score only rises, so the stale threshold lets
  // through a superset, and merging a term that does not beat the list
  // changes nothing). Hits: 5–10 % of the vector-steps of MiniLM-64's kmax(4)
  // products from the warm start (run_job, kWarmPicks); per vector-step ≈ the
  // filter's 2 ops + that share of the merge's ops (KP = E = 4: 4 adds + 12
  // max/min/blend).
  //
  // AVX-512 and AVX2: the filter stores each lane mask at [step][vector], a
  // test of 64 (32) bytes turns two (four) steps into 32 bits (a bit per
  // step and vector), and a compress (a table of bit positions) appends their
  // codes (step·slots + vector) to one list for the segment; one loop then
  // merges them, step by step, each a load of its list, the network, a
  // store. Consecutive hits are mostly different vectors: their merges
  // overlap, and the loop takes one unpredictable branch a segment. The loop
  // per vector and its set bits that this replaced (still the baseline
  // ISA's) waited on one merge chain at a time and mispredicted its exit
  // about once per vector and segment: ~30 cycles a hit on MiniLM-64's
  // products, where a merge is ~10 cycles of vector work; on AVX2 its filter
  // also took a bool, a variable shift and an or per term.
  static constexpr int kSegment = 32;  // bits of a uint32_t
  template <class V>
  static constexpr int slots_per_step() { return sizeof(V) == 64 ? 16 : 8; }  // vectors of a tile per step
  template <class T, class V, int MR, int NV, int PACKED>
  TS_TILE_FN static void run_tile(int64_t kc, const T* ap, const T* bp, T* c, int64_t ldc, int64_t cc, bool first) {
    constexpr int L = sizeof(V) / sizeof(T), NR = NV * L;
    constexpr bool kListed = sizeof(V) >= 32;  // AVX-512 / AVX2: one list of hit codes per segment
    constexpr int kSlots = slots_per_step<V>(), kStepsPerTest = 32 / kSlots;
    using Slot = std::conditional_t<sizeof(V) == 64, uint16_t, uint8_t>;  // a vector's lane mask
    static_assert(MR * NV <= kSlots, "a step's vectors must fit its mask slots");
    // The tile's lists, copied into E adjacent vectors each for the k block:
    // in c, a list's entries lie a component stride (M·N) apart, a multiple
    // of 4 KB on the shapes of a transformer, so a tile's 48 lines fall into
    // a few L1 sets, and merging with a load and a store per hit evicted them.
    alignas(64) T lists[MR * NV * E * L];
    auto list_of = [&](int i, int j) __attribute__((always_inline)) { return lists + (i * NV + j) * E * L; };
    _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) {
      _Pragma("GCC unroll 4") for (int j = 0; j < NV; ++j) {
        _Pragma("GCC unroll 8") for (int q = 0; q < E; ++q)
          store(list_of(i, j) + q * L, first ? V{} - std::numeric_limits<T>::infinity()
                                             : load<V>(c + q * cc + i * ldc + j * L));
      }
    }
    V thr[MR][NV];
    auto load_thresholds = [&]() __attribute__((always_inline)) {
      _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) {
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; ++j) thr[i][j] = load<V>(list_of(i, j) + (E - 1) * L);
      }
    };
    load_thresholds();
    auto merge_hit = [&](int64_t k, uint32_t i, uint32_t j) __attribute__((always_inline)) {
      T* list = list_of(i, j);
      V acc[E];
      _Pragma("GCC unroll 8") for (int q = 0; q < E; ++q) acc[q] = load<V>(list + q * L);
      Base::merge(acc, ap + k * PACKED * E + i * E, load<V>(bp + k * NR + j * L), Exchange{});
      _Pragma("GCC unroll 8") for (int q = 0; q < E; ++q) store(list + q * L, acc[q]);
    };
    alignas(64) Slot masks[kListed ? kSegment : 1][kSlots] = {};  // slots past MR·NV stay 0
    int32_t codes[kListed ? kSegment * MR * NV + 16 : 1];         // (+16: a compress stores 16 lanes)
    for (int64_t s0 = 0; s0 < kc; s0 += kSegment) {
      const int steps = int(std::min<int64_t>(kSegment, kc - s0));
      // f(i, j, term) for every term of k-step s0 + s (one vector of the tile's row i, column block j)
      auto each_term = [&](int s, auto&& f) __attribute__((always_inline)) {
        const T* a = ap + (s0 + s) * PACKED * E;
        V b[NV];
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; ++j) b[j] = load<V>(bp + (s0 + s) * NR + j * L);
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) {
          _Pragma("GCC unroll 4") for (int j = 0; j < NV; ++j) f(i, j, Term::term(a[i * E], b[j]));
        }
      };
      if constexpr (kListed) {
        for (int s = 0; s < steps; ++s)
          each_term(s, [&](int i, int j, V term) __attribute__((always_inline)) {
            masks[s][i * NV + j] = Slot(lanes_where<kGreater>(term, thr[i][j]));
          });
        int n = 0;
        for (int s = 0; s < steps; s += kStepsPerTest) {
          uint32_t bits = nonzero_slots<V>(masks[s]);  // steps s .. s + kStepsPerTest − 1
          if (steps - s < kStepsPerTest) bits &= (1u << ((steps - s) * kSlots)) - 1;  // (later: an earlier segment's)
          n += append_lanes<V>(codes + n, bits & 0xffffu, s * kSlots);
          n += append_lanes<V>(codes + n, bits >> 16, s * kSlots + 16);
        }
        for (int h = 0; h < n; ++h) {
          const uint32_t code = uint32_t(codes[h]), slot = code % kSlots;  // (unsigned: shifts and masks)
          merge_hit(s0 + code / kSlots, slot / NV, slot % NV);
        }
        load_thresholds();
      } else {
        uint32_t hits[MR][NV] = {};
        for (int s = 0; s < steps; ++s)
          each_term(s, [&](int i, int j, V term) __attribute__((always_inline)) {
            hits[i][j] |= uint32_t(any_greater(term, thr[i][j])) << s;
          });
        for (int i = 0; i < MR; ++i) {
          for (int j = 0; j < NV; ++j) {
            for (uint32_t h = hits[i][j]; h; h &= h - 1) merge_hit(s0 + __builtin_ctz(h), i, j);
            thr[i][j] = load<V>(list_of(i, j) + (E - 1) * L);
          }
        }
      }
    }
    _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) {
      _Pragma("GCC unroll 4") for (int j = 0; j < NV; ++j) {
        _Pragma("GCC unroll 8") for (int q = 0; q < E; ++q) store(c + q * cc + i * ldc + j * L, load<V>(list_of(i, j) + q * L));
      }
    }
  }
};

// Register budget: MR·NV·C accumulators (+ MR·NV argmax vectors) plus the NV
// B vectors must fit the register file (32 zmm; 16 ymm/xmm).
// (12×2 / 6×2 tiles for one component; 6 / 3 rows for pairs and argmax.)
// kmax keeps only its lists' E-th scores in registers, NV a row, the lists
// themselves in the output tile (run_tile): 6×2 / 3×2.
template <class Op, bool ARG>
constexpr int mr_for(int registers) {
  if constexpr (has_segments<Op>::value) return registers == 32 ? 6 : 3;
  const int per_row = 2 * Op::kComponents * (ARG ? 2 : 1);  // NV = 2 vectors per row
  const int free = registers == 32 ? 24 : 12;
  return std::max(1, free / per_row);
}

enum class Isa { kPortable, kAvx2, kAvx512 };

#if defined(__x86_64__) || defined(__i386__)
template <class Op, class T, bool ARG>
__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,fma"), flatten)) bool run_avx512(const Job<T>& J) {
  return run_job<Op, T, typename VecOf<T, 64>::type, mr_for<Op, ARG>(32), 2, ARG>(J);
}
template <class Op, class T, bool ARG>
__attribute__((target("avx2,fma"), flatten)) bool run_avx2(const Job<T>& J) {
  return run_job<Op, T, typename VecOf<T, 32>::type, mr_for<Op, ARG>(16), 2, ARG>(J);
}
#endif
template <class Op, class T, bool ARG>
__attribute__((flatten)) bool run_portable(const Job<T>& J) {
  return run_job<Op, T, typename VecOf<T, 16>::type, mr_for<Op, ARG>(16), 2, ARG>(J);
}

Isa detect_isa() {
#if defined(__x86_64__) || defined(__i386__)
  static const Isa best = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                                  __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw")
                              ? Isa::kAvx512
                          : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? Isa::kAvx2
                                                                                            : Isa::kPortable;
#else
  static const Isa best = Isa::kPortable;
#endif
  // Read on every call (a getenv is cheap next to a GEMM) so tests can cover
  // each path in one process; it can only lower the ISA, never raise it.
  Isa isa = best;
  if (const char* forced = std::getenv("TORCH_SEMIRING_KERNEL_ISA")) {
    std::string f(forced);
    if (f == "portable") isa = Isa::kPortable;
    else if (f == "avx2" && best != Isa::kPortable) isa = Isa::kAvx2;
  }
  return isa;
}

// NR, the width of B's panels, under `isa`: NV = 2 vectors of its width.
int64_t panel_lanes(Isa isa, int64_t elem_bytes) {
  const int64_t vector_bytes = isa == Isa::kAvx512 ? 64 : isa == Isa::kAvx2 ? 32 : 16;
  return 2 * vector_bytes / elem_bytes;
}

template <class Op, class T, bool ARG>
bool (*pick_kernel(Isa isa))(const Job<T>&) {
  switch (isa) {
#if defined(__x86_64__) || defined(__i386__)
    case Isa::kAvx512: return &run_avx512<Op, T, ARG>;
    case Isa::kAvx2: return &run_avx2<Op, T, ARG>;
#endif
    default: return &run_portable<Op, T, ARG>;
  }
}

// ---- kmax with argmax: the winners of each top-k list -----------------------
//
// Which candidates (k', e) make the list best[·, m, n] of a kmax(k) product,
// given that list from the kmax kernel: a winner scores at least
// t = best[k−1, m, n], the k-th best, and as every list of g is descending,
// g[e, m, k'] + b <= g[0, m, k'] + b: only the columns k' whose FIRST entry
// reaches t can hold one. So a pass shaped like a max-plus product (per term
// and vector: one add, one compare into a mask) finds those hits — at most k
// columns per output, plus ties — and scalar code walks each hit's entries
// while they reach t. A candidate x >= t is in the list, at the slot
// p = #{best > x} or, when earlier candidates took that slot at an equal
// score, the next free slot holding x (none free: a tie past the k-th, it
// stays out): visiting k' and then e in increasing order, equal scores get
// their slots in order of the index k'·k + e. The list itself is the
// kernel's; only the indices are written. A finite score left without an
// index (the kernel and this pass disagreeing, which they cannot: both add
// the same two numbers with one rounding) would fail the product.
// (Carrying the indices through TopKMerge's network instead needs a mask and
// two more blends per compare-exchange: ~2× the kmax product's time.)
// A hit is taken a vector of outputs at a time, without branching per lane:
// per entry e the candidates x = g[e, m, k'] + b of the vector's lanes
// (stop at the first e where no lane reaches t), and per slot s of the
// lists a compare of x with the slot's score and a select of the index into
// the lanes where x takes that slot. (Per lane, with a branch per bit, per
// entry and per slot, a hit cost ~65 ns here: 3–5× the product itself.)
// The scan runs 32 k-steps at a time with their lane masks stored (no
// branch per step), as TopKMergeKernel's filter; each tile's lists and
// indices are held in a local block, the indices written back once.
// Cost: the scan ~ a max-plus product; per vector with a hit, O(E) per
// entry that reaches t, in L1. (kmax(5) at 64×1536×384: the pass ~0.9× the
// product's time, was 2.7×.)
template <class T>
struct WinnersJob {
  int64_t M, N, K, E;
  const T* a;     // g's scores (E, M, K), strided
  int64_t a_c, a_m, a_k;
  const T* bpack; // B, panel-major as for the product (NR lanes)
  const T* best;  // the lists (E, M, N): component stride b_c, contiguous (M, N)
  int64_t b_c;
  int32_t* idx;   // their winners (E, M, N): component stride i_c
  int64_t i_c;
};

// Candidates x (NaN in lanes that do not reach their last score) take their
// slots in the lanes' descending lists (E vectors of scores, E of indices,
// −1 where free), as described above: the first slot holding x whose index
// is still free. (Every mask is a comparison feeding a select: GCC turns a
// comparison kept as a vector value into code lane by lane.)
template <class V>
TS_TILE_FN void place_candidates(const V* scores, V* ids, int64_t E, V x, V code) {
  const V none = V{} + std::numeric_limits<typename std::remove_reference<decltype(x[0])>::type>::quiet_NaN();
  for (int64_t s = 0; s < E; ++s) {
    const V free_x = ids[s] < 0 ? x : none;  // x, where slot s is free
    ids[s] = scores[s] == free_x ? code : ids[s];
    x = scores[s] == free_x ? none : x;      // placed: no further slot
  }
}

template <class T, class V, int MR, int NV>
TS_TILE_FN void run_winners(const WinnersJob<T>& J) {
  constexpr int L = sizeof(V) / sizeof(T), NR = NV * L;
  constexpr T nan = std::numeric_limits<T>::quiet_NaN(), lowest = std::numeric_limits<T>::lowest();
  const int64_t M = J.M, N = J.N, K = J.K, E = J.E;
  alignas(64) T block[MR * NR * 8];      // the tile's lists: vector (i, j), slot s at ((i·NV + j)·E + s)·L; E ≤ 8
  alignas(64) T block_ids[MR * NR * 8];  // their indices k·E + e (exact in T: see kmax_matmul_argmax), −1: free
  for (int64_t n0 = 0; n0 < N; n0 += NR) {
    const T* bp = J.bpack + n0 * K;  // panel n0 / NR
    const int64_t nv = std::min<int64_t>(NR, N - n0);
    for (int64_t m0 = 0; m0 < M; m0 += MR) {
      const int64_t mv = std::min<int64_t>(MR, M - m0);
      V t[MR][NV];
      const T* rows[MR];
      const bool whole = mv == MR && nv == NR;
      for (int i = 0; i < MR; ++i) {
        rows[i] = J.a + std::min(m0 + i, M - 1) * J.a_m;  // rows past M: thresholds NaN, no hits
        for (int j = 0; j < NV; ++j) {
          T* lists = block + (i * NV + j) * E * L;
          T* ids = block_ids + (i * NV + j) * E * L;
          for (int64_t s = 0; s < E; ++s) {
            const T* src = J.best + s * J.b_c + (m0 + i) * N + n0 + j * L;
            if (whole) {
              store(lists + s * L, load<V>(src));
            } else {
              for (int l = 0; l < L; ++l) lists[s * L + l] = i < mv && j * L + l < nv ? src[l] : nan;
            }
            store(ids + s * L, V{} - 1);
          }
          // A list with fewer than E scores has t = −∞: then every finite
          // candidate wins (there are fewer than E of them), none of −∞.
          const V last = load<V>(lists + (E - 1) * L);
          t[i][j] = last == last ? max_keep(last, V{} + lowest) : last;  // NaN outside M × N: no hits
        }
      }
      // The scan, kSegment k-steps at a time (as TopKMergeKernel's filter): per
      // step and tile vector one add and one compare, its lane mask stored, no
      // branch; then per vector, its steps with a hit.
      constexpr int kSegment = 32;
      for (int64_t s0 = 0; s0 < K; s0 += kSegment) {
        const int steps = int(std::min<int64_t>(kSegment, K - s0));
        alignas(64) uint16_t masks[MR * NV][kSegment];
        for (int s = 0; s < steps; ++s) {
          const int64_t k = s0 + s;
          V b[NV];
          _Pragma("GCC unroll 4") for (int j = 0; j < NV; ++j) b[j] = load<V>(bp + k * NR + j * L);
          _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) {
            _Pragma("GCC unroll 4") for (int j = 0; j < NV; ++j)
              masks[i * NV + j][s] = uint16_t(lanes_where<kAtLeast>(MaxPlusKernel::term(rows[i][k * J.a_k], b[j]), t[i][j]));
          }
        }
        const uint32_t valid = steps == kSegment ? ~0u : (1u << steps) - 1;
        // The hits: a vector's candidates, entry by entry while any lane reaches t.
        for (int h = 0; h < MR * NV; ++h) {
          const int i = h / NV, j = h % NV;
          for (uint32_t bits = nonzero_slots<V>(masks[h]) & valid; bits; bits &= bits - 1) {
            const int64_t k = s0 + __builtin_ctz(bits);
            const V bk = load<V>(bp + k * NR + j * L), tt = t[i][j];
            V* lists = reinterpret_cast<V*>(block + h * E * L);
            V* ids = reinterpret_cast<V*>(block_ids + h * E * L);
            const T* a = rows[i] + k * J.a_k;
            for (int64_t e = 0; e < E; ++e) {
              const V x = MaxPlusKernel::term(a[e * J.a_c], bk);  // the kernel's term, bit for bit
              if (e > 0 && !lanes_where<kAtLeast>(x, tt)) break;    // the lists descend
              place_candidates(lists, ids, E, x >= tt ? x : V{} + nan, V{} + T(k * E + e));
            }
          }
        }
      }
      typedef int32_t Indices __attribute__((vector_size(L * sizeof(int32_t))));
      for (int64_t i = 0; i < mv; ++i)
        for (int j = 0; j < NV; ++j)
          for (int64_t s = 0; s < E; ++s) {
            const T* ids = block_ids + ((i * NV + j) * E + s) * L;
            int32_t* dst = J.idx + s * J.i_c + (m0 + i) * N + n0 + j * L;
            if (whole) {
              const Indices whole_ids = __builtin_convertvector(load<V>(ids), Indices);
              std::memcpy(dst, &whole_ids, sizeof(whole_ids));
            } else {
              for (int l = 0; l < L && j * L + l < nv; ++l) dst[l] = int32_t(ids[l]);
            }
          }
    }
  }
}

#if defined(__x86_64__) || defined(__i386__)
template <class T>
__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,fma"), flatten)) void winners_avx512(const WinnersJob<T>& J) {
  run_winners<T, typename VecOf<T, 64>::type, 4, 2>(J);
}
template <class T>
__attribute__((target("avx2,fma"), flatten)) void winners_avx2(const WinnersJob<T>& J) {
  run_winners<T, typename VecOf<T, 32>::type, 4, 2>(J);
}
#endif
template <class T>
__attribute__((flatten)) void winners_portable(const WinnersJob<T>& J) {
  run_winners<T, typename VecOf<T, 16>::type, 4, 2>(J);
}

template <class T>
void (*pick_winners(Isa isa))(const WinnersJob<T>&) {
  switch (isa) {
#if defined(__x86_64__) || defined(__i386__)
    case Isa::kAvx512: return &winners_avx512<T>;
    case Isa::kAvx2: return &winners_avx2<T>;
#endif
    default: return &winners_portable<T>;
  }
}

// ---- B: the lifted weight, packed once per weight version -------------------

// How w becomes B: log|w| (viterbi, kmax; the log is applied by ATen before
// packing), |w| (max_abs), or w with its zero edges marked NaN (max_prod).
// Every kind rejects a non-finite w: an infinite edge would meet −∞ or 0 in g
// and give NaN (or a wrong infinity) in the generic arithmetic.
enum class Lift { kLogAbs, kAbs, kMarkZeros };

// One panel of B: K rows of nv <= NR lifted weights (unit column stride, row
// stride s_k) into dst (K × NR, the columns past nv zero: never stored);
// false if a weight is not finite. `lift` is a Lift. Vectorised (see
// TS_CPU_CLONES): packing an activation costs about one copy.
#pragma GCC push_options
#pragma GCC optimize("O3")
template <class T>
inline __attribute__((always_inline)) bool pack_panel_impl(int lift, const T* x, int64_t s_k, int64_t K, int64_t nv,
                                                           int64_t NR, T* dst) {
  constexpr T inf = std::numeric_limits<T>::infinity();
  int bad = 0;
  for (int64_t k = 0; k < K; ++k) {
    const T* xr = x + k * s_k;
    T* d = dst + k * NR;
    if (lift == int(Lift::kLogAbs)) {  // log|w| already: +∞ or NaN came from a non-finite w
      for (int64_t n = 0; n < nv; ++n) {
        bad |= !(xr[n] < inf);
        d[n] = xr[n];
      }
    } else if (lift == int(Lift::kAbs)) {
      for (int64_t n = 0; n < nv; ++n) {
        const T v = std::abs(xr[n]);
        bad |= !(v < inf);
        d[n] = v;
      }
    } else {
      for (int64_t n = 0; n < nv; ++n) {
        const T v = xr[n];
        bad |= !(std::abs(v) < inf);
        d[n] = PackMark<MaxProdPair>::pack_b(v);
      }
    }
    for (int64_t n = nv; n < NR; ++n) d[n] = T(0);
  }
  return !bad;
}
TS_CPU_CLONES bool pack_panel(int lift, const float* x, int64_t s_k, int64_t K, int64_t nv, int64_t NR, float* dst) {
  return pack_panel_impl(lift, x, s_k, K, nv, NR, dst);
}
TS_CPU_CLONES bool pack_panel(int lift, const double* x, int64_t s_k, int64_t K, int64_t nv, int64_t NR,
                              double* dst) {
  return pack_panel_impl(lift, x, s_k, K, nv, NR, dst);
}
#pragma GCC pop_options

// B of one matrix src (K × N, any strides) lifted and packed into panels.
template <class T, Lift LIFT>
bool pack_panels(const T* src, int64_t K, int64_t N, int64_t s_k, int64_t s_n, int64_t NR, T* dst) {
  constexpr T inf = std::numeric_limits<T>::infinity();
  bool ok = true;
  const int64_t panels = (N + NR - 1) / NR;
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t n0 = p * NR, nv = std::min(NR, N - n0);
    T* d = dst + p * K * NR;
    if (s_n == 1) {
      ok &= pack_panel(int(LIFT), src + n0, s_k, K, nv, NR, d);
      continue;
    }
    for (int64_t k = 0; k < K; ++k, d += NR) {  // strided columns (a transposed weight): element by element
      const T* x = src + k * s_k + n0 * s_n;
      for (int64_t n = 0; n < nv; ++n) {
        const T v = x[n * s_n];
        const T lifted = LIFT == Lift::kLogAbs ? v : std::abs(v);
        ok &= lifted < inf;  // NaN too
        d[n] = LIFT == Lift::kMarkZeros ? PackMark<MaxProdPair>::pack_b(v) : lifted;
      }
      for (int64_t n = nv; n < NR; ++n) d[n] = T(0);
    }
  }
  {  // the column maxima of B (max_prod's: of |w|, a NaN-marked zero counting as 0), for run_pruned
    T* cm = dst + panels * K * NR;
    const int64_t stride = colmax_stride(K);
    for (int64_t p = 0; p < panels; ++p, cm += stride) {
      const int64_t nv = std::min(NR, N - p * NR);
      const T* d = dst + p * K * NR;
      for (int64_t k = 0; k < K; ++k, d += NR) {
        T best = LIFT == Lift::kMarkZeros ? T(0) : d[0];
        for (int64_t n = 0; n < nv; ++n) {
          const T v = LIFT == Lift::kMarkZeros ? std::abs(d[n]) : d[n];
          best = v > best ? v : best;
        }
        cm[k] = best;
      }
      for (int64_t k = K; k < stride; ++k) cm[k] = T(0);
    }
  }
  return ok;
}

// w with its expanded (stride-0) batch dims narrowed to one entry: each
// distinct matrix is packed once, and broadcasting reuses it.
Tensor distinct_entries(const Tensor& w) {
  Tensor x = w;
  for (int64_t d = 0; d < w.dim() - 2; ++d)
    if (w.size(d) > 1 && w.stride(d) == 0) x = x.narrow(d, 0, 1);
  return x;
}

// Offset of batch entry e (row-major over w's batch dims) in a tensor shaped
// like w.
int64_t entry_offset(const Tensor& t, int64_t e) {
  int64_t offset = 0;
  for (int64_t d = t.dim() - 3; d >= 0; --d) {
    offset += e % t.size(d) * t.stride(d);
    e /= t.size(d);
  }
  return offset;
}

// The lifted source that pack_panels reads: ATen's vectorised log for log|w|,
// w itself otherwise (|w| and the zero marking are applied while packing).
template <Lift LIFT>
Tensor lift_source(const Tensor& w) {
  return LIFT == Lift::kLogAbs ? w.abs().log_() : w;
}

// B for every batch entry of w (*wb, K, N): (entries, panels·K·NR), entries in
// row-major order of wb. Empty when w is outside the kernel's range.
template <class T, Lift LIFT>
Prepared pack_weight(const Tensor& w, int64_t NR) {
  const Tensor src = lift_source<LIFT>(w);
  const int64_t K = w.size(-2), N = w.size(-1), per_entry = packed_entry_elems(K, N, NR);
  const int64_t entries = w.numel() / (K * N);
  auto packed = at::empty({entries, per_entry}, w.options());
  for (int64_t e = 0; e < entries; ++e)
    if (!pack_panels<T, LIFT>(src.data_ptr<T>() + entry_offset(src, e), K, N, src.stride(-2), src.stride(-1), NR,
                              packed.data_ptr<T>() + e * per_entry))
      return {};
  return {packed};
}

// B of each batch entry of w (distinct_entries) for `isa`. A weight the lift
// cache keeps (a saved leaf, lift_cache.h) is packed whole, once per version.
// Anything else (an activation, a tensor made by a rule: used once) is packed
// one entry at a time just before its products, into one buffer that stays
// in cache: packing all entries ahead would stream them through memory twice.
template <class T, Lift LIFT>
class WeightPanels {
 public:
  WeightPanels(const Tensor& w, Isa isa) : K_(w.size(-2)), N_(w.size(-1)), nr_(panel_lanes(isa, sizeof(T))) {
    per_entry_ = packed_entry_elems(K_, N_, nr_);
    if (lift_cache_applies(w)) {
      static const char* const lift_names[] = {"log|w|", "|w|", "w, zeros as NaN"};
      const auto kind = std::string("max_gemm B: ") + lift_names[int(LIFT)] + ", NR=" + std::to_string(nr_);
      const int64_t nr = nr_;
      auto prepared = prepared_weight(w, kind, [nr](const Tensor& x) { return pack_weight<T, LIFT>(x, nr); });
      if (!prepared.empty()) packed_ = prepared[0];
      ok_ = packed_.defined();
    } else {
      count_uncached_preparation();
      at::NoGradGuard no_grad;
      source_ = lift_source<LIFT>(w);
      packed_ = at::empty({per_entry_}, w.options());
    }
  }
  bool ok() const { return ok_; }
  // Entry e's panels; nullptr when it holds a value outside the kernel's range.
  const T* entry(int64_t e) {
    if (!source_.defined()) return packed_.data_ptr<T>() + e * per_entry_;
    if (e != current_) {
      const T* src = source_.data_ptr<T>() + entry_offset(source_, e);
      if (!pack_panels<T, LIFT>(src, K_, N_, source_.stride(-2), source_.stride(-1), nr_, packed_.data_ptr<T>()))
        return nullptr;
      current_ = e;
    }
    return packed_.data_ptr<T>();
  }

 private:
  int64_t K_, N_, nr_, per_entry_;
  Tensor packed_, source_;
  int64_t current_ = -1;
  bool ok_ = true;
};

// The packed A block, one per thread and kept: a fresh ~200 KB allocation per
// product is an mmap plus page faults on every call. 64-byte aligned.
void* a_block_buffer(int64_t bytes) {
  thread_local std::vector<char> buffer;
  if (int64_t(buffer.size()) < bytes + 64) buffer.resize(bytes + 64);
  const auto address = reinterpret_cast<std::uintptr_t>(buffer.data());
  return buffer.data() + (64 - address % 64) % 64;
}

// Runs the kernel over every batch entry. a: (C', *batch, M, K) broadcast
// (stride 0 where broadcast; C' <= C components); w: distinct_entries of the
// weight (*wb, K, N), wb broadcastable to batch; out: the contiguous
// (C, *batch, M, N) result; idx: contiguous (C, *batch, M, N) (one-component
// products: (*batch, M, N)) or nullptr. False
// when w or g holds an entry the kernel does not accept.
// Calls job(e, a_offset, w_entry) for every batch entry e (row-major) of a
// product of a (C', *batch, M, K) and w (*wb, K, N): the offset of the entry
// in a and which entry of w (w's batch dims right-aligned, size-1 dims
// broadcast) it uses. Stops at the first job that returns false.
template <class Job>
bool for_each_batch_entry(const Tensor& a, const Tensor& w, Job&& job) {
  std::vector<int64_t> batch(a.sizes().begin() + 1, a.sizes().end() - 2);
  int64_t nbatch = 1;
  for (auto s : batch) nbatch *= s;
  const int64_t lead = int64_t(batch.size()) - (w.dim() - 2);
  std::vector<int64_t> w_step(batch.size(), 0);
  for (int64_t d = int64_t(batch.size()) - 1, step = 1; d >= lead; --d) {
    const int64_t size = w.size(d - lead);
    w_step[d] = size == 1 ? 0 : step;
    step *= size;
  }
  std::vector<int64_t> pos(batch.size(), 0);
  for (int64_t e = 0; e < nbatch; ++e) {
    int64_t oa = 0, entry = 0;
    for (size_t d = 0; d < batch.size(); ++d) {
      oa += pos[d] * a.stride(1 + d);
      entry += pos[d] * w_step[d];
    }
    if (!job(e, oa, entry)) return false;
    for (int64_t d = int64_t(batch.size()) - 1; d >= 0; --d) {  // next batch multi-index
      if (++pos[d] < batch[d]) break;
      pos[d] = 0;
    }
  }
  return true;
}

template <class Op, class T, bool ARG, Lift LIFT>
bool launch(Isa isa, const Tensor& a, const Tensor& w, Tensor& out, Tensor* idx) {
  constexpr int C = Op::kComponents;
  WeightPanels<T, LIFT> panels(w, isa);
  if (!panels.ok()) return false;
  const int64_t M = a.size(-2), K = a.size(-1), N = w.size(-1);
  // A: one L2 block plus a strip of rounding.
  const int64_t a_elems = kL2BlockBytes / int64_t(sizeof(T)) + 12 * 512 * C;

  auto kernel = pick_kernel<Op, T, ARG>(isa);
  const int64_t nr = panel_lanes(isa, sizeof(T));
  Job<T> J;
  J.M = M, J.N = N, J.K = K;
  J.a_c = a.stride(0), J.a_m = a.stride(-2), J.a_k = a.stride(-1);
  J.a_components = a.size(0);
  J.c_c = out.stride(0);
  J.i_c = idx ? idx->stride(0) : 0;
  J.apack = static_cast<T*>(a_block_buffer(a_elems * int64_t(sizeof(T))));
  const bool ok = for_each_batch_entry(a, w, [&](int64_t e, int64_t a_offset, int64_t entry) {
    J.a = a.data_ptr<T>() + a_offset;
    J.bpack = panels.entry(entry);
    if (!J.bpack) return false;
    J.colmax = J.bpack + (N + nr - 1) / nr * K * nr;
    J.c = out.data_ptr<T>() + e * M * N;
    J.idx = idx ? idx->data_ptr<int32_t>() + e * M * N : nullptr;
    return kernel(J);
  });
  if (ok) count_kernel_call();
  return ok;
}

// The winners of a kmax product's lists (see WinnersJob): a (E, *batch, M, K)
// g's scores, w the distinct entries of the weight, best the kmax kernel's
// lists (E, *batch, M, N) contiguous; fills idx (same shape).
// False where a finite score got no index (see WinnersJob).
template <class T>
bool launch_winners(Isa isa, const Tensor& a, const Tensor& w, const Tensor& best, Tensor& idx) {
  WeightPanels<T, Lift::kLogAbs> panels(w, isa);
  if (!panels.ok()) return false;
  const int64_t M = a.size(-2), K = a.size(-1), N = w.size(-1);
  auto run = pick_winners<T>(isa);
  WinnersJob<T> J;
  J.M = M, J.N = N, J.K = K, J.E = a.size(0);
  J.a_c = a.stride(0), J.a_m = a.stride(-2), J.a_k = a.stride(-1);
  J.b_c = best.stride(0), J.i_c = idx.stride(0);
  const bool ran = for_each_batch_entry(a, w, [&](int64_t e, int64_t a_offset, int64_t entry) {
    J.a = a.data_ptr<T>() + a_offset;
    J.bpack = panels.entry(entry);
    if (!J.bpack) return false;
    J.best = best.data_ptr<T>() + e * M * N;
    J.idx = idx.data_ptr<int32_t>() + e * M * N;
    run(J);
    return true;
  });
  if (!ran) return false;
  const T* b = best.data_ptr<T>();
  const int32_t* i = idx.data_ptr<int32_t>();
  for (int64_t q = 0, n = best.numel(); q < n; ++q)
    if (b[q] > -std::numeric_limits<T>::infinity() && i[q] < 0) return false;
  return true;
}

// One product: B from w (cached when w is a leaf), then the kernel. False
// when w or g is outside the kernel's range (the caller declines).
template <class Op, Lift LIFT, bool ARG>
bool run_product(const Tensor& g, const Tensor& w, Tensor& out, Tensor* idx) {
  const Isa isa = detect_isa();
  const Tensor entries = distinct_entries(w);
  return g.scalar_type() == at::kFloat ? launch<Op, float, ARG, LIFT>(isa, g, entries, out, idx)
                                       : launch<Op, double, ARG, LIFT>(isa, g, entries, out, idx);
}

constexpr double kInf = std::numeric_limits<double>::infinity();
// The argmax kernels encode a winner as k·C + entry (C entries per k) in
// int32: longer contractions are left to the generic path.
bool index_fits(int64_t K, int64_t C) { return K * C <= std::numeric_limits<int32_t>::max(); }

}  // namespace

bool broadcast_operands(const Tensor& g, const Tensor& w, BatchedOperands& out) {
  if (g.dim() < 3 || w.dim() < 2 || g.size(-1) != w.size(-2)) return false;
  auto gb = g.sizes().slice(1, g.dim() - 3), wb = w.sizes().slice(0, w.dim() - 2);
  std::vector<int64_t> batch;
  try {
    batch = at::infer_size(gb, wb);
  } catch (const c10::Error&) {
    return false;
  }
  const int64_t M = g.size(-2), K = g.size(-1), N = w.size(-1);
  std::vector<int64_t> gs{g.size(0)};
  gs.insert(gs.end(), batch.begin(), batch.end());
  gs.push_back(M), gs.push_back(K);
  std::vector<int64_t> ws(batch.begin(), batch.end());
  ws.push_back(K), ws.push_back(N);
  // Leading singleton batch dims go after the component dim, not before it.
  std::vector<int64_t> padded{g.size(0)};
  padded.insert(padded.end(), batch.size() - gb.size(), 1);
  padded.insert(padded.end(), g.sizes().begin() + 1, g.sizes().end());
  out.g = g.view(padded).expand(gs);
  out.w = w.expand(ws);
  out.out_shape = gs;
  out.out_shape.back() = N;
  return true;
}

namespace {
std::atomic<int64_t> calls{0};
}
int64_t kernel_calls() { return calls.load(); }
void count_kernel_call() { calls.fetch_add(1, std::memory_order_relaxed); }

std::string kernel_isa() {
  switch (detect_isa()) {
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    default: return "portable";
  }
}

namespace {
// Empty products (any of M, N, K or a batch dim 0) are left to the generic
// path, which knows the semiring zero; so are unsupported dtypes/devices.
bool kernel_applies(const Tensor& g, const Tensor& w, BatchedOperands& ops) {
  if (!kernel_dtype(g, w) || !broadcast_operands(g, w, ops)) return false;
  for (auto s : ops.out_shape) if (s == 0) return false;
  return ops.g.size(-1) > 0;
}

Tensor max_matmul(bool times, const Tensor& g, const Tensor& w) {
  if (device::routes(g, w)) return device::max_matmul(times, g, w);
  BatchedOperands ops;
  if (!kernel_applies(g, w, ops) || g.size(0) != 1) return {};
  auto out = at::empty(ops.out_shape, g.options());
  const bool ok = times ? run_product<MaxTimesKernel, Lift::kAbs, false>(ops.g, w, out, nullptr)
                        : run_product<MaxPlusKernel, Lift::kLogAbs, false>(ops.g, w, out, nullptr);
  return ok ? out : Tensor();
}
}  // namespace

Tensor max_plus_matmul(const Tensor& g, const Tensor& w) { return max_matmul(false, g, w); }
Tensor max_times_matmul(const Tensor& g, const Tensor& w) { return max_matmul(true, g, w); }

std::tuple<Tensor, Tensor> max_matmul_argmax(const std::string& semiring, const Tensor& g, const Tensor& w) {
  TORCH_CHECK(semiring == "viterbi" || semiring == "max_abs",
              "torch_semiring: max_matmul_argmax supports 'viterbi' and 'max_abs', got '", semiring, "'");
  const bool times = semiring == "max_abs";
  if (device::routes(g, w)) {
    Tensor idx;
    auto out = device::max_matmul(times, g, w, &idx);
    TORCH_CHECK(out.defined(), "torch_semiring: max_matmul_argmax: values ", g.sizes(), " and weights ", w.sizes(),
                " outside what the device kernel takes (NaN, +inf, non-finite weights, empty dims)");
    return {out, idx};
  }
  BatchedOperands ops;
  TORCH_CHECK(kernel_dtype(g, w), "torch_semiring: max_matmul_argmax needs CPU float32/float64 tensors of one "
              "dtype that do not require grad, got ", g.scalar_type(), " and ", w.scalar_type());
  TORCH_CHECK(g.size(0) == 1 && broadcast_operands(g, w, ops),
              "torch_semiring: max_matmul_argmax needs a value (1, *batch, M, K) and w (*batch, K, N), got ",
              g.sizes(), " and ", w.sizes());
  auto out = at::empty(ops.out_shape, g.options());
  std::vector<int64_t> ishape(ops.out_shape.begin() + 1, ops.out_shape.end());
  auto idx = at::empty(ishape, g.options().dtype(at::kInt));
  for (auto s : ops.out_shape) if (s == 0) return {out, idx};
  if (ops.g.size(-1) == 0) {  // K = 0: no term, no path
    out.fill_(times ? 0.0 : -kInf);
    idx.fill_(-1);
    return {out, idx};
  }
  const bool ok = times ? run_product<MaxTimesKernel, Lift::kAbs, true>(ops.g, w, out, &idx)
                        : run_product<MaxPlusKernel, Lift::kLogAbs, true>(ops.g, w, out, &idx);
  TORCH_CHECK(ok, "torch_semiring: max_matmul_argmax needs finite w and g without NaN",
              times ? ", +inf or negative entries" : " or +inf", " (the generic path handles those)");
  return {out, idx};
}

Tensor max_prod_matmul(const Tensor& g, const Tensor& w) {
  if (device::routes(g, w)) return device::max_prod_matmul(g, w);
  BatchedOperands ops;
  if (!kernel_applies(g, w, ops) || g.size(0) != 2) return {};
  // NaN marks "no term" (tile_arithmetic.h): an empty value (M = −∞) and a
  // zero edge, marked while packing.
  auto out = at::empty(ops.out_shape, g.options());
  return run_product<MaxProdPairKernel, Lift::kMarkZeros, false>(ops.g, w, out, nullptr) ? out : Tensor();
}

std::tuple<Tensor, Tensor> max_prod_matmul_argmax(const Tensor& g, const Tensor& w) {
  BatchedOperands ops;
  if (!kernel_applies(g, w, ops) || g.size(0) != 2 || !index_fits(ops.g.size(-1), 2)) return {};
  auto out = at::empty(ops.out_shape, g.options());
  auto idx = at::empty(ops.out_shape, g.options().dtype(at::kInt));
  if (!run_product<MaxProdPairKernel, Lift::kMarkZeros, true>(ops.g, w, out, &idx)) return {};
  return {out, idx};
}

Tensor kmax_matmul(const Tensor& g, const Tensor& w, int64_t k) {
  if (device::routes(g, w)) return device::kmax_matmul(g, w, k);
  BatchedOperands ops;
  if (k < 1 || k > 8 || g.size(0) != k || !kernel_applies(g, w, ops)) return {};
  if (k == 1) {  // one score: the max-plus product itself
    auto out = at::empty(ops.out_shape, g.options());
    return run_product<MaxPlusKernel, Lift::kLogAbs, false>(ops.g, w, out, nullptr) ? out : Tensor();
  }
  auto out = at::empty(ops.out_shape, g.options());
  bool ok = false;
  switch (k) {  // the network of the power of two >= k, pruned to k lanes
    case 2: ok = run_product<TopKMergeKernel<2, MaxPlusKernel>, Lift::kLogAbs, false>(ops.g, w, out, nullptr); break;
    case 3: ok = run_product<TopKMergeKernel<4, MaxPlusKernel, 3>, Lift::kLogAbs, false>(ops.g, w, out, nullptr); break;
    case 4: ok = run_product<TopKMergeKernel<4, MaxPlusKernel>, Lift::kLogAbs, false>(ops.g, w, out, nullptr); break;
    case 5: ok = run_product<TopKMergeKernel<8, MaxPlusKernel, 5>, Lift::kLogAbs, false>(ops.g, w, out, nullptr); break;
    case 6: ok = run_product<TopKMergeKernel<8, MaxPlusKernel, 6>, Lift::kLogAbs, false>(ops.g, w, out, nullptr); break;
    case 7: ok = run_product<TopKMergeKernel<8, MaxPlusKernel, 7>, Lift::kLogAbs, false>(ops.g, w, out, nullptr); break;
    default: ok = run_product<TopKMergeKernel<8, MaxPlusKernel>, Lift::kLogAbs, false>(ops.g, w, out, nullptr);
  }
  return ok ? out : Tensor();
}

std::tuple<Tensor, Tensor> kmax_matmul_argmax(const Tensor& g, const Tensor& w, int64_t k) {
  BatchedOperands ops;
  if (k < 1 || k > 8 || g.size(0) != k || !kernel_applies(g, w, ops)) return {};
  if (!index_fits(ops.g.size(-1), k)) return {};
  // the winners pass holds indices in the scores' type: exact in float below 2^24
  if (g.scalar_type() == at::kFloat && ops.g.size(-1) * k > (int64_t(1) << 24)) return {};
  auto idx = at::empty(ops.out_shape, g.options().dtype(at::kInt));
  if (k == 1) {  // one score: the max-plus product with its argmax
    auto out = at::empty(ops.out_shape, g.options());
    if (!run_product<MaxPlusKernel, Lift::kLogAbs, true>(ops.g, w, out, &idx)) return {};
    return {out, idx};
  }
  // The lists, then their winners (WinnersJob).
  auto best = kmax_matmul(g, w, k);
  if (!best.defined()) return {};
  const Isa isa = detect_isa();
  const Tensor entries = distinct_entries(w);
  const bool ok = g.scalar_type() == at::kFloat ? launch_winners<float>(isa, ops.g, entries, best, idx)
                                                : launch_winners<double>(isa, ops.g, entries, best, idx);
  return ok ? std::make_tuple(best, idx) : std::tuple<Tensor, Tensor>();
}

}  // namespace kernels
}  // namespace torch_semiring
