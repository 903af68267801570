// Register-blocked CPU GEMMs for the max semirings (max-plus, max-times, the
// signed max_prod pair, kmax's top-k lists; max-plus/max-times optionally with
// argmax), GotoBLAS-style:
//
//   for each block of KC along k:            (B micro-panel KC×NR ≈ 16 KB: L1)
//     for each block of MC rows of g:        (packed A block ≈ 192 KB: L2)
//       pack the rows, MR at a time, k-major
//       for each panel of NR columns:        (B packed once per call, lifted)
//         for each MR rows: micro-kernel — MR×NR accumulators in registers
//
// Packing reads g and w through their strides, so transposed or broadcast
// (stride-0) operands cost nothing extra (B is re-packed only when a batch
// entry's w differs from the previous entry's). Single-threaded: the engine calls many small products, and the
// benchmarks pin one thread. lift(w) is applied once per element
// with ATen's vectorised log/abs before packing, never per term.
//
// One source, three instruction sets: the kernel is written with GCC vector
// extensions (tile_arithmetic.h) and instantiated inside functions marked
// __attribute__((target(...), flatten)), so the whole loop nest is compiled for
// AVX-512, AVX2 or the baseline ISA without any special build flag; the choice
// is made at run time with __builtin_cpu_supports.
#include "kernels/cpu_gemm.h"

// Vector types in template arguments trigger GCC's "ABI changed" notes; these
// functions are all internal, so the ABI of vector arguments never matters.
// (Before tile_arithmetic.h: its templates are instantiated with vectors.)
#pragma GCC diagnostic ignored "-Wpsabi"
#include "kernels/tile_arithmetic.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

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

// min/max of a tensor in one pass; NaN anywhere makes both NaN.
std::pair<double, double> range_of(const Tensor& t) {
  auto mm = at::aminmax(t);
  return {std::get<0>(mm).item<double>(), std::get<1>(mm).item<double>()};
}

namespace {

template <class T, int Bytes>
struct VecOf {
  typedef T type __attribute__((vector_size(Bytes)));
};
// Lane-wise comparison masks have integer lanes of the same width as T.
template <class T>
struct IndexLane;
template <>
struct IndexLane<float> {
  using type = int32_t;
};
template <>
struct IndexLane<double> {
  using type = int64_t;
};

// One product of a batch: A = the value's components (strided), B = lifted
// edge weights (strided), C = output components, contiguous (M, N) each.
template <class T>
struct Job {
  int64_t M, N, K;
  const T* a;
  int64_t a_c, a_m, a_k;
  int64_t a_components;  // components present in g; packing pads the rest with the zero (kmax)
  const T* b;
  int64_t b_k, b_n;
  T* c;
  int64_t c_c;
  int32_t* idx;  // argmax (M, N) or nullptr
  T* apack;
  T* bpack;
  bool pack_b;  // false when this batch entry reuses the previous B (broadcast)
};

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

template <class V, class T>
TS_TILE_FN V load(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
template <class V, class T>
TS_TILE_FN void store(T* p, V v) {
  std::memcpy(p, &v, sizeof(V));
}

// acc (MR × NR per component) ⊕= ⊕_k A[:, k] ⊗ B[k, :] over kc steps.
// c: the tile in the output (ldc = row stride, cc = component stride), read
// back unless `first`; ix likewise for the argmax.
template <class Op, class T, class V, int MR, int NV, bool ARG>
TS_TILE_FN void micro_kernel(int64_t kc, int64_t k0, const T* ap, const T* bp, T* c, int64_t ldc, int64_t cc,
                             int32_t* ix, int64_t ldi, bool first) {
  constexpr int L = sizeof(V) / sizeof(T), C = Op::kComponents, NR = NV * L;
  using I = typename IndexLane<T>::type;
  using IV = typename VecOf<I, sizeof(V)>::type;
  V acc[MR][NV][C];
  IV arg[MR][NV];
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
        if (first) {
          arg[i][j] = IV{} - 1;
        } else {
          for (int l = 0; l < L; ++l) arg[i][j][l] = ix[i * ldi + j * L + l];
        }
      }
    }
  }
  for (int64_t k = 0; k < kc; ++k) {
    V b[NV];
    _Pragma("GCC unroll 4") for (int j = 0; j < NV; ++j) b[j] = load<V>(bp + k * NR + j * L);
    const T* a = ap + k * MR * C;
    if constexpr (ARG) {
      const IV kv = IV{} + I(k0 + k);
      _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) {
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; ++j) {
          // strict >: ties → smallest k (the same function as the CUDA kernel's)
          argmax_update<Op>(acc[i][j][0], arg[i][j], a[i], b[j], kv);
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
        for (int l = 0; l < L; ++l) ix[i * ldi + j * L + l] = int32_t(arg[i][j][l]);
    }
  }
}

template <class Op, class T, class V, int MR, int NV, bool ARG>
TS_TILE_FN void run_job(const Job<T>& J) {
  constexpr int L = sizeof(V) / sizeof(T), C = Op::kComponents, NR = NV * L;
  constexpr int64_t KC = block_k<T, C, NR>(), MC = block_m<T, C, MR, NR>();
  const int64_t M = J.M, N = J.N, K = J.K;
  const int64_t panels = (N + NR - 1) / NR;

  // B: panel-major, then k, then NR lanes; columns past N padded with 0 (their
  // results are never stored).
  if (J.pack_b) {
    for (int64_t p = 0; p < panels; ++p) {
      T* dst = J.bpack + p * K * NR;
      const int64_t n0 = p * NR, nv = std::min<int64_t>(NR, N - n0);
      for (int64_t k = 0; k < K; ++k) {
        const T* src = J.b + k * J.b_k + n0 * J.b_n;
        T* d = dst + k * NR;
        if (J.b_n == 1) {
          std::memcpy(d, src, nv * sizeof(T));
        } else {
          for (int64_t n = 0; n < nv; ++n) d[n] = src[n * J.b_n];
        }
        for (int64_t n = nv; n < NR; ++n) d[n] = T(0);
      }
    }
  }

  alignas(64) T tile[C * MR * NR];
  alignas(64) int32_t tile_ix[ARG ? MR * NR : 1];
  for (int64_t k0 = 0; k0 < K; k0 += KC) {
    const int64_t kc = std::min(KC, K - k0);
    const bool first = k0 == 0;
    for (int64_t m0 = 0; m0 < M; m0 += MC) {
      const int64_t mc = std::min(MC, M - m0);
      const int64_t strips = (mc + MR - 1) / MR;
      // A: MR rows at a time, k-major, components innermost; rows past M
      // padded with 0 (never stored).
      for (int64_t s = 0; s < strips; ++s) {
        T* dst = J.apack + s * kc * MR * C;
        for (int64_t k = 0; k < kc; ++k) {
          for (int i = 0; i < MR; ++i) {
            const int64_t m = m0 + s * MR + i;
            for (int q = 0; q < C; ++q)
              dst[(k * MR + i) * C + q] = m >= M                ? T(0)
                                          : q < J.a_components ? J.a[q * J.a_c + m * J.a_m + (k0 + k) * J.a_k]
                                                               : Op::template zero<T>(q);
          }
        }
      }
      for (int64_t p = 0; p < panels; ++p) {
        const int64_t n0 = p * NR, nv = std::min<int64_t>(NR, N - n0);
        const T* bp = J.bpack + (p * K + k0) * NR;
        for (int64_t s = 0; s < strips; ++s) {
          const int64_t r0 = m0 + s * MR, mv = std::min<int64_t>(MR, M - r0);
          const T* ap = J.apack + s * kc * MR * C;
          T* c = J.c + r0 * N + n0;
          int32_t* ix = J.idx ? J.idx + r0 * N + n0 : nullptr;
          if (mv == MR && nv == NR) {
            micro_kernel<Op, T, V, MR, NV, ARG>(kc, k0, ap, bp, c, N, J.c_c, ix, N, first);
            continue;
          }
          // Edge tile: run on a full-size scratch tile, copy the valid part.
          if (!first) {
            for (int q = 0; q < C; ++q)
              for (int64_t i = 0; i < mv; ++i)
                for (int64_t n = 0; n < nv; ++n) tile[(q * MR + i) * NR + n] = c[q * J.c_c + i * N + n];
            if (ARG)
              for (int64_t i = 0; i < mv; ++i)
                for (int64_t n = 0; n < nv; ++n) tile_ix[i * NR + n] = ix[i * N + n];
          }
          micro_kernel<Op, T, V, MR, NV, ARG>(kc, k0, ap, bp, tile, NR, MR * NR, tile_ix, NR, first);
          for (int q = 0; q < C; ++q)
            for (int64_t i = 0; i < mv; ++i)
              for (int64_t n = 0; n < nv; ++n) c[q * J.c_c + i * N + n] = tile[(q * MR + i) * NR + n];
          if (ARG)
            for (int64_t i = 0; i < mv; ++i)
              for (int64_t n = 0; n < nv; ++n) ix[i * N + n] = tile_ix[i * NR + n];
        }
      }
    }
  }
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
  template <class V, class T>
  TS_TILE_FN static void update(V* acc, const T* a, V b) { acc[0] = max_keep(acc[0], term(a[0], b)); }
};
using MaxPlusKernel = MaxPlusOnFma;
#else
using MaxPlusKernel = MaxPlus;
#endif

// Register budget: MR·NV·C accumulators (+ MR·NV argmax vectors) plus the NV
// B vectors must fit the register file (32 zmm; 16 ymm/xmm).
// (12×2 / 6×2 tiles for one component; 6 / 3 rows for pairs and argmax; kmax
// with KP scores down to 1 row.)
template <class Op, bool ARG>
constexpr int mr_for(int registers) {
  const int per_row = 2 * Op::kComponents * (ARG ? 2 : 1);  // NV = 2 vectors per row
  const int free = registers == 32 ? 24 : 12;
  return std::max(1, free / per_row);
}

enum class Isa { kPortable, kAvx2, kAvx512 };

#if defined(__x86_64__) || defined(__i386__)
template <class Op, class T, bool ARG>
__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,fma"), flatten)) void run_avx512(const Job<T>& J) {
  run_job<Op, T, typename VecOf<T, 64>::type, mr_for<Op, ARG>(32), 2, ARG>(J);
}
template <class Op, class T, bool ARG>
__attribute__((target("avx2,fma"), flatten)) void run_avx2(const Job<T>& J) {
  run_job<Op, T, typename VecOf<T, 32>::type, mr_for<Op, ARG>(16), 2, ARG>(J);
}
#endif
template <class Op, class T, bool ARG>
__attribute__((flatten)) void run_portable(const Job<T>& J) {
  run_job<Op, T, typename VecOf<T, 16>::type, mr_for<Op, ARG>(16), 2, ARG>(J);
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

template <class Op, class T, bool ARG>
void (*pick_kernel())(const Job<T>&) {
  switch (detect_isa()) {
#if defined(__x86_64__) || defined(__i386__)
    case Isa::kAvx512: return &run_avx512<Op, T, ARG>;
    case Isa::kAvx2: return &run_avx2<Op, T, ARG>;
#endif
    default: return &run_portable<Op, T, ARG>;
  }
}

// Runs the kernel over every batch entry. a: (C, *batch, M, K) and b:
// (*batch, K, N) already broadcast (stride 0 where broadcast); out: the
// contiguous (C, *batch, M, N) result; idx: contiguous (*batch, M, N) or
// undefined.
template <class Op, class T, bool ARG>
void launch(const Tensor& a, const Tensor& b, Tensor& out, Tensor* idx) {
  constexpr int C = Op::kComponents;
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  std::vector<int64_t> batch(b.sizes().begin(), b.sizes().end() - 2);
  int64_t nbatch = 1;
  for (auto s : batch) nbatch *= s;

  // The largest NR of any ISA (2 × 64-byte vectors) is a multiple of the
  // others, so this B buffer fits whichever kernel runs; A is one L2 block
  // plus a strip of rounding.
  const int64_t nr_max = 2 * 64 / int64_t(sizeof(T));
  const int64_t b_elems = (N + nr_max - 1) / nr_max * nr_max * K;
  const int64_t a_elems = kL2BlockBytes / int64_t(sizeof(T)) + 12 * 512 * C;
  auto work = at::empty({b_elems + a_elems + 16}, a.options());
  T* bpack = work.data_ptr<T>();
  T* apack = bpack + b_elems;

  auto kernel = pick_kernel<Op, T, ARG>();
  count_kernel_call();
  Job<T> J;
  J.M = M, J.N = N, J.K = K;
  J.a_c = a.stride(0), J.a_m = a.stride(-2), J.a_k = a.stride(-1);
  J.a_components = a.size(0);
  J.b_k = b.stride(-2), J.b_n = b.stride(-1);
  J.c_c = out.stride(0);
  J.apack = apack, J.bpack = bpack;
  const T* b_last = nullptr;
  std::vector<int64_t> pos(batch.size(), 0);
  for (int64_t e = 0; e < nbatch; ++e) {
    int64_t oa = 0, ob = 0;
    for (size_t d = 0; d < batch.size(); ++d) {
      oa += pos[d] * a.stride(1 + d);
      ob += pos[d] * b.stride(d);
    }
    J.a = a.data_ptr<T>() + oa;
    J.b = b.data_ptr<T>() + ob;
    J.c = out.data_ptr<T>() + e * M * N;
    J.idx = idx ? idx->data_ptr<int32_t>() + e * M * N : nullptr;
    J.pack_b = J.b != b_last;
    b_last = J.b;
    kernel(J);
    for (int64_t d = int64_t(batch.size()) - 1; d >= 0; --d) {  // next batch multi-index
      if (++pos[d] < batch[d]) break;
      pos[d] = 0;
    }
  }
}

template <class Op, bool ARG>
void launch_typed(const Tensor& a, const Tensor& b, Tensor& out, Tensor* idx) {
  if (a.scalar_type() == at::kFloat) {
    launch<Op, float, ARG>(a, b, out, idx);
  } else {
    launch<Op, double, ARG>(a, b, out, idx);
  }
}

bool all_finite(const Tensor& t) {
  auto r = range_of(t);
  return std::isfinite(r.first) && std::isfinite(r.second);
}

constexpr double kInf = std::numeric_limits<double>::infinity();

// The preconditions under which the max kernels equal the generic path:
// finite w (an infinite w would meet −∞ or 0 in g and give NaN there), and g
// free of NaN and of values the generic arithmetic would turn into NaN
// (+∞ in viterbi; for max_abs, g must be finite and >= 0 so that the kernel's
// start value 0 is neutral).
bool max_inputs_ok(bool times, const Tensor& g, const Tensor& w) {
  if (!all_finite(w)) return false;
  auto r = range_of(g);
  if (times) return r.first >= 0 && r.second < kInf;
  return r.second < kInf;  // false for NaN too
}

Tensor lifted(bool times, const Tensor& w) { return times ? w.abs() : w.abs().log(); }

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
  BatchedOperands ops;
  if (!kernel_applies(g, w, ops) || g.size(0) != 1 || !max_inputs_ok(times, g, w)) return {};
  auto b = lifted(times, ops.w);
  auto out = at::empty(ops.out_shape, g.options());
  if (times) {
    launch_typed<MaxTimes, false>(ops.g, b, out, nullptr);
  } else {
    launch_typed<MaxPlusKernel, false>(ops.g, b, out, nullptr);
  }
  return out;
}
}  // namespace

Tensor max_plus_matmul(const Tensor& g, const Tensor& w) { return max_matmul(false, g, w); }
Tensor max_times_matmul(const Tensor& g, const Tensor& w) { return max_matmul(true, g, w); }

std::tuple<Tensor, Tensor> max_matmul_argmax(const std::string& semiring, const Tensor& g, const Tensor& w) {
  TORCH_CHECK(semiring == "viterbi" || semiring == "max_abs",
              "torch_semiring: max_matmul_argmax supports 'viterbi' and 'max_abs', got '", semiring, "'");
  const bool times = semiring == "max_abs";
  BatchedOperands ops;
  TORCH_CHECK(kernel_dtype(g, w), "torch_semiring: max_matmul_argmax needs CPU float32/float64 tensors of one "
              "dtype that do not require grad, got ", g.scalar_type(), " and ", w.scalar_type());
  TORCH_CHECK(g.size(0) == 1 && broadcast_operands(g, w, ops),
              "torch_semiring: max_matmul_argmax needs a value (1, *batch, M, K) and w (*batch, K, N), got ",
              g.sizes(), " and ", w.sizes());
  TORCH_CHECK(max_inputs_ok(times, g, w), "torch_semiring: max_matmul_argmax needs finite w and g without NaN",
              times ? ", +inf or negative entries" : " or +inf", " (the generic path handles those)");
  auto out = at::empty(ops.out_shape, g.options());
  std::vector<int64_t> ishape(ops.out_shape.begin() + 1, ops.out_shape.end());
  auto idx = at::empty(ishape, g.options().dtype(at::kInt));
  for (auto s : ops.out_shape) if (s == 0) return {out, idx};
  if (ops.g.size(-1) == 0) {  // K = 0: no term, no path
    out.fill_(times ? 0.0 : -kInf);
    idx.fill_(-1);
    return {out, idx};
  }
  auto b = lifted(times, ops.w);
  if (times) {
    launch_typed<MaxTimes, true>(ops.g, b, out, &idx);
  } else {
    launch_typed<MaxPlusKernel, true>(ops.g, b, out, &idx);
  }
  return {out, idx};
}

Tensor max_prod_matmul(const Tensor& g, const Tensor& w) {
  BatchedOperands ops;
  if (!kernel_applies(g, w, ops) || g.size(0) != 2 || !all_finite(w)) return {};
  auto r = range_of(g);
  if (std::isnan(r.first) || std::isnan(r.second)) return {};
  // NaN marks "no term" (tile_arithmetic.h): an empty value (M = −∞) in both
  // components, and a zero edge.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto a = at::where(ops.g.select(0, 0).eq(-kInf).unsqueeze(0), nan, ops.g);
  auto b = at::where(ops.w.eq(0), nan, ops.w);
  auto out = at::empty(ops.out_shape, g.options());
  launch_typed<MaxProdPair, false>(a, b, out, nullptr);
  return out;
}

Tensor kmax_matmul(const Tensor& g, const Tensor& w, int64_t k) {
  BatchedOperands ops;
  if (k < 1 || k > 8 || g.size(0) != k || !kernel_applies(g, w, ops) || !max_inputs_ok(false, g, w)) return {};
  auto b = lifted(false, ops.w);
  if (k == 1) {  // one score: the max-plus product itself
    auto out = at::empty(ops.out_shape, g.options());
    launch_typed<MaxPlusKernel, false>(ops.g, b, out, nullptr);
    return out;
  }
  // Lists padded with −∞ to a power of two (packing pads g; the padded scores
  // stay −∞ and are cut off).
  const int64_t kp = k <= 2 ? 2 : k <= 4 ? 4 : 8;
  auto shape = ops.out_shape;
  shape[0] = kp;
  auto out = at::empty(shape, g.options());
  if (kp == 2) {
    launch_typed<TopKMerge<2, MaxPlusKernel>, false>(ops.g, b, out, nullptr);
  } else if (kp == 4) {
    launch_typed<TopKMerge<4, MaxPlusKernel>, false>(ops.g, b, out, nullptr);
  } else {
    launch_typed<TopKMerge<8, MaxPlusKernel>, false>(ops.g, b, out, nullptr);
  }
  return out.narrow(0, 0, k);
}

}  // namespace kernels
}  // namespace torch_semiring
