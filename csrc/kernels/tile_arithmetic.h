// Per-term ⊕/⊗ arithmetic of the semiring GEMM micro-kernels, kept apart from
// the blocking and packing so that a CUDA port can include it unchanged.
//
// The CUDA kernels (csrc/kernels/cuda/) include it too: under nvcc every
// function here is __host__ __device__, V and T are then plain float, and the
// same ⊕/⊗/argmax bookkeeping runs per thread on the GPU (and in the host
// emulation of those kernels, tests/test_cuda_emulation.py).
//
// Every function is written once for "V": a scalar (float/double) or a GCC
// vector-extension type (e.g. 16 floats). The operators used (+, *, <, >, ?:)
// mean the same for both, and the compiler picks SSE/AVX2/AVX-512
// instructions from the target of the function it is inlined into.
//
// The ⊕ of the max semirings is written `t > acc ? t : acc` (and `t < acc ? …`
// for min) on purpose: when the term t is NaN the comparison is false and the
// accumulator is kept. The max_prod kernel uses NaN as the "no edge / empty
// value" marker for exactly that reason; the callers reject NaN inputs before
// packing, so a NaN can only be such a marker.
//
// `accepts(v, present)` says for which entries of g (v: the entry's
// components, the first `present` of them given) a kernel equals the generic
// arithmetic; the CPU kernels test it while packing g (no separate pass) and
// decline the whole product when an entry fails.
#pragma once

#include <cstdint>
#include <limits>

#define TS_PRAGMA(x) _Pragma(#x)
#if defined(__CUDACC__)
#define TS_TILE_FN __host__ __device__ __forceinline__
#else
#define TS_TILE_FN inline __attribute__((always_inline))
#endif
// Unrolling hint: nvcc's in the device pass, none in nvcc's host pass (its
// front end rejects GCC's pragma; host code that matters is built by g++),
// GCC's otherwise.
#if defined(__CUDA_ARCH__)
#define TS_UNROLL(n) TS_PRAGMA(unroll n)
#elif defined(__CUDACC__)
#define TS_UNROLL(n)
#else
#define TS_UNROLL(n) TS_PRAGMA(GCC unroll n)
#endif

namespace torch_semiring {
namespace kernels {

template <class V>
TS_TILE_FN V max_keep(V acc, V t) { return t > acc ? t : acc; }
template <class V>
TS_TILE_FN V min_keep(V acc, V t) { return t < acc ? t : acc; }

// One term of a max product with argmax bookkeeping: the term wins only if it
// is strictly greater, so a later k never replaces an equal earlier one
// (ties → smallest k, as long as k is visited in increasing order); the index
// stays −1 while nothing beats the semiring zero. For vectors, `I` is the
// matching integer-lane vector and the comparison a lane mask.
template <class Op, class V, class T, class I>
TS_TILE_FN void argmax_update(V& acc, I& arg, const T& a, V b, I k) {
  V t = Op::term(a, b);
  auto win = t > acc;
  acc = win ? t : acc;
  arg = win ? k : arg;
}

// ⊕ of two (value, index) candidates of an argmax reduction: is (v1, i1)
// better than (v0, i0)? NaN beats every number (as torch.amax propagates it),
// equal values go to the smaller index, and index −1 marks "nothing yet" (the
// value is then the zero −∞, which an element only replaces by being > −∞).
template <class T>
TS_TILE_FN bool argmax_better(T v1, int64_t i1, T v0, int64_t i0) {
  const bool n1 = v1 != v1, n0 = v0 != v0;
  if (n1 || n0) return n1 && (!n0 || i1 < i0);
  if (i1 < 0) return false;
  return v1 > v0 || (v1 == v0 && i0 >= 0 && i1 < i0);
}

// viterbi: out = max_k a + b, b = log|w| (lifted once while packing).
// g: no NaN and no +∞ (+∞ + log 0 is NaN in the generic arithmetic).
struct MaxPlus {
  static constexpr int kComponents = 1;
  template <class T>
  TS_TILE_FN static constexpr T zero(int) { return -std::numeric_limits<T>::infinity(); }
  template <class T>
  TS_TILE_FN static bool accepts(const T* v, int) { return v[0] < std::numeric_limits<T>::infinity(); }
  template <class V, class T>
  TS_TILE_FN static V term(T a, V b) { return a + b; }
  template <class V, class T>
  TS_TILE_FN static void update(V* acc, const T* a, V b) { acc[0] = max_keep(acc[0], term(a[0], b)); }
};

// max_abs: out = max_k a · b, b = |w|; a, b >= 0 so the zero 0 is neutral.
// g: finite and >= 0 (the start value 0 must be neutral; ∞·0 is NaN).
struct MaxTimes {
  static constexpr int kComponents = 1;
  template <class T>
  TS_TILE_FN static constexpr T zero(int) { return T(0); }
  template <class T>
  TS_TILE_FN static bool accepts(const T* v, int) { return v[0] >= T(0) && v[0] < std::numeric_limits<T>::infinity(); }
  template <class V, class T>
  TS_TILE_FN static V term(T a, V b) { return a * b; }
  template <class V, class T>
  TS_TILE_FN static void update(V* acc, const T* a, V b) { acc[0] = max_keep(acc[0], term(a[0], b)); }
};

// max_prod: a value is the pair (M, m) of extreme signed path products;
// ⊗ by the edge w gives (max(Mw, mw), min(Mw, mw)), ⊕ is (max, min).
// An empty value (M = −∞) and a zero edge (w = 0, no edge) are packed as NaN,
// so that both products are NaN and max_keep/min_keep drop the term — without
// it −∞·w or +∞·0 would produce wrong infinities or NaN.
struct MaxProdPair {
  static constexpr int kComponents = 2;
  // component 0 (M) starts at −∞, component 1 (m) at +∞: the empty set.
  template <class T>
  TS_TILE_FN static constexpr T zero(int c) {
    return c == 0 ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
  }
  // g: no NaN (NaN is the kernel's own marker); infinities are exact.
  template <class T>
  TS_TILE_FN static bool accepts(const T* v, int) { return v[0] == v[0] && v[1] == v[1]; }
  template <class V, class T>
  TS_TILE_FN static void update(V* acc, const T* a, V b) {
    V p = a[0] * b, q = a[1] * b;
    acc[0] = max_keep(max_keep(acc[0], p), q);
    acc[1] = min_keep(min_keep(acc[1], p), q);
  }
  // With argmax, for path extraction: arg[0] says which term won M, arg[1]
  // which won m, each as 2k + c — c the component of g[k] whose product it is
  // (0: M·w, 1: m·w). Needs M >= m (or an empty, NaN-marked value): then
  // M·w is the larger product for w > 0 and m·w for w < 0, so on a negative
  // edge M comes from m (c = 1) and m from M (c = 0), also when M = m. Each
  // extreme takes a strictly better term only: ties → the smallest k; the
  // index stays −1 while no term beats the start value (−∞ for M, +∞ for m),
  // including a term that overflowed to it. p, q: the products a[0]·b,
  // a[1]·b (a kernel may compute them its own way).
  template <class V, class IV, class I>
  TS_TILE_FN static void update_arg_terms(V* acc, IV* arg, V p, V q, V b, I k) {
    const auto negative = b < V{};  // a lane mask; false for a NaN-marked (zero) edge
    const V hi = negative ? q : p, lo = negative ? p : q;
    const IV from_M = IV{} + I(2 * k), from_m = IV{} + I(2 * k + 1);
    const auto win_hi = hi > acc[0], win_lo = lo < acc[1];
    acc[0] = win_hi ? hi : acc[0];
    arg[0] = win_hi ? (negative ? from_m : from_M) : arg[0];
    acc[1] = win_lo ? lo : acc[1];
    arg[1] = win_lo ? (negative ? from_M : from_m) : arg[1];
  }
  template <class V, class IV, class T, class I>
  TS_TILE_FN static void update_arg(V* acc, IV* arg, const T* a, V b, I k) {
    update_arg_terms(acc, arg, V(a[0] * b), V(a[1] * b), b, k);
  }
};

// The NaN marking of MaxProdPair's inputs, per element: an empty value
// (M = −∞) becomes (NaN, NaN), a zero edge NaN. Applied while packing: by the
// CPU kernels when they pack g and w (cpu_gemm.cpp), by the CUDA kernel while
// loading a tile into shared memory (pack_a) and lifting the weights (pack_b).
template <class Op>
struct PackMark {
  template <class T>
  TS_TILE_FN static void pack_a(T*) {}
  template <class T>
  TS_TILE_FN static T pack_b(T w) { return w; }
};
template <>
struct PackMark<MaxProdPair> {
  template <class T>
  TS_TILE_FN static void pack_a(T* v) {
    if (v[0] == -std::numeric_limits<T>::infinity()) v[0] = v[1] = std::numeric_limits<T>::quiet_NaN();
  }
  template <class T>
  TS_TILE_FN static T pack_b(T w) { return w == T(0) ? std::numeric_limits<T>::quiet_NaN() : w; }
};

// kmax: a value is the E best scores of an element, descending. ⊗ by an
// edge adds the one score log|w| to each (order kept); ⊕ keeps the top E of
// the union. The union of two descending lists is merged as in a bitonic
// sorter of KP (the power of two >= E) lanes, both lists padded with −∞:
// the elementwise max of one list and the other reversed holds exactly the
// top KP (as a V-shaped, i.e. bitonic, sequence), and log2(KP) half-cleaner
// stages sort it — KP/2·log2(KP)+KP compare-exchanges instead of KP² for
// insertion. For E < KP the padding is known at compile time: a lane that
// meets −∞ is a copy, and of the network only what reaches the first E
// outputs is kept — a compare-exchange whose smaller output is never read
// is a max (E = 5: 5 adds, 2 + 8·2 + 3 = 21 max/min, where the padded
// KP = 8 list took 8 adds and 8 + 12·2 = 32).
// `Term` supplies the addition (MaxPlus, or a faster bit-identical variant).
template <int KP, class Term = MaxPlus, int E = KP>
struct TopKMerge {
  static_assert(KP >= 2 && (KP & (KP - 1)) == 0, "TopKMerge: KP must be a power of two >= 2");
  static_assert(E <= KP && 2 * E > KP, "TopKMerge: KP must be the power of two >= E");
  static constexpr int kComponents = E;
  using Addition = Term;
  template <class T>
  TS_TILE_FN static constexpr T zero(int) { return -std::numeric_limits<T>::infinity(); }
  template <class T>
  TS_TILE_FN static bool accepts(const T* v, int present) {
    bool ok = true;
    for (int q = 0; q < present; ++q) ok &= Term::accepts(v + q, 1);
    return ok;
  }
  // Is lane p read after the stage of distance d (d = KP/2, …, 1)? The later
  // stages mix only lanes that differ in the bits below d, so lane p reaches
  // the outputs whose bits from d up are p's: one of them is < E exactly when
  // p with those low bits cleared is. (Closed form: a recursive always-inline
  // function does not compile.)
  TS_TILE_FN static constexpr bool read_after(int d, int p) { return (p & ~(d - 1)) < E; }
  // The network; exchange(x, y, n) makes (x, y) = (max, min)(x, y) for the
  // n-th full compare-exchange (a kernel may choose its instructions by n).
  template <class V, class T, class Exchange>
  TS_TILE_FN static void merge(V* acc, const T* a, V b, const Exchange& exchange) {
    V c[KP];
TS_UNROLL(8)
    for (int q = 0; q < KP; ++q) {
      const bool mine = q < E, theirs = KP - 1 - q < E;  // else −∞ padding
      if (mine && theirs) c[q] = max_keep(acc[q], Term::term(a[KP - 1 - q], b));
      else if (mine) c[q] = acc[q];
      else c[q] = Term::term(a[KP - 1 - q], b);  // 2E > KP: one of the two is there
    }
    int n = 0;
TS_UNROLL(4)
    for (int d = KP / 2; d >= 1; d /= 2) {
TS_UNROLL(8)
      for (int i = 0; i < KP; ++i) {
        if (i & d) continue;
        if (read_after(d, i + d)) {  // both outputs read (the read lanes are a prefix)
          exchange(c[i], c[i + d], n++);
        } else if (read_after(d, i)) {
          c[i] = max_keep(c[i + d], c[i]);
        }
      }
    }
TS_UNROLL(8)
    for (int q = 0; q < E; ++q) acc[q] = c[q];
  }
  // How many full compare-exchanges (full = true) or lone maxes merge() makes.
  TS_TILE_FN static constexpr int exchanges(bool full) {
    int n = 0;
    for (int d = KP / 2; d >= 1; d /= 2)
      for (int i = 0; i < KP; ++i)
        if (!(i & d) && (full ? read_after(d, i + d) : !read_after(d, i + d) && read_after(d, i))) ++n;
    return n;
  }
  struct MaxMinExchange {
    template <class V>
    TS_TILE_FN void operator()(V& x, V& y, int) const {
      const V hi = max_keep(y, x), lo = min_keep(y, x);
      x = hi, y = lo;
    }
  };
  template <class V, class T>
  TS_TILE_FN static void update(V* acc, const T* a, V b) { merge(acc, a, b, MaxMinExchange{}); }
};

}  // namespace kernels
}  // namespace torch_semiring
