// Per-row kernels for the off-diagonal part of centred normalisation
// Jacobians; the math, the cost model and the exactness argument are in
// norm_rows.h. Layout of this file: sorting, range sums, the sum family
// (abs, count, log, entropy), the direct φ pass, the envelope family (max_abs,
// viterbi, max_prod), and the tensor-level entry points.
#include "kernels/norm_rows.h"

// Vector types in template arguments trigger GCC's "ABI changed" notes; these
// functions are all internal.
#pragma GCC diagnostic ignored "-Wpsabi"
// No fused multiply-adds: 1 + x·t is rounded as the generic path rounds it
// (one_plus), also inside the FMA-enabled vector functions — but for the float
// lanes of the direct pair pass, which round it once (one_plus_exact).
#pragma GCC optimize("fp-contract=off")

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "kernels/cpu_gemm.h"  // kernel_isa
#include "kernels/cpu_vectors.h"  // VecOf, for vector_math.h
#include "kernels/elementwise.h"  // exp_shifted, log_shifted
#include "kernels/near_series.h"  // kNearTau, the near pairs' polynomials

namespace torch_semiring::kernels {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Terms with |1 + x_i t| < kWindow are summed directly: outside it, Σw + t·Σwx
// loses at most ~3·eps·(1 + 2/kWindow) of each term (≈ 6e-12 relative).
constexpr double kWindow = 1.0 / 4096;
// An output whose linear-space sum is below this (× N × the largest |y| of
// its row) may miss mass that underflowed in exp(a − max): recompute it.
constexpr double kUnderflowGuard = 1e-290;

// 1 + x·t, rounded as the generic path (Semiring::norm_offdiagonal) rounds it —
// product, then sum — so both agree on which weights are exactly 0 (no edge).
template <class T>
inline __attribute__((always_inline)) T one_plus(T x, T t) {
  T p = x * t;
#if defined(__x86_64__) || defined(__i386__)
  asm("" : "+v"(p));  // never fused into an FMA, whatever the caller's contraction setting
#endif
  return p + 1;
}

// ---- sorting ---------------------------------------------------------------

// Ascending argsort of n doubles: an LSD radix sort (4 passes of 8 bits; a
// pass whose byte is the same for all keys is skipped) on the top 32 bits of
// an order-preserving transform of their bit patterns (sign, exponent and 20
// bits of mantissa), then an insertion pass on the full values, which only
// has to reorder values equal in those bits (within ~1e-6 of each other).
struct RadixSorter {
  std::vector<uint32_t> keys, keys2;
  std::vector<int32_t> idx2;

  void sort(const double* x, int64_t n, int32_t* order) {
    keys.resize(n), keys2.resize(n), idx2.resize(n);
    uint32_t hist[4][256];
    std::memset(hist, 0, sizeof(hist));
    for (int64_t i = 0; i < n; ++i) {
      uint64_t u;
      std::memcpy(&u, &x[i], sizeof(u));
      u = (u >> 63) ? ~u : (u | (uint64_t(1) << 63));  // order-preserving
      const uint32_t k = uint32_t(u >> 32);
      keys[i] = k;
      order[i] = int32_t(i);
      for (int b = 0; b < 4; ++b) hist[b][(k >> (8 * b)) & 0xff]++;
    }
    uint32_t* src = keys.data();
    uint32_t* dst = keys2.data();
    int32_t* isrc = order;
    int32_t* idst = idx2.data();
    for (int b = 0; b < 4; ++b) {
      if (n == 0 || hist[b][(src[0] >> (8 * b)) & 0xff] == uint32_t(n)) continue;  // one bucket: no-op pass
      uint32_t pos[256], run = 0;
      for (int v = 0; v < 256; ++v) pos[v] = run, run += hist[b][v];
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t d = (src[i] >> (8 * b)) & 0xff;
        dst[pos[d]] = src[i];
        idst[pos[d]++] = isrc[i];
      }
      std::swap(src, dst);
      std::swap(isrc, idst);
    }
    if (isrc != order) std::memcpy(order, isrc, sizeof(int32_t) * n);
    for (int64_t k = 1; k < n; ++k) {  // exact order among equal keys
      const int32_t v = order[k];
      int64_t q = k;
      for (; q > 0 && x[order[q - 1]] > x[v]; --q) order[q] = order[q - 1];
      order[q] = v;
    }
  }
};

// ---- range sums without subtraction ----------------------------------------

// Every range the sums need is a prefix, a suffix, or a window [L, R) whose
// ends only move right as the queries are taken in sorted order. The window
// is a queue kept as two stacks (a "back" running sum of [m, R) and "front"
// suffix sums of [L, m), refilled from the back when it runs empty): each sum
// is then of exactly the window's elements — no subtraction, so no
// cancellation against an excluded or outlying term — at O(1) amortised.
// S series, stored interleaved: v[k·S + s].
template <int S>
struct WindowSums {
  const double* v = nullptr;
  int64_t L = 0, R = 0, m = 0;
  std::vector<double> front;  // [i·S + s]: Σ of series s over [i, m)
  double back[S];             // Σ over [m, R)

  void reset(const double* values, int64_t n, int64_t start) {
    v = values, L = R = m = start;
    front.resize((n + 1) * S);
    for (int s = 0; s < S; ++s) back[s] = 0;
  }
  void advance(int64_t new_l, int64_t new_r) {
    if (R < new_r) {  // sums in locals: `back` may alias v for the compiler (a store and reload per term)
      double b[S];
      for (int s = 0; s < S; ++s) b[s] = back[s];
      for (; R < new_r; ++R)
        for (int s = 0; s < S; ++s) b[s] += v[R * S + s];
      for (int s = 0; s < S; ++s) back[s] = b[s];
    }
    if (new_l > m) {  // the front ran out: the back's elements become the front
      double acc[S] = {};
      for (int64_t i = R - 1; i >= m; --i)
        for (int s = 0; s < S; ++s) front[i * S + s] = acc[s] += v[i * S + s];
      for (int s = 0; s < S; ++s) back[s] = 0;
      m = R;
    }
    L = new_l;
  }
  double sum(int s) const { return (L < m ? front[L * S + s] : 0.0) + back[s]; }
};

// ---- the sum family ----------------------------------------------------------

// One row, W weight vectors: out[v][j] = Σ_{i≠j} w_v[i]·L(1 + x_i x_j),
// L = |·| or [· ≠ 0]. Queries are taken in sorted order: the negative x first
// (θ = −1/x rises from 0+), then the zeros, then the positive x (θ rises to
// 0−); the window bounds around θ only move right within each group.
// Series (interleaved, sorted order): 2v = w_v, 2v + 1 = w_v·x.
template <int W>
struct SumRow {
  static constexpr int S = 2 * W;
  RadixSorter sorter;
  WindowSums<S> window;
  std::vector<int32_t> order;
  std::vector<double> xs, series, prefix, suffix;  // series [k·S + s], prefix/suffix [k·S + s] over [0, k) / [k, n)
  std::vector<double> below, above;                // per query k: θ ∓ kWindow·|θ|, θ = −1/x_k (see bounds)

  void run(const double* x, int64_t n, const double* const* w, double* const* out, bool nonzero) {
    order.resize(n), xs.resize(n), series.resize(n * S), prefix.resize((n + 1) * S), suffix.resize((n + 1) * S);
    sorter.sort(x, n, order.data());
    for (int64_t k = 0; k < n; ++k) {
      const int32_t i = order[k];
      xs[k] = x[i];
      for (int v = 0; v < W; ++v) series[k * S + 2 * v] = w[v][i], series[k * S + 2 * v + 1] = w[v][i] * x[i];
    }
    {  // running sums in registers (reading back the entry just stored costs a store-to-load latency per term)
      double acc[S] = {};
      for (int s = 0; s < S; ++s) prefix[s] = 0;
      for (int64_t k = 0; k < n; ++k)
        for (int s = 0; s < S; ++s) prefix[(k + 1) * S + s] = acc[s] += series[k * S + s];
      for (int s = 0; s < S; ++s) acc[s] = 0, suffix[n * S + s] = 0;
      for (int64_t k = n - 1; k >= 0; --k)
        for (int s = 0; s < S; ++s) suffix[k * S + s] = acc[s] += series[k * S + s];
    }
    const int64_t first_zero = std::lower_bound(xs.begin(), xs.end(), 0.0) - xs.begin();
    const int64_t first_positive = std::upper_bound(xs.begin(), xs.end(), 0.0) - xs.begin();
    // x = 0: every weight is 1 + 0 = 1.
    for (int64_t k = first_zero; k < first_positive; ++k)
      for (int v = 0; v < W; ++v) out[v][order[k]] = prefix[k * S + 2 * v] + suffix[(k + 1) * S + 2 * v];
    // 1 + x t changes sign at x = θ = −1/t; [lo, hi) holds the x within a
    // relative kWindow of θ (|1 + x t| ≲ kWindow there), summed term by term.
    // The window edges of every query first, in one loop without a dependency
    // (vectorised divisions), so the scans below do not wait on a division.
    below.resize(n), above.resize(n);
    for (int64_t k = 0; k < n; ++k) {
      const double theta = -1.0 / xs[k], reach = kWindow * std::abs(theta);
      below[k] = theta - reach, above[k] = theta + reach;
    }
    auto bounds = [&](int64_t k, int64_t& lo, int64_t& hi) {
      while (lo < n && xs[lo] < below[k]) ++lo;
      if (hi < lo) hi = lo;
      while (hi < n && xs[hi] <= above[k]) ++hi;
    };
    auto finish = [&](int64_t k, double t, int64_t lo, int64_t hi, const double* pos, const double* neg) {
      for (int v = 0; v < W; ++v) {
        double s = nonzero ? pos[2 * v] + neg[2 * v]
                           : (pos[2 * v] + t * pos[2 * v + 1]) - (neg[2 * v] + t * neg[2 * v + 1]);
        for (int64_t q = lo; q < hi; ++q) {
          if (q == k) continue;
          const double y = one_plus(xs[q], t);
          s += nonzero ? (y != 0 ? series[q * S + 2 * v] : 0.0) : series[q * S + 2 * v] * std::abs(y);
        }
        out[v][order[k]] = s;
      }
    };
    double pos[S], neg[S];
    // t < 0: x < θ is positive — [0, k) ∪ (k, lo); x > θ negative — [hi, n).
    int64_t lo = 0, hi = 0;
    window.reset(series.data(), n, 1);
    for (int64_t k = 0; k < first_zero; ++k) {
      const double t = xs[k];
      bounds(k, lo, hi);
      window.advance(k + 1, std::max(lo, k + 1));  // (k, lo): j itself is positive, so lo > k
      for (int s = 0; s < S; ++s) pos[s] = prefix[k * S + s] + window.sum(s), neg[s] = suffix[hi * S + s];
      finish(k, t, lo, hi, pos, neg);
    }
    // t > 0: x > θ is positive — [hi, k) ∪ (k, n); x < θ negative — [0, lo).
    lo = 0, hi = 0;
    window.reset(series.data(), n, 0);
    for (int64_t k = first_positive; k < n; ++k) {
      const double t = xs[k];
      bounds(k, lo, hi);
      window.advance(std::min(hi, k), k);  // [hi, k): j itself is positive, so hi ≤ k
      for (int s = 0; s < S; ++s) pos[s] = window.sum(s) + suffix[(k + 1) * S + s], neg[s] = prefix[lo * S + s];
      finish(k, t, lo, hi, pos, neg);
    }
  }
};

// ---- Σ_{i≠j} w_i·term(1 + x_i x_j) directly, for terms of |y| ---------------

// The direct pair pass: out_s[j] = Σ_{i≠j} w_s[i]·term_s(y_ij), y = 1 + x_i x_j,
// for S series s at once, with term_s a function of |y| — |y| (abs, log,
// entropy's Z and Σ w h |y|), [y ≠ 0] (count), φ(y) = |y| log|y| (entropy). Such terms are symmetric
// (term_ij = term_ji), so one pass over the pairs i < j adds w_s[i]·term to
// out_s[j] and w_s[j]·term to out_s[i]: N(N−1)/2 terms, vectorised over j, the
// block never stored. O(N²/L) vector steps per row: against the sorted sums'
// O(N log N) it wins on rows up to ~1 000 float32 / ~500 float64 elements
// (the cut-offs below, by kernel and precision), and it is the only
// scheme for φ, which separates in no way. Bound by vector throughput (the row
// stays in L1: no cache blocking pays; blocking 2–4 rows of the φ pass
// measured no gain). Run in the graph's precision (float rows: float lanes,
// twice as many), with no cancellation: a sum of non-negative terms.
//
// The pass may contract multiply-adds into FMAs (its 1 + x·t is rounded
// explicitly: one_plus, one_plus_exact).
#pragma GCC push_options
#pragma GCC optimize("fp-contract=fast")

// vector_log_normal: one comparison feeding one select, which GCC keeps
// vectorised when the baseline-ISA helper is inlined into the pass's targets.
#include "kernels/vector_math.h"
using vmath::log_by_table;
using vmath::Vec;
using vmath::vector_log_normal;

// x, every w and every out hold kPairPad entries past n, x and w zero there: a
// pad term is 0·term(1 + 0·t) = 0, so the last vector of each i may run past n
// instead of a scalar tail (a scalar log per leftover term: ~30 % of the φ pass).
constexpr int64_t kPairPad = 16;


// 1 + x·t of float lanes rounded once, so 0 exactly where x·t = −1: the
// product of two floats is exact in double, so this is where the float64
// arithmetic on the same values (the old double kernels, the reference) has
// its zero weights — where one_plus in float would also zero weights of size
// ~1e-8 (a product rounded to −1), an edge that count would lose. One FMA in
// the AVX-512 and AVX2 targets; double lanes in the baseline's (no FMA there).
#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,fma"))) inline Vec<float, 64>::type one_plus_exact(
    Vec<float, 64>::type x, Vec<float, 64>::type t) {
  return (Vec<float, 64>::type)_mm512_fmadd_ps((__m512)x, (__m512)t, _mm512_set1_ps(1.0f));
}
__attribute__((target("avx2,fma"))) inline Vec<float, 32>::type one_plus_exact(Vec<float, 32>::type x,
                                                                               Vec<float, 32>::type t) {
  return (Vec<float, 32>::type)_mm256_fmadd_ps((__m256)x, (__m256)t, _mm256_set1_ps(1.0f));
}
#endif
inline Vec<float, 16>::type one_plus_exact(Vec<float, 16>::type x, Vec<float, 16>::type t) {
  using D = Vec<double, 32>::type;
  const D y = __builtin_convertvector(x, D) * __builtin_convertvector(t, D) + 1.0;  // exact product, one rounding
  return __builtin_convertvector(y, Vec<float, 16>::type);
}

template <class T, class V>
inline __attribute__((always_inline)) V abs_lanes(V y) {
  using IV = typename Vec<LaneInt<T>, sizeof(V)>::type;
  return (V)((IV)y & std::numeric_limits<LaneInt<T>>::max());  // clear the sign bit
}
// How a pass folds values into a series: sums, or maxima / minima (where a
// NaN value — an absent weight — leaves the series as it was).
enum class Fold { kSum, kMax, kMin };
template <Fold F, class V>
inline __attribute__((always_inline)) V fold(V acc, V v) {
  if constexpr (F == Fold::kSum) return acc + v;
  else if constexpr (F == Fold::kMax) return v > acc ? v : acc;
  else return v < acc ? v : acc;
}

// The terms of one pass: S series, each with its Fold, its identity (the
// value of an output without terms) and the weight of the pad lanes; pair()
// folds the vector of pairs (i, j…) into at_j[s] (out[s][j…], held in
// registers by the pass) and the accumulators of i; wj[s] the weights of j….
// WeightedTerms: w_s·term_s(y), eval(y, term) filling term[0..S), folded by F
// (w ≥ 0 for kMax: 0 is "no path").
template <class Derived, Fold F>
struct WeightedTerms {
  static constexpr Fold kFolds[3] = {F, F, F};
  static constexpr double kIdentity[3] = {0.0, 0.0, 0.0};
  static constexpr double kPadWeight = 0.0;  // a pad term is 0·term(1) = 0
  template <class T, class V>
  static inline __attribute__((always_inline)) void pair(V y, const T* wi, const V* wj, V* at_j, V* acc) {
    V term[Derived::S];
    Derived::template eval<T, V>(y, term);
    _Pragma("GCC unroll 4") for (int s = 0; s < Derived::S; ++s) {  // unrolled: the arrays stay in registers
      at_j[s] = fold<F>(at_j[s], wi[s] * term[s]);
      acc[s] = fold<F>(acc[s], wj[s] * term[s]);
    }
  }
};
struct AbsTerm : WeightedTerms<AbsTerm, Fold::kSum> {  // |y|: abs, and log's linear-space sums
  static constexpr int S = 1;
  template <class T, class V>
  static inline __attribute__((always_inline)) void eval(V y, V* term) {
    term[0] = abs_lanes<T>(y);
  }
};
struct MaxAbsTerm : WeightedTerms<MaxAbsTerm, Fold::kMax> {  // max_abs, viterbi's linear maxima (no argmax)
  static constexpr int S = 1;
  template <class T, class V>
  static inline __attribute__((always_inline)) void eval(V y, V* term) {
    term[0] = abs_lanes<T>(y);
  }
};
struct NonzeroTerm : WeightedTerms<NonzeroTerm, Fold::kSum> {  // [y ≠ 0]: count
  static constexpr int S = 1;
  template <class T, class V>
  static inline __attribute__((always_inline)) void eval(V y, V* term) {
    using IV = typename Vec<LaneInt<T>, sizeof(V)>::type;
    term[0] = (V)((y != 0) & (IV)(V{} + T(1)));
  }
};
// max_prod: (max, min) over i of M_i·y and m_i·y, edges only (y ≠ 0); NaN
// weights (no path through i, and the pad) give NaN values, which no fold takes.
struct SignedMaxTerms {
  static constexpr int S = 2;
  static constexpr Fold kFolds[3] = {Fold::kMax, Fold::kMin, Fold::kMax};
  static constexpr double kIdentity[3] = {-std::numeric_limits<double>::infinity(),
                                          std::numeric_limits<double>::infinity(), 0.0};
  static constexpr double kPadWeight = std::numeric_limits<double>::quiet_NaN();
  template <class T, class V>
  static inline __attribute__((always_inline)) void pair(V y, const T* wi, const V* wj, V* at_j, V* acc) {
    const auto edge = y != 0;
    const V absent = V{} + std::numeric_limits<T>::quiet_NaN();
    auto fold_into = [&](V M, V m, V* into) {
      const V p = M * y, q = m * y;  // which is larger depends on the sign of y
      into[0] = fold<Fold::kMax>(into[0], V(edge ? (p > q ? p : q) : absent));
      into[1] = fold<Fold::kMin>(into[1], V(edge ? (p < q ? p : q) : absent));
    };
    fold_into(V{} + wi[0], V{} + wi[1], at_j);
    fold_into(wj[0], wj[1], acc);
  }
};
// log a and φ(y) = |y| log|y| of a = |y|. y = 0 (no edge): both logs read the
// zero exponent as 2^-bias (a finite value), so φ = 0·finite = 0 with no mask.
template <class T, class V>
inline __attribute__((always_inline)) V log_lanes(V a) {
  if constexpr (sizeof(T) == 4 && sizeof(V) / sizeof(T) >= 8) return log_by_table(a);
  else return vector_log_normal<T, V>(a);
}
template <class T, class V>
inline __attribute__((always_inline)) V phi_lanes(V a) {
  return a * log_lanes<T, V>(a);
}
struct PhiTerm : WeightedTerms<PhiTerm, Fold::kSum> {  // entropy's Σ w φ(y) on long rows, beside the sorted sums
  static constexpr int S = 1;
  template <class T, class V>
  static inline __attribute__((always_inline)) void eval(V y, V* term) {
    term[0] = phi_lanes<T>(abs_lanes<T>(y));
  }
};
// Entropy's three sums Z = Σ A|y|, Q = Σ Ah|y|, F = Σ A φ(y): F's weights are
// Z's (the third weight row is read as the first; callers pass A twice), so
// F's term is Z's times log|y| — (A|y|)·log|y| for A·(|y| log|y|): 15
// multiply-adds a pair-vector instead of 16, the pass's limit (Zen 3 has two
// pipes for them), two of its sums plain adds.
struct EntropyTerms {
  static constexpr int S = 3;
  static constexpr Fold kFolds[3] = {Fold::kSum, Fold::kSum, Fold::kSum};
  static constexpr double kIdentity[3] = {0.0, 0.0, 0.0};
  static constexpr double kPadWeight = 0.0;  // a pad term is 0·term(1) = 0
  template <class T, class V>
  static inline __attribute__((always_inline)) void pair(V y, const T* wi, const V* wj, V* at_j, V* acc) {
    const V a = abs_lanes<T>(y), l = log_lanes<T, V>(a);
    const V zi = wi[0] * a, zj = wj[0] * a;
    at_j[0] += zi, acc[0] += zj;
    at_j[1] += wi[1] * a, acc[1] += wj[1] * a;
    at_j[2] += zi * l, acc[2] += zj * l;
  }
};
// The fold of a vector's lanes by halves.
template <Fold F, class T, class V>
inline __attribute__((always_inline)) T lanes_fold(V v) {
  if constexpr (sizeof(V) == sizeof(T)) {
    return v[0];
  } else {
    using H = typename Vec<T, sizeof(V) / 2>::type;
    H lo, hi;
    std::memcpy(&lo, &v, sizeof(H));
    std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof(H), sizeof(H));
    return lanes_fold<F, T>(fold<F>(lo, hi));
  }
}

// The pairs i < j of a row, each y_ij = 1 + x_i x_j computed once and folded
// both ways (Terms::pair: into out[j] and into i's accumulators). IB rows i
// at a time over the same vectors of j, whose starts are multiples of L: the
// x, w and out vectors of j are loaded once for the IB rows, the rows'
// horizontal folds overlap, and every i reads out[j] at the addresses the
// previous block stored (a vector shifted by one lane per i, as a loop per i
// had it, overlaps two earlier stores and waits for them: store-to-load
// forwarding fails). Lanes j ≤ i of the first vectors get y = 0, which no
// series takes (a zero term, or no edge for max_prod). max_abs at N = 384
// (float, AVX-512): 6.3 → ~3 µs a row for the pass. kStarts: each row i's
// pairs start at its own j, given as a T in w_rows[S] (≥ i + 1; exact in
// float lanes below 2^24) — entropy's far pairs (see NearSeries), a staircase
// in |x|-sorted order; lanes before a row's start get y = 0 as above.
template <class Terms, bool kStarts = false>
struct PairPass {
template <class T, class V>
static inline __attribute__((always_inline)) void run(const T* x, const T* const* w_rows, T* const* out_rows,
                                                      int64_t n) {
  constexpr int L = sizeof(V) / sizeof(T), S = Terms::S;
  constexpr int IB = 4;  // the rows' accumulators and weights stay in registers
  using IV = typename Vec<LaneInt<T>, sizeof(V)>::type;
  static_assert(L <= kPairPad, "the pad must cover a vector");
  const T* w[S];
  T* out[S];  // in locals: not reloaded after every store (the build may not assume strict aliasing)
  for (int s = 0; s < S; ++s)
    w[s] = w_rows[s], out[s] = out_rows[s], std::fill(out[s], out[s] + n + kPairPad, T(Terms::kIdentity[s]));
  IV lane;
  for (int l = 0; l < L; ++l) lane[l] = l;
  const T* start = kStarts ? w_rows[S] : nullptr;
  for (int64_t i0 = 0; i0 < n; i0 += IB) {
    const int rows = int(std::min<int64_t>(IB, n - i0));
    V xi[IB], acc[IB][S];
    T wi[IB][S];
    LaneInt<T> first_j[IB];  // the row's first partner: lanes before it are masked
    int64_t lo = n, hi = 0;
    _Pragma("GCC unroll 4") for (int b = 0; b < IB; ++b) {
      const int64_t i = std::min<int64_t>(i0 + b, n - 1);  // a row past n repeats the last: its lanes j < n are masked
      xi[b] = V{} + x[i];
      _Pragma("GCC unroll 4") for (int s = 0; s < S; ++s) wi[b][s] = w[s][i], acc[b][s] = V{} + T(Terms::kIdentity[s]);
      const int64_t f = !kStarts ? i0 + b + 1 : b < rows ? int64_t(start[i]) : n;
      first_j[b] = LaneInt<T>(f), lo = std::min(lo, f), hi = std::max(hi, f);
    }
    auto step = [&](int64_t j, bool head) __attribute__((always_inline)) {
      const V xj = load<V>(x + j);
      V wj[S], at_j[S];
      _Pragma("GCC unroll 4") for (int s = 0; s < S; ++s) wj[s] = load<V>(w[s] + j), at_j[s] = load<V>(out[s] + j);
      _Pragma("GCC unroll 4") for (int b = 0; b < IB; ++b) {
        V y;
        // double lanes: the generic path's rounding of 1 + x·t (one_plus); float lanes: rounded once
        if constexpr (sizeof(T) == 4) y = one_plus_exact(xj, xi[b]);
        else y = one_plus(xj, xi[b]);
        if (head) y = lane + LaneInt<T>(j) >= first_j[b] ? y : V{};
        Terms::template pair<T, V>(y, wi[b], wj, at_j, acc[b]);
      }
      _Pragma("GCC unroll 4") for (int s = 0; s < S; ++s) store(out[s] + j, at_j[s]);
    };
    const int64_t first = lo / L * L, body = std::min<int64_t>(n, (hi + L - 1) / L * L);
    int64_t j = first;
    for (; j < body; j += L) step(j, true);  // vectors holding some j before a row's first partner
    for (; j < n; j += L) step(j, false);
    _Pragma("GCC unroll 4") for (int b = 0; b < IB; ++b) {
      if (b >= rows) break;
      const int64_t i = i0 + b;
      for (int s = 0; s < S; ++s) {
        using Lane = typename Vec<T, sizeof(T)>::type;  // one lane: the folds of scalars
        const Lane here = Lane{} + out[s][i];
        switch (Terms::kFolds[s]) {
          case Fold::kSum: out[s][i] = fold<Fold::kSum>(here, Lane{} + lanes_fold<Fold::kSum, T>(acc[b][s]))[0]; break;
          case Fold::kMax: out[s][i] = fold<Fold::kMax>(here, Lane{} + lanes_fold<Fold::kMax, T>(acc[b][s]))[0]; break;
          case Fold::kMin: out[s][i] = fold<Fold::kMin>(here, Lane{} + lanes_fold<Fold::kMin, T>(acc[b][s]))[0]; break;
        }
      }
    }
  }
}
};

// max_abs's and viterbi's rows (values only): out[j] = max_{i≠j} w_i·|1 + x_i x_j|,
// each term rounded as the pair pass rounds it (so the values are the pair
// pass's, bit for bit), from the i that can reach a maximum only. The queries
// j go into G groups by |x_j| (fixed edges: x is a normalised row), each group
// contiguous and padded to whole vectors. A group's outputs start from the
// terms of P picks (the i of largest w_i·(1 + |x_i|·max|x|)), real terms, so
// their smallest, θ, bounds every output of the group from below; an i whose
// bound w_i·(1 + |x_i|·X_g) (X_g the group's largest |x|, rounded up by 8 ε)
// is below θ has every term below every output of the group, strictly, and is
// skipped. On MiniLM-64's layer norms (N = 384) 7 % of the terms remain with
// 4 groups, 4 % with 8 (32 % with one group: the outlying |x| of a row make a
// single bound loose). Cost per row: N to group, G·P·N/L vectors for the
// picks, G·N/L bound vectors, survivors·(group size)/L terms — against the
// pair pass's N²/(2L). TORCH_SEMIRING_NORM_PRUNE=0 runs the pair pass instead
// (tests compare both; read per row).
// The bound fails where the weights leave every i a chance: flat weights give
// the group of |x_j| near 0 outputs of ~w·1 that every i's bound reaches, so
// all N survive there (N²/4 terms and more; at N = 4096 ~3× the envelope's
// time). So the survivors of every group are counted before any term is
// taken: w_rows[1][0] is a budget of terms (ordered pairs i, j); where they
// exceed it nothing is written and out_rows[1][0] is set to 1 — the caller
// takes another scheme (pruned_max_row).
struct PrunedMaxPass {
  static constexpr int G = 6, P = 4;
  static constexpr double kEdges[G - 1] = {0.3, 0.6, 1.0, 1.5, 2.5};  // of |x|: a group each side
  template <class T, class V>
  static inline __attribute__((always_inline)) V term(V x, T xi, T wi) {
    V y;
    if constexpr (sizeof(T) == 4) y = one_plus_exact(x, V{} + xi);  // as PairPass rounds 1 + x·t
    else y = one_plus(x, V{} + xi);
    return wi * abs_lanes<T>(y);
  }
  template <class T, class V>
  static inline __attribute__((always_inline)) void run(const T* x, const T* const* w_rows, T* const* out_rows,
                                                        int64_t n) {
    constexpr int L = sizeof(V) / sizeof(T);
    const T* w = w_rows[0];
    T* out = out_rows[0];
    thread_local std::vector<T> buffer;  // per group, padded to whole vectors: x, index (as T), outputs
    thread_local std::vector<int32_t> survivor_buffer;
    // the groups' sizes from one vector pass (how many |x| reach each edge; a group's bound: its
    // upper edge, the last's max|x|), then each group's j by compares and a compress
    int64_t at_least[G] = {};  // at_least[e]: how many |x| ≥ kEdges[e − 1] (at_least[0] = n)
    V top = V{};
    for (int64_t j0 = 0; j0 < n; j0 += L) {
      const V ax = abs_lanes<T>(load<V>(x + j0));  // x is padded with zeros past n
      top = fold<Fold::kMax>(top, ax);
      for (int e = 1; e < G; ++e) at_least[e] += __builtin_popcount(lanes_where<kAtLeast>(ax, V{} + T(kEdges[e - 1])));
    }
    T xmax = 0;
    for (int l = 0; l < L; ++l) xmax = std::max(xmax, top[l]);
    at_least[0] = n;
    int64_t count[G], start[G + 1], fill[G];
    T reach[G];
    for (int g = 0; g < G; ++g) {
      count[g] = at_least[g] - (g + 1 < G ? at_least[g + 1] : 0);
      reach[g] = g + 1 < G ? std::min(T(kEdges[g]), xmax) : xmax;
    }
    start[0] = 0;
    for (int g = 0; g < G; ++g) start[g + 1] = start[g] + (count[g] + L - 1) / L * L, fill[g] = start[g];
    buffer.resize(3 * start[G]);
    const int64_t stride = n + 16;  // each group's survivors (a compress stores whole vectors)
    survivor_buffer.resize(std::max(start[G], G * stride) + 16);
    T* const gx = buffer.data();  // (raw pointers: a thread_local's address is looked up at each use in a .so)
    T* const gi = gx + start[G];
    T* const go = gi + start[G];
    int32_t* const survivors = survivor_buffer.data();
    // (the indices go into `survivors`, free until the survivors are picked; then their x and index gathered)
    int32_t* const members = survivors;
    for (int g = 0; g < G; ++g)  // one group at a time: a compress's 16-lane store spills only into later groups
      for (int64_t j0 = 0; j0 < n; j0 += L) {
        const V ax = abs_lanes<T>(load<V>(x + j0));
        uint32_t here = j0 + L > n ? (1u << (n - j0)) - 1 : (1u << L) - 1;
        if (g > 0) here &= lanes_where<kAtLeast>(ax, V{} + T(kEdges[g - 1]));
        if (g + 1 < G) here &= lanes_where<kLess>(ax, V{} + T(kEdges[g]));
        fill[g] += append_lanes<V>(members + fill[g], here, int32_t(j0));
      }
    for (int g = 0; g < G; ++g) {
      for (int64_t a = start[g]; a < fill[g]; ++a) gx[a] = x[members[a]], gi[a] = T(members[a]);
      for (int64_t a = fill[g]; a < start[g + 1]; ++a) gx[a] = T(0), gi[a] = T(-1);  // pad lanes
    }
    // the picks: the P largest w_i·(1 + |x_i|·max|x|)
    int64_t pick[P];
    T key[P];
    int np = 0;
    for (int64_t i0 = 0; i0 < n; i0 += L) {  // a vector none of whose keys beats the P-th is passed over whole
      const V kv = load<V>(w + i0) * (T(1) + abs_lanes<T>(load<V>(x + i0)) * xmax);
      if (np == P && !any_greater(kv, V{} + key[P - 1])) continue;
      for (int l = 0; l < L && i0 + l < n; ++l) {
        const T k = kv[l];
        if (np == P && !(k > key[P - 1])) continue;
        int q = np < P ? np++ : P - 1;
        for (; q > 0 && key[q - 1] < k; --q) key[q] = key[q - 1], pick[q] = pick[q - 1];
        key[q] = k, pick[q] = i0 + l;
      }
    }
    // per group: the outputs start as the picks' terms (never i = j), θ their
    // smallest, and the i whose bound reaches θ, in vectors
    int64_t ns[G] = {}, work = 0;
    for (int g = 0; g < G; ++g) {
      if (count[g] == 0) continue;
      const V none = V{} + std::numeric_limits<T>::infinity();
      V low = none;
      for (int64_t v = start[g]; v < start[g + 1]; v += L) {
        const V xv = load<V>(gx + v), iv = load<V>(gi + v);
        V acc = V{};
        for (int q = 0; q < np; ++q) {
          const V t = term<T, V>(xv, x[pick[q]], w[pick[q]]);
          acc = fold<Fold::kMax>(acc, V(iv == T(pick[q]) ? V{} : t));
        }
        store(go + v, acc);
        low = fold<Fold::kMin>(low, V(iv >= 0 ? acc : none));  // pad lanes (index −1) bound nothing
      }
      const T theta = lanes_fold<Fold::kMin, T>(low);
      const T floor = theta * (T(1) - 8 * std::numeric_limits<T>::epsilon());
      const V reach_v = V{} + reach[g] * (T(1) + 8 * std::numeric_limits<T>::epsilon());
      int32_t* const kept = survivors + g * stride;
      for (int64_t i0 = 0; i0 < n; i0 += L) {
        const V xv = load<V>(x + i0), wv = load<V>(w + i0);
        uint32_t h = lanes_where<kAtLeast>(V(wv * (T(1) + abs_lanes<T>(xv) * reach_v)), V{} + floor);
        if (i0 + L > n) h &= (1u << (n - i0)) - 1;  // x and w are padded past n
        ns[g] += append_lanes<V>(kept + ns[g], h, int32_t(i0));
      }
      work += ns[g] * (start[g + 1] - start[g]);
    }
    if (w_rows[1] && double(work) > double(w_rows[1][0])) {
      out_rows[1][0] = T(1);  // over budget: declined, nothing written
      return;
    }
    for (int g = 0; g < G; ++g) {
      const int32_t* const kept = survivors + g * stride;
      for (int64_t s = 0; s < ns[g]; ++s) {
        const int64_t i = kept[s];
        const T xi = x[i], wi = w[i], self = T(i);
        for (int64_t v = start[g]; v < start[g + 1]; v += L) {
          const V t = term<T, V>(load<V>(gx + v), xi, wi);
          const V iv = load<V>(gi + v);
          store(go + v, fold<Fold::kMax>(load<V>(go + v), V(iv == self ? V{} : t)));
        }
      }
    }
    for (int64_t a = 0; a < start[G]; ++a)
      if (gi[a] >= 0) out[int64_t(gi[a])] = go[a];
  }
};

// max_prod's rows (values only): hi[j] = max_{i≠j} max(M_i·y, m_i·y) and
// lo[j] = min_{i≠j} min(M_i·y, m_i·y) over the edges y = 1 + x_i x_j ≠ 0, each
// term rounded as the pair pass rounds it (SignedMaxTerms: the same values,
// bit for bit), from the owners i that can reach some output only. The
// queries j go into G groups by their signed x_j (fixed edges: x is a
// normalised row); a group spans [a, b], its smallest and largest x. A term
// fl(M_i·fl(1 + x_i t)) is monotone in t (each rounding is), so over a group
// each of owner i's two products lies between its values at a and at b:
//  - where y_i has one sign at both ends (an edge at every query of the
//    group), max(M_i y, m_i y) is the same product throughout, so its least
//    value is at an end: the second largest of these least values over the
//    owners, θ, bounds every output hi[j] of the group from below (the
//    largest may be j's own);
//  - an owner none of whose four end products reaches θ has every term below
//    every output of the group and is skipped — and likewise for lo, mirrored.
// Unlike PrunedMaxPass's picks the bound takes every owner, over narrow
// signed groups: max_prod's terms change sign inside a |x|-group, which left
// the picked outputs near 0 there (stop 41: 30–66 % of rows declined).
// Cost per row: N to group, G·N/L vectors for the bounds (~25 vector ops
// each), survivors·(group size)/L terms for the values — against the pair
// pass's N²/(2L) pairs of ~20 ops. Over budget (w_rows[2][0] terms, ordered
// pairs) nothing is written and out_rows[2][0] is set to 1, as PrunedMaxPass.
struct PrunedSignedPass {
  static constexpr int G = 8;
  static constexpr double kEdges[G - 1] = {-1.5, -0.67, -0.25, 0.0, 0.25, 0.67, 1.5};
  template <class T, class V>
  static inline __attribute__((always_inline)) V edge_weight(V x, V t) {  // as PairPass rounds 1 + x·t
    if constexpr (sizeof(T) == 4) return one_plus_exact(x, t);
    else return one_plus(x, t);
  }
  // The second of the values of lanes best1 and best2 (each lane's two best by F, best1 first) in F's
  // order, counting repeats: the first's lanes masked, unless it is in two of them.
  template <Fold F, class T, class V>
  static inline __attribute__((always_inline)) T second_of(V best1, V best2, T none) {
    const T first = lanes_fold<F, T>(best1);
    const V others = best1 == first ? V{} + none : best1;
    const T second = lanes_fold<F, T>(fold<F>(best2, others));
    return __builtin_popcount(lanes_where<kAtLeast>(V(best1 == first ? V{} + T(1) : V{}), V{} + T(1))) > 1 ? first
                                                                                                           : second;
  }
  template <class T, class V>
  static inline __attribute__((always_inline)) void run(const T* x, const T* const* w_rows, T* const* out_rows,
                                                        int64_t n) {
    constexpr int L = sizeof(V) / sizeof(T);
    constexpr T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
    const T *M = w_rows[0], *m = w_rows[1];  // NaN together: no path through i (and the pad past n)
    thread_local std::vector<T> buffer;
    thread_local std::vector<int32_t> index_buffer;
    // the groups' sizes (how many x reach each edge), then each group's j by compares and a compress
    V edge[G - 1];
    for (int e = 0; e + 1 < G; ++e) edge[e] = V{} + T(kEdges[e]);
    int64_t at_least[G] = {};
    for (int64_t j0 = 0; j0 < n; j0 += L) {
      const V xv = load<V>(x + j0);
      const uint32_t here = j0 + L > n ? (1u << (n - j0)) - 1 : (1u << L) - 1;
      for (int e = 1; e < G; ++e) at_least[e] += __builtin_popcount(lanes_where<kAtLeast>(xv, edge[e - 1]) & here);
    }
    at_least[0] = n;
    int64_t count[G], start[G + 1], fill[G];
    for (int g = 0; g < G; ++g) count[g] = at_least[g] - (g + 1 < G ? at_least[g + 1] : 0);
    start[0] = 0;
    for (int g = 0; g < G; ++g) start[g + 1] = start[g] + (count[g] + L - 1) / L * L, fill[g] = start[g];
    const int64_t owners = (n + L - 1) / L * L, stride = n + 16;  // a compress stores whole vectors
    buffer.resize(4 * start[G] + std::max(2 * owners, 4 * n));
    index_buffer.resize(std::max(start[G], G * stride) + 16);
    T* const gx = buffer.data();  // per group, padded to whole vectors: x, index (as T), hi, lo
    T* const gi = gx + start[G];
    T* const ghi = gi + start[G];
    T* const glo = ghi + start[G];
    T* const top = glo + start[G];  // per owner, for the group at hand: its largest and least end products
    T* const bottom = top + owners;
    int32_t* const survivors = index_buffer.data();
    int32_t* const members = survivors;  // (free until the survivors are picked)
    for (int g = 0; g < G; ++g)  // one group at a time: a compress's 16-lane store spills only into later groups
      for (int64_t j0 = 0; j0 < n; j0 += L) {
        const V xv = load<V>(x + j0);
        uint32_t here = j0 + L > n ? (1u << (n - j0)) - 1 : (1u << L) - 1;
        if (g > 0) here &= lanes_where<kAtLeast>(xv, edge[g - 1]);
        if (g + 1 < G) here &= lanes_where<kLess>(xv, edge[g]);
        fill[g] += append_lanes<V>(members + fill[g], here, int32_t(j0));
      }
    T a[G], b[G];
    for (int g = 0; g < G; ++g) {
      a[g] = inf, b[g] = -inf;
      for (int64_t k = start[g]; k < fill[g]; ++k) {
        const T xj = x[members[k]];
        gx[k] = xj, gi[k] = T(members[k]), a[g] = std::min(a[g], xj), b[g] = std::max(b[g], xj);
      }
      for (int64_t k = fill[g]; k < start[g + 1]; ++k) gx[k] = a[g], gi[k] = T(-1);  // pad lanes: in range, no index
    }
    // per group: θ (hi) and θ' (lo) from the owners' end products, then the owners that reach either
    int64_t ns[G] = {}, work = 0;
    for (int g = 0; g < G; ++g) {
      if (count[g] == 0) continue;
      const V A = V{} + a[g], B = V{} + b[g];
      V best1 = V{} - inf, best2 = best1, least1 = V{} + inf, least2 = least1;  // per lane: the two largest / least
      for (int64_t i0 = 0; i0 < owners; i0 += L) {
        const V xv = load<V>(x + i0), Mv = load<V>(M + i0), mv = load<V>(m + i0);
        const V ya = edge_weight<T, V>(xv, A), yb = edge_weight<T, V>(xv, B);
        const V pa = Mv * ya, qa = mv * ya, pb = Mv * yb, qb = mv * yb;
        const V ha = pa > qa ? pa : qa, hb = pb > qb ? pb : qb, la = pa < qa ? pa : qa, lb = pb < qb ? pb : qb;
        // (Selects on one compare each: GCC builds a select on two compares joined by & lane by lane.)
        const auto bounded = ya * yb > 0;  // an edge at every query (|y| ≥ 2^-48 where nonzero: no underflow)
        V low = bounded ? (ha < hb ? ha : hb) : V{} - inf, high = bounded ? (la > lb ? la : lb) : V{} + inf;
        low = low == low ? low : V{} - inf, high = high == high ? high : V{} + inf;  // NaN: no path through i
        best2 = fold<Fold::kMax>(best2, fold<Fold::kMin>(best1, low)), best1 = fold<Fold::kMax>(best1, low);
        least2 = fold<Fold::kMin>(least2, fold<Fold::kMax>(least1, high)), least1 = fold<Fold::kMin>(least1, high);
        store(top + i0, V(ha > hb ? ha : hb));  // (NaN for no path: never kept)
        store(bottom + i0, V(la < lb ? la : lb));
      }
      const T theta = second_of<Fold::kMax, T>(best1, best2, -inf), theta_lo = second_of<Fold::kMin, T>(least1, least2, inf);
      int32_t* const kept = survivors + g * stride;
      const V th = V{} + theta, tl = V{} + theta_lo;
      for (int64_t i0 = 0; i0 < owners; i0 += L) {  // (pad owners are NaN: never kept)
        const uint32_t h = lanes_where<kAtLeast>(load<V>(top + i0), th) | lanes_where<kAtLeast>(tl, load<V>(bottom + i0));
        ns[g] += append_lanes<V>(kept + ns[g], h, int32_t(i0));
      }
      work += ns[g] * (start[g + 1] - start[g]);
    }
    if (w_rows[2] && double(work) > double(w_rows[2][0])) {
      out_rows[2][0] = T(1);  // over budget: declined, nothing written
      return;
    }
    T* const kx = top;  // (free now) each group's survivors as x, M, m, index: one contiguous run each
    for (int g = 0; g < G; ++g) {
      const int32_t* const kept = survivors + g * stride;
      for (int64_t s = 0; s < ns[g]; ++s) {
        const int64_t i = kept[s];
        kx[4 * s] = x[i], kx[4 * s + 1] = M[i], kx[4 * s + 2] = m[i], kx[4 * s + 3] = T(i);
      }
      for (int64_t v = start[g]; v < start[g + 1]; v += L) {
        const V xv = load<V>(gx + v), iv = load<V>(gi + v);
        V hi = V{} - inf, lo = V{} + inf;  // no term: the folds' identities, as the pair pass's
        const V absent = V{} + nan;
        for (int64_t s = 0; s < ns[g]; ++s) {
          const T* const k = kx + 4 * s;
          V y = edge_weight<T, V>(xv, V{} + k[0]);
          y = iv == k[3] ? V{} : y;  // j's own term: no edge, as 1 + x_i x_j = 0
          const V p = k[1] * y, q = k[2] * y;  // which is larger depends on the sign of y
          hi = fold<Fold::kMax>(hi, V(y != 0 ? (p > q ? p : q) : absent));
          lo = fold<Fold::kMin>(lo, V(y != 0 ? (p < q ? p : q) : absent));
        }
        store(ghi + v, hi), store(glo + v, lo);
      }
    }
    for (int64_t k = 0; k < start[G]; ++k)
      if (gi[k] >= 0) out_rows[0][int64_t(gi[k])] = ghi[k], out_rows[1][int64_t(gi[k])] = glo[k];
  }
};

// kmax values (with their winners for paths) on short rows: the K largest of α_c[i]·|1 + x_i x_j|
// over i ≠ j and the K entries c of each i, queries in lanes — a vector of
// queries keeps its K best in registers while the candidates i go by as
// scalars, largest bound first. A candidate none of whose lanes beats the
// vector's K-th best is skipped in one compare, and so are its later entries
// (α_c falls with c). And a vector is done once no later candidate can enter
// anywhere: every score of candidate i at query t is at most
// α_0[i] + α_0[i]·|x_i|·|t|, so with A, B the suffix maxima of α_0 and
// α_0·|x| over the candidates still to come, once A + B·max|t| (max over
// the vector's lanes) is at or below every lane's K-th best. The queries go
// into vectors sorted by |x| (max|t| is then small for most vectors: x is
// a normalised row), the candidates by size group of α_0·(1 + |x_i|·max|x|),
// so A and B fall fast. On MiniLM's layer norms (N = 384) a vector visits a
// few dozen candidates, not N. O(N·S/L) steps with a compare for S
// candidates visited (S = N worst), plus 2K per insertion.
// Inputs: x the queries (n, padded to whole vectors), sorted; w[0], w[1]: the
// candidates' x and index i (as T), w[2 + c]: their α_c ≥ 0, w[2 + K],
// w[3 + K]: the suffix maxima A and B (rounded up), candidates in order, the
// rest (to n) with α_0 = 0; w[4 + K]: each query's index j (pads: −2);
// out[c]: the c-th best of each query in the sorted order, 0 where none;
// WINNERS: out[K + c] its candidate's tag i·K + c' (as T), −1 where none.
// Ties keep the candidate visited first.
template <int K, bool WINNERS = false>
struct TopKLanes {
  template <class T, class V>
  static inline __attribute__((always_inline)) void insert(V* best, V v, V* tags, V tag) {  // best descending, the last drops
    for (int c = 0; c < K; ++c) {
      const V high = v > best[c] ? v : best[c];
      if constexpr (WINNERS) {
        const V tag_high = v > best[c] ? tag : tags[c];
        tag = v > best[c] ? tags[c] : tag;
        tags[c] = tag_high;
      }
      v = v > best[c] ? best[c] : v;
      best[c] = high;
    }
  }
  template <class T, class V>
  static inline __attribute__((always_inline)) void run(const T* x, const T* const* w, T* const* out, int64_t n) {
    constexpr int L = sizeof(V) / sizeof(T);
    const T *cx = w[0], *ci = w[1], *A = w[2 + K], *B = w[3 + K];
    constexpr int64_t kCheck = 4;  // candidates between two tests of the bound (a horizontal min)
    for (int64_t j0 = 0; j0 < n; j0 += L) {
      const V t = load<V>(x + j0);
      const V query = load<V>(w[4 + K] + j0);  // each lane's own index, to drop the pair i = j
      const T reach = lanes_fold<Fold::kMax, T>(abs_lanes<T>(t));
      V best[K], tags[WINNERS ? K : 1];
      for (int c = 0; c < K; ++c) best[c] = V{};
      if constexpr (WINNERS)
        for (int c = 0; c < K; ++c) tags[c] = V{} - 1;
      for (int64_t q = 0; q < n && w[2][q] > 0; ++q) {  // α_0 = 0: the candidates are over
        if (q % kCheck == 0 && A[q] + B[q] * reach <= lanes_fold<Fold::kMin, T>(best[K - 1])) break;  // none can enter
        V y;
        if constexpr (sizeof(T) == 4) y = one_plus_exact(V{} + cx[q], t);
        else y = one_plus(V{} + cx[q], t);
        const V a = query == ci[q] ? V{} : abs_lanes<T>(y);  // no edge to itself; y = 0 gives 0 anyway
        for (int c = 0; c < K; ++c) {
          const V v = a * w[2 + c][q];
          if (!any_greater(v, best[K - 1])) break;  // no lane enters, nor with the smaller α of later entries
          insert<T, V>(best, v, tags, V{} + (ci[q] * T(K) + T(c)));
        }
      }
      for (int c = 0; c < K; ++c) store(out[c] + j0, best[c]);
      if constexpr (WINNERS)
        for (int c = 0; c < K; ++c) store(out[K + c] + j0, tags[c]);
    }
  }
};

// A row pass is a struct with `template <class T, class V> static void run(x,
// w, out, n)` over rows of T in vectors V; these compile it for AVX-512, AVX2
// and the baseline's 16 bytes, and pick_row_pass returns this machine's
// (TORCH_SEMIRING_KERNEL_ISA lowers it, as for the GEMM kernels).
template <class T>
using RowPass = void (*)(const T*, const T* const*, T* const*, int64_t);
#if defined(__x86_64__) || defined(__i386__)
template <class T, class Pass>
__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,fma"), flatten)) void row_pass_avx512(
    const T* x, const T* const* w, T* const* out, int64_t n) {
  Pass::template run<T, typename Vec<T, 64>::type>(x, w, out, n);
}
template <class T, class Pass>
__attribute__((target("avx2,fma"), flatten)) void row_pass_avx2(const T* x, const T* const* w, T* const* out,
                                                                int64_t n) {
  Pass::template run<T, typename Vec<T, 32>::type>(x, w, out, n);
}
#endif
template <class T, class Pass>
__attribute__((flatten)) void row_pass_portable(const T* x, const T* const* w, T* const* out, int64_t n) {
  Pass::template run<T, typename Vec<T, 16>::type>(x, w, out, n);
}

#pragma GCC pop_options

template <class T, class Pass>
RowPass<T> pick_row_pass() {
  const std::string isa = kernel_isa();
#if defined(__x86_64__) || defined(__i386__)
  if (isa == "avx512") return &row_pass_avx512<T, Pass>;
  if (isa == "avx2") return &row_pass_avx2<T, Pass>;
#endif
  return &row_pass_portable<T, Pass>;
}

// ---- the direct pass or the sorted sums, per row --------------------------------

// Rows up to a cut-off take the direct pair pass for abs, count, log, entropy
// and max_prod (and, when no winners are wanted, max_abs and viterbi), longer
// ones the sorted range sums (SumRow) or the envelopes. max_abs's and
// viterbi's values go by PrunedMaxPass, max_prod's by PrunedSignedPass, at any
// length while their survivors stay within pruned_budget (then the cut-off
// only picks what a declined row takes), and kmax (k ≤ 8) by TopKLanes up to its tags' limit, kDirectMaxTopK:
// both visit the candidates that can win, so they stay ahead of the sorted
// schemes far past the pair pass's cut-off (2026-11-28, float32, µs a row,
// pruned or lanes / sorted; weights spread, then flat):
//   N                  1024         2048         4096          8192          16384
//   max_abs  spread  16.3 / 44.6  38.2 / 88.8  69.7 / 164              (flat: declined, the envelope + 6–12 %)
//   viterbi  spread  18.4 / 50.4  42.2 / 92.0  82.0 / 168
//   max_prod spread  17.8 / 104   43.9 / 214   95.8 / 395                 (flat: declined, the envelope + ~8 %)
//   kmax(4)  spread    71 / 345    182 / 887    780 / 2808   1079 / 5131   2821 / 15306
//   kmax(4)  flat     103 / 571    278 / 1534  1090 / 7415   2793 / 17392 12334 / 58231
// The pair pass's cut-off depends on the kernel and on
// the rows' precision: the direct pass runs in it, and float rows have twice
// the lanes, so they keep it about twice as long. Measured cost, µs a row
// (benchmarks/norm_rows.py: 64 rows, AVX-512, one core; direct / sorted;
// 2026-11-27, float32 best of 7, float64 best of 5):
//   float32      N = 512      768          896          1024         1280
//   abs        10.1 / 20.1  20.1 / 29.7  27.3 / 35.0  35.2 / 41.0  69.6 / 71.1
//   log        18.0 / 31.2  25.4 / 34.3  33.4 / 40.1  40.5 / 48.2  59.2 / 59.9
//   entropy    67.6 / 90.3  142 / 169    182 / 205    243 / 260    416 / 392
//   max_abs    14.4 / 27.6  29.8 / 38.6  43.4 / 45.1  60.5 / 63.3  83.8 / 62.8
//   viterbi    18.2 / 26.4  33.6 / 39.3  43.6 / 43.6  54.8 / 51.8  82.8 / 62.6
//   max_prod   33.6 / 47.5  69.8 / 70.2  97.8 / 80.8  146 / 125    157 / 103
//   float64      N = 384      512          640          768
//   abs        16.3 / 23.0  29.5 / 32.6  40.1 / 39.3  55.8 / 47.0
//   log        19.7 / 27.3  31.2 / 36.2  44.2 / 46.2  63.5 / 54.0
//   entropy     118 / 130    291 / 311    484 / 477    689 / 659
//   max_abs    20.3 / 24.4  35.0 / 31.3  52.4 / 42.4  73.9 / 49.2
//   viterbi    26.0 / 28.2  40.8 / 37.8  59.1 / 44.5  82.5 / 53.8
//   max_prod   44.7 / 49.8  76.3 / 67.4   111 / 73.7   166 / 105
// (kmax(4), float32, by the 2026-11-26 measurement: 76.8 / 163 at 512, 138 / 237 at 768, 206 / 322 at 1024.)
// TORCH_SEMIRING_NORM_PASS=direct|sorted forces one scheme (tests cover both;
// read per call, a getenv is cheap next to a row).
struct DirectMax {
  int64_t single, dbl;  // the longest float32 / float64 row the direct pass takes
  int64_t operator()(bool single_precision) const { return single_precision ? single : dbl; }
};
constexpr DirectMax kDirectSums{1024, 512},  // abs, count, log
    kDirectEntropy{1024, 512}, kDirectMaxRows{896, 384},  // max_abs, viterbi
    kDirectSignedMax{768, 384};                              // max_prod
constexpr int64_t kDirectMaxTopK = (int64_t(1) << 24) / 8;  // TopKLanes' tags i·K + c exact in float lanes
bool direct_pays(int64_t n, int64_t direct_max) {
  if (const char* forced = std::getenv("TORCH_SEMIRING_NORM_PASS")) {
    const std::string f = forced;
    if (f == "direct") return true;
    if (f == "sorted") return false;
    TORCH_CHECK(f.empty() || f == "auto", "TORCH_SEMIRING_NORM_PASS=", f,
                " is not a scheme: use direct, sorted or auto (unset: by row length)");
  }
  return n <= direct_max;
}

// Whether TORCH_SEMIRING_NORM_PASS forces the direct or the sorted scheme
// (then count's float rows take it too, instead of count_by_totals).
bool scheme_forced() {
  const char* forced = std::getenv("TORCH_SEMIRING_NORM_PASS");
  return forced && (std::string(forced) == "direct" || std::string(forced) == "sorted");
}
bool sorted_forced() {
  const char* forced = std::getenv("TORCH_SEMIRING_NORM_PASS");
  return forced && std::string(forced) == "sorted";
}

// count on float rows: out_j = Σ_{i≠j} w_i [y_ij ≠ 0], y = 1 + x_i x_j rounded
// once from the exact product (as the float pair pass's one_plus_exact), is 0
// only where x_i·x_j = −1 exactly — and a product of two floats is ±1 only
// when both are ±powers of two (their 24-bit significands multiply to a power
// of two). So out_j is the sum of every w_i but w_j — a prefix plus a suffix,
// no subtraction (an outlying w_j cancels nothing) — except for the j with
// x_j = ±2^e, summed term by term. O(N) per row instead of the pair pass's
// O(N²/L) (N = 384: 1.6 against 6.9 µs a row, benchmarks/norm_rows.py). Float64 rows round the
// product itself (fl(x_i·x_j) = −1 for many pairs): they keep the pair pass.
// x: float values (in doubles), w ≥ 0 finite.
void count_by_totals(const double* x, const double* w, double* out, int64_t n) {
  thread_local std::vector<double> suffix;
  suffix.resize(n + 1);
  double acc = 0;
  suffix[n] = 0;
  for (int64_t i = n - 1; i >= 0; --i) suffix[i] = acc += w[i];
  double prefix = 0;
  for (int64_t j = 0; j < n; ++j) {
    out[j] = prefix + suffix[j + 1];
    prefix += w[j];
  }
  for (int64_t j = 0; j < n; ++j) {
    uint64_t bits;
    std::memcpy(&bits, &x[j], sizeof(bits));
    if (x[j] == 0 || (bits & ((uint64_t(1) << 52) - 1)) != 0) continue;  // not ±2^e: no product is −1
    double sum = 0;
    for (int64_t i = 0; i < n; ++i)
      if (i != j && one_plus(x[i], x[j]) != 0) sum += w[i];  // the product of two floats is exact here
    out[j] = sum;
  }
}

// Log-space callers shift by the row maximum into linear space; before the
// direct pass they drop weights below kFlush (T's lanes), so every product of a
// kept weight and a nonzero term (|y| ≥ 2^-24 in float, 2^-53 in double, where
// y ≠ 0) is a normal number — no subnormal slow path — and they recompute
// exactly any output whose sum is below kGuard·N·(1 + max|x|·|t|), which
// bounds what the dropped weights could have added relative to it (< 1e-8
// float, < 1e-19 double).
template <class T>
struct DirectRange;
template <>
struct DirectRange<float> {
  static constexpr double kFlush = 0x1p-100, kGuard = 1e-22;
};
template <>
struct DirectRange<double> {
  static constexpr double kFlush = 0x1p-960, kGuard = 1e-270;
};

// ---- row plumbing: conversions and range checks ---------------------------------
// Loops the compiler vectorises (-O3 here, one clone per ISA picked at load
// time, as cpu_gemm.cpp's packing): a row is read, checked, narrowed for the
// float lanes and written back several times around its pass, which at
// -O2 (scalar loops, a switch per element) cost half as much as a short row's
// direct pass itself.
#pragma GCC push_options
#pragma GCC optimize("O3")
template <class S, class D>
inline __attribute__((always_inline)) void convert_impl(const S* src, D* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = D(src[i]);
}
TS_CPU_CLONES void convert_row(const float* src, double* dst, int64_t n) { convert_impl(src, dst, n); }
TS_CPU_CLONES void convert_row(const double* src, double* dst, int64_t n) { convert_impl(src, dst, n); }
TS_CPU_CLONES void convert_row(const double* src, float* dst, int64_t n) { convert_impl(src, dst, n); }
TS_CPU_CLONES void convert_row(const float* src, float* dst, int64_t n) { convert_impl(src, dst, n); }
// Whether every value of a row is finite / below +∞ / ≥ 0 / not NaN (NaN fails
// each): one vectorised and-reduction per kind, over ints (a bool reduction
// stays scalar), no branch per element.
// Whether some output of a row may be suspect (see `suspect`): its check as
// one vectorised or-reduction, with a margin of 2^-40 so that no suspect
// output passes it; a row where it finds one checks each output exactly.
TS_CPU_CLONES bool any_suspect(const double* sum, const double* x, int64_t n, double xmax, double guard) {
  const double scale = guard * double(n) * (1.0 + 0x1p-40);
  int bad = 0;
  for (int64_t j = 0; j < n; ++j)
    bad |= int(!(sum[j] >= scale * (1.0 + xmax * std::abs(x[j])))) | int(!(std::abs(sum[j]) < kInf));
  return bad != 0;
}
// A row's largest value (−∞ for none; rows are checked for NaN before) or largest |x|: two
// accumulators of 4 lanes of selects (v > m ? v : m, which vmaxpd computes exactly; GCC does not
// vectorise the scalar form of this reduction without -ffinite-math-only), then the lanes and the
// tail. 4 lanes, not 8: a select on vectors wider than the clone's registers came out lane by
// lane through the stack (the AVX2 clone: ~2 % of a viterbi backward's samples).
template <bool ABS>
inline __attribute__((always_inline)) double row_max_impl(const double* v, int64_t n) {
  using V4 = VecOf<double, 32>::type;
  const double start = ABS ? 0.0 : -kInf;
  V4 m0 = V4{} + start, m1 = m0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    V4 x0 = load<V4>(v + i), x1 = load<V4>(v + i + 4);
    if (ABS) x0 = x0 < 0 ? -x0 : x0, x1 = x1 < 0 ? -x1 : x1;
    m0 = x0 > m0 ? x0 : m0;
    m1 = x1 > m1 ? x1 : m1;
  }
  m0 = m1 > m0 ? m1 : m0;
  double best = start;
  for (int l = 0; l < 4; ++l) best = m0[l] > best ? m0[l] : best;
  for (; i < n; ++i) {
    const double x = ABS ? std::abs(v[i]) : v[i];
    best = x > best ? x : best;
  }
  return best;
}
TS_CPU_CLONES double row_max(const double* v, int64_t n) { return row_max_impl<false>(v, n); }
TS_CPU_CLONES double row_max_abs(const double* v, int64_t n) { return row_max_impl<true>(v, n); }
template <class T>
inline __attribute__((always_inline)) bool all_finite_impl(const T* v, int64_t n) {
  int ok = 1;
  for (int64_t i = 0; i < n; ++i) ok &= int(std::abs(v[i]) < std::numeric_limits<T>::infinity());  // ±∞, NaN fail
  return ok != 0;
}
template <class T>
inline __attribute__((always_inline)) bool all_below_inf_impl(const T* v, int64_t n) {
  int ok = 1;
  for (int64_t i = 0; i < n; ++i) ok &= int(v[i] < std::numeric_limits<T>::infinity());
  return ok != 0;
}
template <class T>
inline __attribute__((always_inline)) bool all_non_negative_impl(const T* v, int64_t n) {
  int ok = 1;
  for (int64_t i = 0; i < n; ++i) ok &= int(v[i] >= T(0));
  return ok != 0;
}
template <class T>
inline __attribute__((always_inline)) bool all_numbers_impl(const T* v, int64_t n) {
  int ok = 1;
  for (int64_t i = 0; i < n; ++i) ok &= int(v[i] == v[i]);
  return ok != 0;
}
TS_CPU_CLONES bool all_finite(const double* v, int64_t n) { return all_finite_impl(v, n); }
TS_CPU_CLONES bool all_finite(const float* v, int64_t n) { return all_finite_impl(v, n); }
TS_CPU_CLONES bool all_below_inf(const double* v, int64_t n) { return all_below_inf_impl(v, n); }
TS_CPU_CLONES bool all_below_inf(const float* v, int64_t n) { return all_below_inf_impl(v, n); }
TS_CPU_CLONES bool all_non_negative(const double* v, int64_t n) { return all_non_negative_impl(v, n); }
TS_CPU_CLONES bool all_non_negative(const float* v, int64_t n) { return all_non_negative_impl(v, n); }
TS_CPU_CLONES bool all_numbers(const double* v, int64_t n) { return all_numbers_impl(v, n); }
TS_CPU_CLONES bool all_numbers(const float* v, int64_t n) { return all_numbers_impl(v, n); }
// A sum row's weights with +∞ (a count or Z beyond the dtype's range) set
// aside: finite[i] = w[i], 0 where w[i] = +∞; whether any was. Branch-free,
// in vectors (it was a scalar loop with a push_back per +∞); the caller lists
// the infinite ones only if there are any.
template <class T>
inline __attribute__((always_inline)) bool finite_weights_impl(const T* w, T* finite, int64_t n) {
  constexpr T inf = std::numeric_limits<T>::infinity();
  int any = 0;
  for (int64_t i = 0; i < n; ++i) {
    any |= int(w[i] == inf);
    finite[i] = w[i] == inf ? T(0) : w[i];
  }
  return any != 0;
}
TS_CPU_CLONES bool finite_weights(const double* w, double* finite, int64_t n) { return finite_weights_impl(w, finite, n); }
TS_CPU_CLONES bool finite_weights(const float* w, float* finite, int64_t n) { return finite_weights_impl(w, finite, n); }
// max_prod's rows of (M, m) for the row kernels: NaN where no path (M = −∞: the
// empty (−∞, +∞)); false where some path product is infinite (the caller
// leaves the tensor to the generic arithmetic). Branch-free, in vectors.
TS_CPU_CLONES bool signed_weights(const double* Mr, const double* mr, double* M, double* m, int64_t n) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  int ok = 1;
  for (int64_t i = 0; i < n; ++i) {
    const bool none = Mr[i] == -kInf;
    ok &= int(none) | (int(std::abs(Mr[i]) < kInf) & int(std::abs(mr[i]) < kInf));
    M[i] = none ? nan : Mr[i], m[i] = none ? nan : mr[i];
  }
  return ok != 0;
}
// v[i] < below → 0, as a select in vectors (a branch per element mispredicted on real rows: ~20 % of kmax's
// row set-up in perf)
TS_CPU_CLONES void zero_below(double* v, int64_t n, double below) {
  for (int64_t i = 0; i < n; ++i) v[i] = v[i] < below ? 0.0 : v[i];
}
#pragma GCC pop_options

// TORCH_SEMIRING_NORM_PRUNE=0 turns PrunedMaxPass off (tests compare both; read per row).
bool prune_rows() {
  const char* v = std::getenv("TORCH_SEMIRING_NORM_PRUNE");
  return !(v && std::strcmp(v, "0") == 0);
}
// Rows shorter than this take the pair pass: the pruned pass's grouping and
// picks cost about as much as N²/(2L) terms there.
constexpr int64_t kPrunedMaxMinRow = 64;

// One row through the direct pair pass in the graph's precision (single:
// float lanes): x, the weights and out as the rows hold them (float64, or the
// graph's dtype where over_rows hands them over in it), copied into padded rows.
// starts (optional, as the rows' type): each row's first partner j, for PairPass's kStarts.
template <class Terms, class In>
void direct_row(bool single, const In* x, const In* const* w, In* const* out, int64_t n,
                const In* starts = nullptr) {
  constexpr int S = Terms::S;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    thread_local std::vector<T> xs, ws[S + 1], os[S];
    const T* wp[S + 1];
    T* op[S];
    xs.resize(n + kPairPad);
    convert_row(x, xs.data(), n);
    std::fill(xs.begin() + n, xs.end(), T(0));
    for (int s = 0; s < S; ++s) {
      ws[s].resize(n + kPairPad), os[s].resize(n + kPairPad);
      convert_row(w[s], ws[s].data(), n);
      std::fill(ws[s].begin() + n, ws[s].end(), T(Terms::kPadWeight));
      wp[s] = ws[s].data(), op[s] = os[s].data();
    }
    if (starts) {
      ws[S].resize(n);
      convert_row(starts, ws[S].data(), n);
      wp[S] = ws[S].data();
      pick_row_pass<T, PairPass<Terms, true>>()(xs.data(), wp, op, n);
    } else {
      pick_row_pass<T, PairPass<Terms>>()(xs.data(), wp, op, n);
    }
    for (int s = 0; s < S; ++s) convert_row(os[s].data(), out[s], n);
  };
  if (single) run(float{});
  else run(double{});
}

// max_abs's and viterbi's row maxima by PrunedMaxPass in the graph's precision
// (single: float lanes), unless its survivors come to more than `budget` terms:
// then false, and `out` is left as it was. x and the weights as the rows hold
// them (float64), out in float64.
std::atomic<int64_t> pruned_max_count{0}, declined_max_count{0}, topk_lanes_count{0};  // norm_row_stats

bool pruned_max_row(bool single, const double* x, const double* w, double* out, int64_t n, double budget) {
  bool declined = false;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    thread_local std::vector<T> xs, ws, os;
    xs.resize(n + kPairPad), ws.resize(n + kPairPad), os.resize(n + kPairPad);
    convert_row(x, xs.data(), n);
    convert_row(w, ws.data(), n);
    std::fill(xs.begin() + n, xs.end(), T(0));
    std::fill(ws.begin() + n, ws.end(), T(0));
    const T limit = T(budget), flag_in = T(0);
    T flag = flag_in;
    const T* wp[] = {ws.data(), &limit};
    T* op[] = {os.data(), &flag};
    pick_row_pass<T, PrunedMaxPass>()(xs.data(), wp, op, n);  // (indices exact in float lanes below 2^24)
    declined = flag != flag_in;
    if (!declined) convert_row(os.data(), out, n);
  };
  if (single) run(float{});
  else run(double{});
  ++(declined ? declined_max_count : pruned_max_count);
  return !declined;
}

// max_prod's row (hi, lo) by PrunedSignedPass in the graph's precision, unless
// its survivors come to more than `budget` terms: then false, and hi, lo are
// left as they were. M, m: NaN where no path; x, M, m, hi, lo in float64.
std::atomic<int64_t> pruned_signed_count{0}, declined_signed_count{0};  // norm_row_stats

bool pruned_signed_row(bool single, const double* x, const double* M, const double* m, double* hi, double* lo,
                       int64_t n, double budget) {
  bool declined = false;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    thread_local std::vector<T> xs, Ms, ms, his, los;
    for (auto* v : {&xs, &Ms, &ms, &his, &los}) v->resize(n + kPairPad);
    convert_row(x, xs.data(), n);
    convert_row(M, Ms.data(), n);
    convert_row(m, ms.data(), n);
    std::fill(xs.begin() + n, xs.end(), T(0));
    std::fill(Ms.begin() + n, Ms.end(), std::numeric_limits<T>::quiet_NaN());
    std::fill(ms.begin() + n, ms.end(), std::numeric_limits<T>::quiet_NaN());
    const T limit = T(budget), flag_in = T(0);
    T flag = flag_in;
    const T* wp[] = {Ms.data(), ms.data(), &limit};
    T* op[] = {his.data(), los.data(), &flag};
    pick_row_pass<T, PrunedSignedPass>()(xs.data(), wp, op, n);  // (indices exact in float lanes below 2^24)
    declined = flag != flag_in;
    if (!declined) convert_row(his.data(), hi, n), convert_row(los.data(), lo, n);
  };
  if (single) run(float{});
  else run(double{});
  ++(declined ? declined_signed_count : pruned_signed_count);
  return !declined;
}

// ---- entropy's near pairs by a polynomial -------------------------------------------
//
// Where |x_i x_j| ≤ τ = 3/4, y = 1 + t (t = x_i x_j) lies in [1/4, 7/4], so
//   |y| = 1 + t,   φ(y) = (1 + t) log(1 + t) ≈ Σ_{k=1..K} c_k t^k
// (c_k: near_series.h, the Chebyshev interpolant of φ(1 + t)/t on [−τ, τ] —
// relative error 1.3e-8 with K = 18 for float rows, 2e-17 with K = 42 for
// float64; the Taylor series would need 44 / 100 terms at this τ), and over
// such i the sums of a row separate into moments of its weights:
//   Σ w_i |y_ij| = W_0 + x_j W_1,   Σ w_i φ(y_ij) ≈ Σ_k c_k x_j^k W_k,   W_k = Σ w_i x_i^k.
// The row is ordered by buckets of |x| (entropy_sums_split), where the near i
// of a j are a prefix [0, r_j), j itself excluded; the far pairs (i < j,
// j ≥ r_i) take the direct pair pass from each row's own start (PairPass's
// kStarts: a staircase). The near sums: the prefix part read off one running
// sum as it passes min(j, r_j), plus a window (j, r_j) that only grows (at
// both ends) as j descends — each the sum of exactly its terms, no
// subtraction, so an outlying w_j cancels nothing. The moments are summed in
// double for float rows too, and no less accurate than the pair pass: both
// sum the same signed terms (tests/test_norm_rows.py compares them).
// Cost: O(N·K) a row — per element its powers, two moment sums and two
// K-term products — beside the far pairs' vector steps. On the real MiniLM's
// layer-norm rows 78 % of the pairs are near (bucket bounds), and the far
// pass visits 27 % of the lanes of the plain one; a row of 384 floats took
// ~29 instead of ~52 µs (benchmarks/README.md, 2026-11-27 20:28).
// Rows shorter than this keep the plain pair pass (the ordering and the
// moments cost as much as the pairs they save there); longer ones take the
// split at any length, past the pair pass's cut-off too. µs a row
// (benchmarks/norm_rows.py --semirings entropy --heavy, 2026-11-27, split /
// pair pass alone / sorted sums): float 128 8.5 / 7.7, 192 20.8 / 13.2 (14 / 13
// on Gaussian rows), 256 16.9 / 21.1, 384 45.8 / 59.9, 768 112 / 211 / 242,
// 2048 500 / 1524 / 1190; float64 64 6.3 / 6.4, 96 8.7 / 10.0, 128 11.7 / 18.3,
// 384 78.5 / 190.0.
constexpr int64_t kNearSeriesMinRow[2] = {80, 224};  // float64, float rows
// Rows with a larger |x| keep the pair pass: x^42 stays below 2^672, so no
// moment overflows (and a near x_j^k that underflows multiplies a finite one).
constexpr double kNearMaxAbs = 65536.0;
// Whether a row of n takes the split. TORCH_SEMIRING_NORM_SERIES=1 splits
// every row of two or more (tests: short rows too), 0 none, unset or auto by
// the row length above; read per call.
bool near_series_pays(int64_t n, bool single) {
  const char* v = std::getenv("TORCH_SEMIRING_NORM_SERIES");
  const std::string mode = v ? v : "";
  TORCH_CHECK(mode.empty() || mode == "auto" || mode == "0" || mode == "1", "TORCH_SEMIRING_NORM_SERIES=", mode,
              " is not a setting: use 1 (split every row), 0 (never) or auto (unset: by row length)");
  if (mode == "0") return false;
  if (mode == "1") return n >= 2;
  return n >= kNearSeriesMinRow[single ? 1 : 0];
}

#pragma GCC push_options
#pragma GCC optimize("O3", "fp-contract=fast")  // (multiply-adds fused: one rounding fewer)
// The powers x^0..x^(W·NV − 1) in NV vectors of W doubles (the ISA's
// widest: 8, 4 or 2), lanes past K zero: the first vector by up to three
// products (depth 3, not a chain of 7), the others by x^W each.
template <class V, int K, int NV>
inline __attribute__((always_inline)) void powers_of(double x, V* p) {
  constexpr int W = sizeof(V) / sizeof(double);
  const double x2 = x * x, x4 = x2 * x2;
  if constexpr (W == 8) {
    const V odd = {1, x, 1, x, 1, x, 1, x}, pairs = {1, 1, x2, x2, 1, 1, x2, x2}, quads = {1, 1, 1, 1, x4, x4, x4, x4};
    p[0] = odd * pairs * quads;
  } else if constexpr (W == 4) {
    const V odd = {1, x, 1, x}, pairs = {1, 1, x2, x2};
    p[0] = odd * pairs;
  } else {
    p[0] = V{1, x};
  }
  const double step = W == 8 ? x4 * x4 : W == 4 ? x4 : x2;
  _Pragma("GCC unroll 16") for (int m = 1; m < NV; ++m) p[m] = p[m - 1] * step;
  for (int l = K + 1; l < W * NV; ++l) p[l / W][l % W] = 0;  // (constant lanes: folded at compile time)
}
// Lane l of the result: the sum of L[l]'s W lanes (W vectors folded by log2 W
// rounds of pairwise shuffles and adds).
template <class V>
inline __attribute__((always_inline)) V sum_lanes_of(const V* L) {
  constexpr int W = sizeof(V) / sizeof(double);
  using I = typename Vec<int64_t, sizeof(V)>::type;
  auto fold = [](V a, V b, I even, I odd) __attribute__((always_inline)) {
    return __builtin_shuffle(a, b, even) + __builtin_shuffle(a, b, odd);
  };
  if constexpr (W == 8) {
    const I s1a = {0, 8, 2, 10, 4, 12, 6, 14}, s1b = {1, 9, 3, 11, 5, 13, 7, 15};
    const I s2a = {0, 1, 8, 9, 4, 5, 12, 13}, s2b = {2, 3, 10, 11, 6, 7, 14, 15};
    const I s3a = {0, 1, 2, 3, 8, 9, 10, 11}, s3b = {4, 5, 6, 7, 12, 13, 14, 15};
    const V ab = fold(L[0], L[1], s1a, s1b), cd = fold(L[2], L[3], s1a, s1b);
    const V ef = fold(L[4], L[5], s1a, s1b), gh = fold(L[6], L[7], s1a, s1b);
    return fold(fold(ab, cd, s2a, s2b), fold(ef, gh, s2a, s2b), s3a, s3b);
  } else if constexpr (W == 4) {
    const I s1a = {0, 4, 2, 6}, s1b = {1, 5, 3, 7}, s2a = {0, 1, 4, 5}, s2b = {2, 3, 6, 7};
    return fold(fold(L[0], L[1], s1a, s1b), fold(L[2], L[3], s1a, s1b), s2a, s2b);
  } else {
    return fold(L[0], L[1], I{0, 2}, I{1, 3});
  }
}
// t[B] + … + t[E − 1] by halves: a chain of log2(E − B) adds, not E − B.
template <class V, int B, int E>
inline __attribute__((always_inline)) V pairwise_sum(const V* t) {
  if constexpr (E - B == 1) return t[B];
  else return pairwise_sum<V, B, (B + E) / 2>(t) + pairwise_sum<V, (B + E) / 2, E>(t);
}
// x, w, v, reach in sorted order; out Z = Σ w|y|, Q = Σ v|y|, F = Σ w φ(y) over
// each j's near i (i < reach[j], i ≠ j). |x| ≤ kNearMaxAbs: the moments of
// order ≤ K stay finite. In vectors of W doubles (pass_for_isa: on AVX2 two
// 8-double vectors per moment had spilled to the stack, 2.5× the time of 4-double ones).
struct NearSums {
  struct Args {
    bool single;
    const double *x, *w, *v;
    const int32_t* reach;
    int64_t n;
    double *Z, *Q, *F;
  };
  template <class V>
  static void run(const Args& a) {
    if (a.single) sums<V, kNearTermsFloat>(a, kNearSeriesFloat);
    else sums<V, kNearTermsDouble>(a, kNearSeriesDouble);
  }
  template <class V, int K>
  static inline __attribute__((always_inline)) void sums(const Args& a, const double* series) {
    constexpr int W = sizeof(V) / sizeof(double), NV = (K + W) / W;  // vectors of W_0..W_K
    const double *x = a.x, *w = a.w, *v = a.v;
    const int32_t* reach = a.reach;
    const int64_t n = a.n;
    double *Z = a.Z, *Q = a.Q, *F = a.F;
    struct Moments {
      V W[NV];        // Σ w_i x_i^k
      double V0, V1;  // Σ v_i, Σ v_i x_i
    };
    V c[NV] = {};  // the polynomial's coefficients at the places of W_k
    for (int k = 1; k <= K; ++k) c[k / W][k % W] = series[k - 1];
    // Each x_i's powers, once (they serve up to four times: the prefix, the
    // window, and the two parts of the outputs).
    thread_local std::vector<double> power_storage;
    power_storage.resize(W * NV * n + 8);
    V* powers = reinterpret_cast<V*>((reinterpret_cast<uintptr_t>(power_storage.data()) + 63) & ~uintptr_t(63));
    for (int64_t i = 0; i < n; ++i) powers_of<V, K, NV>(x[i], powers + i * NV);
    // (The loops over the NV vectors unrolled by pragma: inlined into pass_avx2 & co., compiled at
    // -O2, they had stayed rolled — the moments then went through memory, each add a store-to-load
    // chain, and each eval summed its NV terms in one chain of dependent adds.)
    auto add = [&](int64_t i, Moments& m) __attribute__((always_inline)) {
      const V* p = powers + i * NV;
      _Pragma("GCC unroll 16") for (int q = 0; q < NV; ++q) m.W[q] += w[i] * p[q];
      m.V0 += v[i], m.V1 += v[i] * x[i];
    };
    // The three sums over the i that m holds, for j (linear in m: the prefix's
    // and the window's parts are evaluated apart and added); F's terms stay in
    // W lanes per j until the end, where W j at a time fold them (a horizontal
    // sum per j cost a third of this function).
    thread_local std::vector<double> lane_storage;
    lane_storage.resize(W * n + 8 * W);
    V* F_lanes = reinterpret_cast<V*>((reinterpret_cast<uintptr_t>(lane_storage.data()) + 63) & ~uintptr_t(63));
    auto eval = [&](int64_t j, const Moments& m, double& z, double& q, V& f) __attribute__((always_inline)) {
      const V* p = powers + j * NV;
      V terms[NV];
      _Pragma("GCC unroll 16") for (int u = 0; u < NV; ++u) terms[u] = c[u] * p[u] * m.W[u];
      f = pairwise_sum<V, 0, NV>(terms);
      z = m.W[0][0] + x[j] * m.W[0][1];
      q = m.V0 + x[j] * m.V1;
    };
    // The prefix part: j over the first min(j, reach[j]) elements, read off one
    // running sum as it passes that length (the j listed by it: a counting
    // sort) — nothing stored per position.
    thread_local std::vector<int32_t> at, by_length;
    at.assign(n + 2, 0), by_length.resize(n);
    for (int64_t j = 0; j < n; ++j) ++at[std::min<int64_t>(j, reach[j]) + 1];
    for (int64_t c0 = 0; c0 <= n; ++c0) at[c0 + 1] += at[c0];
    for (int64_t j = 0; j < n; ++j) by_length[at[std::min<int64_t>(j, reach[j])]++] = int32_t(j);
    Moments run = {};
    for (int64_t len = 0, h = 0; len <= n; ++len) {
      for (; h < at[len]; ++h) {
        const int32_t j = by_length[h];
        eval(j, run, Z[j], Q[j], F_lanes[j]);
      }
      if (len < n) add(len, run);
    }
    // The window part: j over (j, reach[j]), a window that only grows, at both
    // ends, as j descends.
    Moments win = {};
    int64_t lo = n, hi = n;  // the window [lo, hi)
    for (int64_t j = n - 1; j >= 0; --j) {
      const int64_t r = reach[j];
      if (r <= j + 1) continue;  // empty (and then so were those of every larger j)
      if (lo == hi) lo = hi = j + 1;
      while (lo > j + 1) add(--lo, win);
      for (; hi < r; ++hi) add(hi, win);
      double z, q;
      V f;
      eval(j, win, z, q, f);
      Z[j] += z, Q[j] += q, F_lanes[j] += f;
    }
    int64_t j0 = 0;
    for (; j0 + W <= n; j0 += W) {
      const V sums = sum_lanes_of<V>(F_lanes + j0);
      std::memcpy(F + j0, &sums, sizeof(sums));
    }
    for (; j0 < n; ++j0) {  // the same pairwise order
      V l[W] = {F_lanes[j0]};
      F[j0] = sum_lanes_of<V>(l)[0];
    }
  }
};
#pragma GCC pop_options

// Entropy's three sums of a row (Z = Σ A|y|, Q = Σ Ah|y|, F = Σ A φ(y), over
// i ≠ j) by the split above. The order is by buckets of |x| (16 a binade, by
// the float's exponent and first 4 mantissa bits, from 2^-22 up to 2^10, the
// last bucket open-ended): one counting pass instead of a sort, and a pair is
// near when the buckets' upper bounds U give U_i·U_j ≤ τ — symmetric, a
// prefix of the order for every j, and |x_i x_j| < U_i·U_j, so the series
// holds; it costs the near set ≤ 13 % in the product's bound. The parts are
// added back in the original order.
void near_sums(bool single, const double* x, const double* w, const double* v, const int32_t* reach, int64_t n,
               double* Z, double* Q, double* F);  // (NearSums in the ISA's vectors, below)
void entropy_sums_split(bool single, const double* x, const double* A, const double* Ah, int64_t n, double* Z,
                        double* Q, double* F) {
  constexpr int kBuckets = 512, kBase = (127 - 22) << 4;  // bucket 0: |x| < 2^-22·(1 + 1/16)
  thread_local std::vector<int32_t> key, order, reach;
  thread_local std::vector<double> xs, As, Ahs, starts, far[3], near[3];
  key.resize(n), order.resize(n), reach.resize(n), xs.resize(n), As.resize(n), Ahs.resize(n), starts.resize(n);
  for (int s = 0; s < 3; ++s) far[s].resize(n), near[s].resize(n);
  int32_t first[kBuckets + 1] = {};  // counts, then each bucket's first position
  for (int64_t i = 0; i < n; ++i) {
    const float f = std::abs(float(x[i]));  // (in the bucket its rounding names: see U below)
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof(bits));
    key[i] = std::min(std::max(int32_t(bits >> 19) - kBase, 0), kBuckets - 1);
    ++first[key[i] + 1];
  }
  for (int b = 0; b < kBuckets; ++b) first[b + 1] += first[b];
  // U_b: the float where bucket b + 1 starts (a double rounding to a float below it is below it).
  auto upper = [](int b) {
    if (b == kBuckets - 1) return kInf;
    const uint32_t bits = uint32_t(kBase + b + 1) << 19;
    float u;
    std::memcpy(&u, &bits, sizeof(u));
    return double(u);
  };
  int32_t used[kBuckets], m = 0;  // the buckets that hold elements, ascending
  for (int b = 0; b < kBuckets; ++b) used[m] = b, m += first[b + 1] > first[b];
  int32_t near_end[kBuckets];  // per used bucket: the first position of the first bucket not near it
  for (int u = 0, e = m; u < m; ++u) {  // U rises with the bucket: its near buckets shrink
    const double ub = upper(used[u]);
    while (e > 0 && !(upper(used[e - 1]) * ub <= kNearTau)) --e;
    near_end[used[u]] = e == m ? int32_t(n) : first[used[e]];
  }
  int32_t pos[kBuckets];
  std::memcpy(pos, first, sizeof(pos));
  for (int64_t i = 0; i < n; ++i) {
    const int32_t p = pos[key[i]]++;
    order[p] = int32_t(i), xs[p] = x[i], As[p] = A[i], Ahs[p] = Ah[i], reach[p] = near_end[key[i]];
  }
  for (int64_t p = 0; p < n; ++p) starts[p] = double(std::max<int64_t>(p + 1, reach[p]));
  const double* wv[] = {As.data(), Ahs.data(), As.data()};
  double* fv[] = {far[0].data(), far[1].data(), far[2].data()};
  direct_row<EntropyTerms>(single, xs.data(), wv, fv, n, starts.data());
  near_sums(single, xs.data(), As.data(), Ahs.data(), reach.data(), n, near[0].data(), near[1].data(),
            near[2].data());
  for (int64_t p = 0; p < n; ++p) {
    const int64_t j = order[p];
    Z[j] = far[0][p] + near[0][p], Q[j] = far[1][p] + near[1][p], F[j] = far[2][p] + near[2][p];
  }
}

// ---- one vectorised pass per instruction set ----------------------------------

// A pass is a struct with an Args type and `template <class V> static void
// run(const Args&)`, V the vector of doubles it works in. pass_for_isa<Pass>()
// returns it compiled for this machine's widest vectors (AVX-512, AVX2, or the
// baseline's 16 bytes); TORCH_SEMIRING_KERNEL_ISA lowers the choice, as for the
// GEMM kernels. Picked per call: the variable may change between calls.
template <class Pass>
using PassFn = void (*)(const typename Pass::Args&);
#if defined(__x86_64__) || defined(__i386__)
template <class Pass>
__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,fma"), flatten)) void pass_avx512(
    const typename Pass::Args& args) {
  Pass::template run<Vec<double, 64>::type>(args);
}
template <class Pass>
__attribute__((target("avx2,fma"), flatten)) void pass_avx2(const typename Pass::Args& args) {
  Pass::template run<Vec<double, 32>::type>(args);
}
#endif
template <class Pass>
__attribute__((flatten)) void pass_portable(const typename Pass::Args& args) {
  Pass::template run<Vec<double, 16>::type>(args);
}
template <class Pass>
PassFn<Pass> pass_for_isa() {
  const std::string isa = kernel_isa();
#if defined(__x86_64__) || defined(__i386__)
  if (isa == "avx512") return &pass_avx512<Pass>;
  if (isa == "avx2") return &pass_avx2<Pass>;
#endif
  return &pass_portable<Pass>;
}
void near_sums(bool single, const double* x, const double* w, const double* v, const int32_t* reach, int64_t n,
               double* Z, double* Q, double* F) {
  pass_for_isa<NearSums>()(NearSums::Args{single, x, w, v, reach, n, Z, Q, F});
}
constexpr int64_t kVectorPad = 8;  // arrays a pass reads in vectors are padded to a multiple of this (the widest)

// Bit l set where lane l of v is above thr (false for NaN): one compare and a
// mask move. (Written with intrinsics: GCC turns the vector-extension form of
// comparison-to-bitmask into per-lane extracts here.)
#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,fma"))) inline unsigned lanes_above(Vec<double, 64>::type v, double thr) {
  return _mm512_cmp_pd_mask((__m512d)v, _mm512_set1_pd(thr), _CMP_GT_OQ);
}
__attribute__((target("avx2,fma"))) inline unsigned lanes_above(Vec<double, 32>::type v, double thr) {
  return unsigned(_mm256_movemask_pd(_mm256_cmp_pd((__m256d)v, _mm256_set1_pd(thr), _CMP_GT_OQ)));
}
inline unsigned lanes_above(Vec<double, 16>::type v, double thr) {
  return unsigned(_mm_movemask_pd(_mm_cmpgt_pd((__m128d)v, _mm_set1_pd(thr))));
}
#else
template <class V>
inline unsigned lanes_above(V v, double thr) {
  unsigned m = 0;
  for (int l = 0; l < int(sizeof(V) / sizeof(double)); ++l) m |= unsigned(v[l] > thr) << l;
  return m;
}
#endif

// ---- the best of a few lines at every query, vectorised -------------------------

// best[j], who[j] = the max over lines h of a_h·(1 + x_h·t_j) and its owner
// o_h (as a double; the first line wins ties, so lines come in owner order).
// Queries in vectors (x padded to whole vectors), lines in the inner loop:
// O(N·H) with no branch and no memory traffic per line.
struct BestLines {
  struct Args {
    const double* t;  // queries, n a multiple of kVectorPad
    int64_t n;
    const double *a, *xo, *owner;
    int64_t H;
    double *best, *who;
  };
  template <class V>
  static inline __attribute__((always_inline)) void run(const Args& p) {
    constexpr int L = sizeof(V) / sizeof(double);
    for (int64_t j = 0; j < p.n; j += L) {
      V tj;
      std::memcpy(&tj, p.t + j, sizeof(V));
      V b = V{} - kInf, w = V{} - 1.0;
      for (int64_t h = 0; h < p.H; ++h) {
        const V v = p.a[h] * one_plus(V{} + p.xo[h], tj);
        const auto take = v > b;
        b = take ? v : b;
        w = take ? V{} + p.owner[h] : w;
      }
      std::memcpy(p.best + j, &b, sizeof(V));
      std::memcpy(p.who + j, &w, sizeof(V));
    }
  }
};

// ---- the envelope family ------------------------------------------------------

// max over lines l (owner o_l, coefficient α_l) of α_l·(1 + x_{o_l} t) at every
// query t = x_j, lines of owner j excluded, edges with 1 + x_o t = 0 excluded
// (they do not exist). Lines are given per owner: alpha[2i], alpha[2i + 1]
// (NaN = absent); out[j] = −∞ where no line is left. The fallback of
// TopCandidates (below) when pruning leaves too many lines.
//
// Lines are grouped into bands of |α| within a factor 2^16 and each band gets
// its own upper hull: a hull test mixing |α| of 1e47 and 1e21 would round
// away the smaller lines (every line of the form α(1 + x t) crosses zero, so a
// small line can win near a large one's root). Within a band the tests' error
// stays ~eps·2^16 of the lines compared, and each winner is re-evaluated with
// its hull neighbours in the canonical form α·(1 + x t).
struct EnvelopeRow {
  struct Line {
    double slope, intercept;
    int32_t owner;
    uint8_t band;
  };
  struct Band {
    int64_t begin, end;  // its hull lines in `hull`
    double top_alpha = 0, top_x = 0;  // bounds: no line of the band exceeds top_alpha·(1 + top_x·|t|)
    int64_t p = 0;       // sweep position
  };
  static constexpr int kBandShift = 4;  // 2^4 binary exponents (a factor 2^16) per band
  RadixSorter sorter;
  std::vector<int32_t> by_slope, grouped, by_query;
  const double* row_x = nullptr;
  int64_t row_n = 0;
  double t0 = 0, t1 = 0;  // the queries' range
  bool queries_sorted = false;
  std::vector<double> slopes;
  std::vector<Line> lines, hull;
  std::vector<Band> bands;

  // The best line at query j over every owner but j (first best on ties); its owner in *who.
  static double direct(const double* alpha, const double* x, int64_t n, int64_t j, double sign, int32_t* who) {
    double best = -kInf;
    *who = -1;
    const double t = x[j];
    for (int64_t i = 0; i < n; ++i) {
      if (i == j) continue;
      const double y = one_plus(x[i], t);
      if (y == 0) continue;
      for (int c = 0; c < 2; ++c) {
        const double v = sign * alpha[2 * i + c] * y;
        if (!std::isnan(alpha[2 * i + c]) && v > best) best = v, *who = int32_t(i);
      }
    }
    return best;
  }

  static bool hidden(const Line& l1, const Line& l2, const Line& l3) {  // l2 never on top (slopes l1 < l2 < l3)
    return (l1.intercept - l3.intercept) * (l2.slope - l1.slope) <=
           (l1.intercept - l2.intercept) * (l3.slope - l1.slope);
  }
  static uint8_t band_of(double a) {  // from the binary exponent; 0 for α = 0 and subnormals
    uint64_t u;
    std::memcpy(&u, &a, sizeof(u));
    return uint8_t(((u >> 52) & 0x7ff) >> kBandShift);
  }

  // The maximum of the lines sign·α at every query x_j of the row given to
  // new_row. owner (optional): the winning line's owner per query (−1: none;
  // ties: the first found).
  //
  // Lines that are nowhere above a lower bound of the answer go first: over
  // the queries' range [t0, t1] a line lies between its end values, so the
  // second best owner's lowest value among lines without a root in the range
  // (an edge at every query) bounds every answer from below, whichever owner
  // a query excludes; a line whose highest value is below it never wins. With
  // values spread over orders of magnitude (the log-space semirings) few are
  // left and each query takes the best of them directly (O(N·S)); otherwise
  // the survivors' banded upper envelope answers all queries: by a sweep
  // (swept, O(S·h + N·H) for h hull lines a band, H in all) while hulls are
  // small, else sorted (envelope, O(S log S + N)).
  //
  // new_row(x, n) first, once per row: the sorted order of the queries is
  // made only if a call needs it (the sorted envelope), then shared.
  void new_row(const double* x, int64_t n) {
    row_x = x, row_n = n, queries_sorted = false;
    t0 = kInf, t1 = -kInf;
    for (int64_t i = 0; i < n; ++i) t0 = std::min(t0, x[i]), t1 = std::max(t1, x[i]);
  }
  void best_of(const double* alpha, double sign, double* out, int32_t* owner = nullptr) {
    const double* x = row_x;
    const int64_t n = row_n;
    // (Branch-free where the outcome is random — a root in the range or not —
    // since mispredictions dominated these loops.)
    double first = -kInf, second = -kInf;  // the two best owners' lowest values
    for (int64_t i = 0; i < n; ++i) {
      const double y0 = one_plus(x[i], t0), y1 = one_plus(x[i], t1);
      const bool bounded = y0 * y1 > 0;  // no root in the range: an edge at every query
      const double a0 = sign * alpha[2 * i], a1 = sign * alpha[2 * i + 1];
      const double l0 = std::min(a0 * y0, a0 * y1), l1 = std::min(a1 * y0, a1 * y1);
      double low = l0 > l1 ? l0 : l1;                  // a NaN (absent) line loses either way
      low = l0 != l0 ? l1 : (l1 != l1 ? l0 : low);
      low = bounded && low == low ? low : -kInf;
      if (low > first) second = first, first = low;
      else if (low > second) second = low;
    }
    lines.resize(2 * n);  // written branch-free: each line is stored, the count moves only for survivors
    int64_t L = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double y0 = one_plus(x[i], t0), y1 = one_plus(x[i], t1);
      for (int c = 0; c < 2; ++c) {
        const double a = sign * alpha[2 * i + c];
        const double high = a * y0 > a * y1 ? a * y0 : a * y1;
        lines[L] = {a * x[i], a, int32_t(i), band_of(a)};
        L += high >= second;  // else below the bound at every query (or absent: NaN)
      }
    }
    lines.resize(L);
    if (L <= 8) {
      for (int64_t j = 0; j < n; ++j) {
        const double t = x[j];
        double best = -kInf;
        int32_t who = -1;
        for (const auto& l : lines) {
          if (l.owner == j) continue;
          const double y = one_plus(x[l.owner], t);
          const double v = l.intercept * y;
          if (y != 0 && v > best) best = v, who = l.owner;
        }
        out[j] = best;
        if (owner) owner[j] = who;
      }
      return;
    }
    if (swept(alpha, x, n, sign, out, owner)) return;
    slopes.resize(L);
    for (int64_t q = 0; q < L; ++q) slopes[q] = lines[q].slope;
    by_slope.resize(L);
    sorter.sort(slopes.data(), L, by_slope.data());
    if (!queries_sorted) by_query.resize(n), sorter.sort(x, n, by_query.data()), queries_sorted = true;
    envelope(alpha, x, n, by_query.data(), sign, out, owner);
  }

  // The envelope by a sweep over [t0, t1], band by band, without sorting:
  // from the best line at t0, the next hull line is the one (of larger slope)
  // that overtakes the current one first — O(L) a step, O(L·h) for h hull
  // lines. Envelopes of these rows have few lines (4–7 of 768 on layer-norm
  // rows of real models), so this replaces the O(L log L) slope sort and
  // the sorted sweep; then every query takes the best of all bands' hull
  // lines in the canonical form α·(1 + x t) (O(N·H), which also absorbs a
  // hull line lost to rounding next to a neighbour). A query whose best is
  // its own line (excluded) or 0 (maybe a non-edge) is answered directly, as
  // in envelope(). Returns false (nothing written) when a band's hull grows
  // past kMaxSwept lines: the sorted envelope is then cheaper.
  static constexpr int64_t kMaxSwept = 24;
  std::vector<int32_t> hull_lines;
  std::vector<double> line_a, line_x, line_owner, queries, best, best_owner;
  bool swept(const double* alpha, const double* x, int64_t n, double sign, double* out, int32_t* owner) {
    const int64_t L = int64_t(lines.size());
    uint32_t count[256] = {0};
    for (int64_t q = 0; q < L; ++q) count[lines[q].band]++;
    uint32_t start[256], run = 0;
    for (int b = 255; b >= 0; --b) start[b] = run, run += count[b];
    grouped.resize(L);
    for (int64_t q = 0; q < L; ++q) grouped[start[lines[q].band]++] = int32_t(q);
    hull_lines.clear();
    for (int64_t b0 = 0; b0 < L;) {
      const uint8_t band = lines[grouped[b0]].band;
      int64_t b1 = b0;
      while (b1 < L && lines[grouped[b1]].band == band) ++b1;
      int32_t cur = -1;  // the best line at t0 (ties: the larger slope, which stays best after t0)
      double best = -kInf;
      for (int64_t q = b0; q < b1; ++q) {
        const Line& l = lines[grouped[q]];
        const double v = l.intercept * one_plus(x[l.owner], t0);
        if (v > best || (v == best && cur >= 0 && l.slope > lines[cur].slope)) best = v, cur = grouped[q];
      }
      // Lines of smaller slope than the current one, below it from here on,
      // are dropped as the sweep goes (the band's range shrinks to [b0, live)).
      int64_t live = b1;
      for (int64_t steps = 0;; ++steps) {
        if (steps == kMaxSwept) return false;
        hull_lines.push_back(cur);
        const Line& c = lines[cur];
        int32_t next = -1;
        double when = kInf;  // where the next line overtakes c (ties: the larger slope)
        int64_t kept = b0;
        for (int64_t q = b0; q < live; ++q) {
          const Line& l = lines[grouped[q]];
          if (!(l.slope > c.slope)) continue;
          grouped[kept++] = grouped[q];
          const double tc = (c.intercept - l.intercept) / (l.slope - c.slope);
          if (tc < when || (tc == when && next >= 0 && l.slope > lines[next].slope)) when = tc, next = grouped[q];
        }
        live = kept;
        if (next < 0 || !(when <= t1)) break;
        cur = next;
      }
      b0 = b1;
    }
    // Line by line over all queries (independent queries: no dependency
    // chain through `best`); lines in owner order, so the first of equal
    // values is the smallest owner, as in direct().
    std::sort(hull_lines.begin(), hull_lines.end(),
              [&](int32_t p, int32_t q) { return lines[p].owner < lines[q].owner; });
    const int64_t H = int64_t(hull_lines.size()), padded = (n + kVectorPad - 1) / kVectorPad * kVectorPad;
    line_a.resize(H), line_x.resize(H), line_owner.resize(H);
    for (int64_t h = 0; h < H; ++h) {
      const Line& l = lines[hull_lines[h]];
      line_a[h] = l.intercept, line_x[h] = x[l.owner], line_owner[h] = double(l.owner);
    }
    queries.assign(padded, 0.0), best.resize(padded), best_owner.resize(padded);
    std::copy(x, x + n, queries.begin());
    pass_for_isa<BestLines>()({queries.data(), padded, line_a.data(), line_x.data(), line_owner.data(), H,
                              best.data(), best_owner.data()});
    for (int64_t j = 0; j < n; ++j) {
      int32_t who = int32_t(best_owner[j]);
      out[j] = best[j];
      if (who == j || best[j] == 0) out[j] = direct(alpha, x, n, j, sign, &who);
      if (owner) owner[j] = who;
    }
    return true;
  }

  void envelope(const double* alpha, const double* x, int64_t n, const int32_t* by_query, double sign,
                double* out, int32_t* owner) {
    const int64_t L = int64_t(lines.size());
    // Stable counting sort by band, largest |α| first: each band in slope order.
    uint32_t count[256] = {0};
    for (int64_t q = 0; q < L; ++q) count[lines[q].band]++;
    uint32_t start[256], run = 0;
    for (int b = 255; b >= 0; --b) start[b] = run, run += count[b];
    grouped.resize(L);
    for (int64_t q = 0; q < L; ++q) grouped[start[lines[by_slope[q]].band]++] = by_slope[q];
    hull.clear(), bands.clear();
    for (int64_t q = 0; q < L;) {
      const uint8_t b = lines[grouped[q]].band;
      Band band{int64_t(hull.size()), 0};
      for (; q < L && lines[grouped[q]].band == b; ++q) {
        const Line& l = lines[grouped[q]];
        band.top_alpha = std::max(band.top_alpha, std::abs(l.intercept));
        band.top_x = std::max(band.top_x, std::abs(x[l.owner]));
        const int64_t size = int64_t(hull.size()) - band.begin;
        if (size > 0 && hull.back().slope == l.slope) {
          if (hull.back().intercept >= l.intercept) continue;  // same slope: the higher one stays
          hull.pop_back();
        }
        while (int64_t(hull.size()) - band.begin >= 2 && hidden(hull[hull.size() - 2], hull.back(), l))
          hull.pop_back();
        hull.push_back(l);
      }
      band.end = int64_t(hull.size());
      bands.push_back(band);
    }
    for (int64_t q = 0; q < n; ++q) {
      const int64_t j = by_query[q];
      const double t = x[j];
      double best = -kInf;
      int32_t who = -1;
      bool own = false;
      for (auto& band : bands) {
        if (best > 0 && band.top_alpha * (1 + band.top_x * std::abs(t)) < best) continue;  // cannot win
        const Line* h = hull.data() + band.begin;
        const int64_t size = band.end - band.begin;
        while (band.p + 1 < size && h[band.p + 1].intercept + h[band.p + 1].slope * t >=
                                        h[band.p].intercept + h[band.p].slope * t)
          ++band.p;
        // The winner and its neighbours (against rounding in the hull tests),
        // in the canonical form α·(1 + x t).
        for (int64_t d = -1; d <= 1; ++d) {
          const int64_t k = band.p + d;
          if (k < 0 || k >= size) continue;
          if (h[k].owner == j) {
            own |= d == 0;
            continue;
          }
          const double v = h[k].intercept * one_plus(x[h[k].owner], t);
          if (v > best) best = v, who = h[k].owner;
        }
      }
      // j's own line on top of a band (excluded), or a maximum of 0 that a
      // non-edge (1 + x t = 0) may have produced: the maximum over the others.
      if (own || best == 0) best = direct(alpha, x, n, j, sign, &who);
      out[j] = best;
      if (owner) owner[j] = who;
    }
  }
};

// Positive weights by size: group g holds α ∈ [2^-g, 2^(1-g)), α below 2^-60
// share the last group (an O(N) counting sort by group orders them roughly,
// largest first).
constexpr int kSizeGroups = 62;
// −ilogb(alpha) clamped to [0, kSizeGroups): read off the exponent bits (a
// subnormal, below 2^−1022, falls in the last group as with ilogb).
inline int size_group(double alpha) {
  uint64_t bits;
  std::memcpy(&bits, &alpha, sizeof(bits));
  const int biased = int((bits >> 52) & 0x7ff);
  return biased == 0 ? kSizeGroups - 1 : std::min(kSizeGroups - 1, std::max(0, 1023 - biased));
}

// ---- the top K of a few candidates at every query, vectorised --------------------

// Candidates α_l·L(1 + x_l t) as structure of arrays, padded to whole vectors
// (kVectorPad) with absent entries (α = NaN: no value of theirs is above or at
// any bound, so they are never kept nor entered).
struct CandidateLanes {
  std::vector<double> alpha, x, owner;  // owner: the i it belongs to (excluded at query i), as a double for lanes
  std::vector<int32_t> tag;             // what the caller wants reported for it (path tracking: i, or i·k + entry)
  int64_t count = 0;                    // real candidates (the arrays hold count rounded up to kVectorPad)
  // Optional, for abs lines (α ≥ 0): candidates grouped by the binary exponent
  // of α, largest first, each group starting at a whole vector; group g spans
  // [group_start[g], group_start[g + 1]), every α in it is below group_alpha[g]
  // and every |x| in it and the later groups at most group_xmax[g].
  std::vector<int64_t> group_start;
  std::vector<double> group_alpha, group_xmax;

  void clear() {
    alpha.clear(), x.clear(), owner.clear(), tag.clear(), count = 0;
    group_start.clear(), group_alpha.clear(), group_xmax.clear();
  }
  void push(double a, double xl, double o, int32_t t) {
    alpha.push_back(a), x.push_back(xl), owner.push_back(o), tag.push_back(t), ++count;
  }
  void pad() {
    alpha.resize(count), x.resize(count), owner.resize(count), tag.resize(count);
    const int64_t padded = (count + kVectorPad - 1) / kVectorPad * kVectorPad;
    alpha.resize(padded, std::numeric_limits<double>::quiet_NaN()), x.resize(padded, 0.0), owner.resize(padded, -1.0),
        tag.resize(padded, -1);
  }
  int64_t padded() const { return int64_t(alpha.size()); }
};

// `from` (abs lines, α > 0) regrouped into `to` by the binary exponent of α,
// largest first, stable within a group (a counting sort: O(N)).
void group_by_size(const CandidateLanes& from, CandidateLanes& to) {
  constexpr int kGroups = kSizeGroups;
  thread_local std::vector<int8_t> group;
  int64_t count[kGroups] = {}, cursor[kGroups];
  double xmax[kGroups] = {};
  group.resize(from.count);
  for (int64_t l = 0; l < from.count; ++l) {
    const int g = size_group(from.alpha[l]);
    group[l] = int8_t(g), count[g]++, xmax[g] = std::max(xmax[g], std::abs(from.x[l]));
  }
  to.clear();
  int64_t end = 0;
  for (int g = 0; g < kGroups; ++g) {
    if (!count[g]) continue;
    to.group_start.push_back(end), to.group_alpha.push_back(std::ldexp(1.0, 1 - g)), to.group_xmax.push_back(xmax[g]);
    cursor[g] = end;
    end += (count[g] + kVectorPad - 1) / kVectorPad * kVectorPad;
  }
  to.group_start.push_back(end);
  for (int64_t g = int64_t(to.group_xmax.size()) - 2; g >= 0; --g)  // over this group and the later ones
    to.group_xmax[g] = std::max(to.group_xmax[g], to.group_xmax[g + 1]);
  to.alpha.assign(end, std::numeric_limits<double>::quiet_NaN()), to.x.assign(end, 0.0), to.owner.assign(end, -1.0),
      to.tag.assign(end, -1);
  for (int64_t l = 0; l < from.count; ++l) {
    const int64_t at = cursor[group[l]]++;
    to.alpha[at] = from.alpha[l], to.x[at] = from.x[l], to.owner[at] = from.owner[l], to.tag[at] = from.tag[l];
  }
  to.count = from.count;
}

// Unpadded candidates put back in the order of their tags (which follow the
// order the caller gave them in).
void in_tag_order(CandidateLanes& c) {
  thread_local std::vector<int64_t> order;
  thread_local CandidateLanes copy;
  order.resize(c.count);
  for (int64_t l = 0; l < c.count; ++l) order[l] = l;
  std::sort(order.begin(), order.end(), [&](int64_t p, int64_t q) { return c.tag[p] < c.tag[q]; });
  copy = c;
  for (int64_t l = 0; l < c.count; ++l) {
    const int64_t from = order[l];
    c.alpha[l] = copy.alpha[from], c.x[l] = copy.x[from], c.owner[l] = copy.owner[from], c.tag[l] = copy.tag[from];
  }
}

// The values α·L(y) of a vector of candidates at y = 1 + x t, L = |·| (abs
// lines) or the identity. The scalar arithmetic, lane by lane (one_plus rounds
// alike in lanes; a product and an |·| are exact per lane).
template <class V>
inline __attribute__((always_inline)) V candidate_values(V alpha, V y, bool abs_lines) {
  using IV = typename Vec<int64_t, sizeof(V)>::type;
  return alpha * (abs_lines ? (V)((IV)y & int64_t(0x7fffffffffffffffLL)) : y);
}

// For queries by_query[q0..q1): the K best candidate values at t = x_j,
// skipping the query's own candidates and non-edges (1 + x t = 0), descending
// into out[s·n + j] (tags[s·n + j]: the candidate's tag; −∞ / −1 where fewer
// than K). Candidates are taken a vector at a time: their values in lanes, then
// one compare of the vector with the current K-th best — a chunk with no lane
// above it (most chunks, once the list fills) is skipped without touching the
// list; the others are inserted lane by lane in candidate order, so ties keep
// the earlier candidate as a scalar merge would.
struct TopMerge {
  struct Args {
    const CandidateLanes* c;
    bool abs_lines;
    int64_t K;
    const double* x;
    int64_t n;
    const int32_t* by_query;
    int64_t q0, q1;
    double* out;
    int32_t* tags;  // optional
    double* best;   // K scratch entries each
    int32_t* best_tag;
  };
  template <class V>
  static inline __attribute__((always_inline)) void run(const Args& a) {
    constexpr int L = sizeof(V) / sizeof(double);
    static_assert(L <= kVectorPad, "the pad must cover a vector");
    const CandidateLanes& c = *a.c;
    const int64_t K = a.K;
    double* best = a.best;
    int32_t* best_tag = a.best_tag;
    for (int64_t q = a.q0; q < a.q1; ++q) {
      const int64_t j = a.by_query[q];
      const double t = a.x[j];
      const V tv = V{} + t;
      for (int64_t s = 0; s < K; ++s) best[s] = -kInf, best_tag[s] = -1;
      for (int64_t l0 = 0; l0 < c.padded(); l0 += L) {
        const V v = candidate_values(load<V>(&c.alpha[l0]), one_plus(load<V>(&c.x[l0]), tv), a.abs_lines);
        unsigned enter = lanes_above(v, best[K - 1]);
        if (!enter) continue;  // no lane can enter the list: the common case once it is full
        double vals[L];
        std::memcpy(vals, &v, sizeof(V));
        for (; enter; enter &= enter - 1) {
          const int l = __builtin_ctz(enter);
          double value = vals[l];
          // the bound may have risen within the chunk; own candidates and non-edges never enter
          if (!(value > best[K - 1]) || int64_t(c.owner[l0 + l]) == j || one_plus(c.x[l0 + l], t) == 0) continue;
          int32_t tag = c.tag[l0 + l];
          for (int64_t s = 0; s < K; ++s)  // insertion into the descending list (ties: the earlier stays)
            if (value > best[s]) std::swap(value, best[s]), std::swap(tag, best_tag[s]);
        }
      }
      for (int64_t s = 0; s < K; ++s) a.out[s * a.n + j] = best[s];
      if (a.tags)
        for (int64_t s = 0; s < K; ++s) a.tags[s * a.n + j] = best_tag[s];
    }
  }
};

// ---- pruned candidates, block by block -------------------------------------------

// A candidate's lowest value over a block, and its owner.
struct LowBound {
  double value;
  int32_t owner;
};

// Candidates of `from` that may make a query's top K over the queries in
// [t0, t1] (see TopCandidates): the lows are kept by two vector passes over
// the candidates, the values in lanes as in TopMerge.
//   1. lows: the candidates without a root in the block (1 + x t keeps its
//      sign at both ends), their lower end value; only the top `cap` are
//      needed, kept descending by insertion: a vector with no lane above the
//      last kept (most, once `cap` are kept) is turned away by one compare.
//   2. the bound (the K-th best low without the owner of each of the top K;
//      removing an owner drops at most per_owner entries, so the top
//      (per_owner + 1)·K = cap hold every answer), then the candidates whose
//      higher end value reaches it.
// O(N/L) vector steps per pass plus O(cap) per insertion.
struct Survivors {
  struct Args {
    const CandidateLanes* from;
    bool abs_lines;
    int64_t K, cap;
    double t0, t1;
    std::vector<LowBound>* lows;
    CandidateLanes* to;
  };
  template <class V>
  static inline __attribute__((always_inline)) void run(const Args& a) {
    using IV = typename Vec<int64_t, sizeof(V)>::type;
    constexpr int L = sizeof(V) / sizeof(double);
    static_assert(L <= kVectorPad, "the pad must cover a vector");
    const CandidateLanes& from = *a.from;
    std::vector<LowBound>& lows = *a.lows;
    const V t0 = V{} + a.t0, t1 = V{} + a.t1, absent = V{} + std::numeric_limits<double>::quiet_NaN();
    // The candidates in ranges: their size groups, largest α first (abs lines;
    // no candidate of group g has a value above most(g) anywhere in the block,
    // so once a group cannot enter, no later one can), or the whole list.
    const bool grouped = !from.group_start.empty();
    const int64_t groups = grouped ? int64_t(from.group_alpha.size()) : 1;
    const double tmax = std::max(std::abs(a.t0), std::abs(a.t1));
    auto begin = [&](int64_t g) { return grouped ? from.group_start[g] : int64_t(0); };
    auto end = [&](int64_t g) { return grouped ? from.group_start[g + 1] : from.padded(); };
    auto most = [&](int64_t g) {  // α·|1 + x t| ≤ α·(1 + |x|·|t|), and a margin for the rounding of the values
      return grouped ? from.group_alpha[g] * (1.0 + from.group_xmax[g] * tmax) * (1.0 + 1e-12) : kInf;
    };
    lows.clear();
    for (int64_t g = 0; g < groups; ++g) {
    if (int64_t(lows.size()) == a.cap && most(g) <= lows.back().value) break;
    for (int64_t l0 = begin(g); l0 < end(g); l0 += L) {
      const V alpha = load<V>(&from.alpha[l0]), x = load<V>(&from.x[l0]);
      const V y0 = one_plus(x, t0), y1 = one_plus(x, t1);
      const IV no_root = ((y0 > 0) & (y1 > 0)) | ((y0 < 0) & (y1 < 0));
      const V v0 = candidate_values(alpha, y0, a.abs_lines), v1 = candidate_values(alpha, y1, a.abs_lines);
      const V low = no_root ? (v1 < v0 ? v1 : v0) : absent;  // std::min(v0, v1)
      const bool full = int64_t(lows.size()) == a.cap;
      unsigned enter = lanes_above(low, full ? lows.back().value : -kInf);
      if (!enter) continue;
      double vals[L];
      std::memcpy(vals, &low, sizeof(V));
      for (; enter; enter &= enter - 1) {
        const int l = __builtin_ctz(enter);
        const LowBound b{vals[l], int32_t(from.owner[l0 + l])};
        int64_t at = int64_t(lows.size());
        if (at == a.cap) {
          if (!(b.value > lows.back().value)) continue;  // the last kept may have risen within the chunk
          --at;
        } else {
          lows.push_back(b);
        }
        // insertion from the back, after equal values: a short, predictable
        // loop (a binary search's branches mispredict; cap is small)
        for (; at > 0 && lows[at - 1].value < b.value; --at) lows[at] = lows[at - 1];
        lows[at] = b;
      }
    }
    }
    double bound = -kInf;
    const int64_t head = int64_t(lows.size());
    if (head >= a.K) {
      bound = lows[a.K - 1].value;
      for (int64_t r = 0; r < a.K && bound > -kInf; ++r) {
        int64_t seen = 0;
        double kth = -kInf;
        for (int64_t e = 0; e < head; ++e)
          if (lows[e].owner != lows[r].owner && ++seen == a.K) {
            kth = lows[e].value;
            break;
          }
        bound = std::min(bound, kth);
      }
    }
    CandidateLanes& to = *a.to;
    to.clear();
    // v ≥ bound ⟺ v > the next double below it (also for ±∞; NaN lanes neither)
    const double below_bound = std::nextafter(bound, -kInf);
    for (int64_t g = 0; g < groups && !(most(g) < bound); ++g) {
      for (int64_t l0 = begin(g); l0 < end(g); l0 += L) {
        const V alpha = load<V>(&from.alpha[l0]), x = load<V>(&from.x[l0]);
        const V v0 = candidate_values(alpha, one_plus(x, t0), a.abs_lines),
                v1 = candidate_values(alpha, one_plus(x, t1), a.abs_lines);
        for (unsigned keep = lanes_above(V(v0 < v1 ? v1 : v0), below_bound); keep; keep &= keep - 1) {  // std::max
          const int64_t l = l0 + __builtin_ctz(keep);
          to.push(from.alpha[l], from.x[l], from.owner[l], from.tag[l]);
        }
      }
    }
    if (grouped) in_tag_order(to);  // the merge's ties go to the earlier candidate of the original order
    to.pad();
  }
};

// The K best of v_l(t) = α_l·L(1 + x_l t) over candidates l at every query
// t = x_j — L = |·| (abs lines, α ≥ 0) or the identity (signed lines) —
// skipping candidates owned by j and those with 1 + x_l t = 0 (no edge).
//
// Queries are taken in blocks of consecutive sorted x, [t0, t1]. Over a block
// a candidate lies between its values at the ends (linear in t; for |·| when
// 1 + x t keeps its sign), so: the K-th largest "lowest value" among
// candidates without a root in the block bounds every query's K-th best from
// below — made valid whichever owner a query excludes by taking the worst
// over removing each owner of the top K (the top 2K hold the answer) — and a
// candidate whose highest value over the block is below that bound never
// makes a query's top K. The rest are merged directly per query. With values
// spread over orders of magnitude (log-space semirings) or narrow blocks, few
// survive: O(N·K/L) vector steps per block for the bounds, O(B·S·K) for B
// queries and S survivors. Returns false (nothing written) when some block
// keeps more than `max_survivors`: the caller then takes its O(N log N)
// envelope instead.
struct TopCandidates {
  static constexpr int64_t kBlock = 32;
  CandidateLanes row, grouped, kept;
  std::vector<LowBound> lows;
  std::vector<double> best;
  std::vector<int32_t> best_tag;

  // out[slot * n + j], slots descending; −∞ where fewer than K candidates.
  // tags (optional): the tag of each slot's candidate (−1: none); tags must increase with the order of
  // `all` (ties go to the earlier candidate, also after the size groups reorder them).
  // per_owner: the most candidates one owner has. `all` must be padded.
  bool run(const CandidateLanes& all, bool abs_lines, int64_t K, int64_t per_owner, const double* x, int64_t n,
           const int32_t* by_query, int64_t max_survivors, double* out, int32_t* tags = nullptr) {
    best.resize(K), best_tag.resize(K);
    const auto survivors = pass_for_isa<Survivors>();
    const auto top_merge = pass_for_isa<TopMerge>();
    const int64_t cap = (per_owner + 1) * K;
    auto merge = [&](const CandidateLanes& c, int64_t q0, int64_t q1) {
      top_merge({&c, abs_lines, K, x, n, by_query, q0, q1, out, tags, best.data(), best_tag.data()});
    };
    // First over the whole range; if many survive, block by block.
    survivors({&all, abs_lines, K, cap, x[by_query[0]], x[by_query[n - 1]], &lows, &row});
    if (row.count <= 2 * kBlock) {
      merge(row, 0, n);
      return true;
    }
    const CandidateLanes* blocks_from = &row;
    if (abs_lines) group_by_size(row, grouped), blocks_from = &grouped;  // the blocks' passes stop early
    for (int64_t q0 = 0; q0 < n; q0 += kBlock) {
      const int64_t q1 = std::min(n, q0 + kBlock);
      survivors({blocks_from, abs_lines, K, cap, x[by_query[q0]], x[by_query[q1 - 1]], &lows, &kept});
      if (kept.count > max_survivors) return false;
      merge(kept, q0, q1);
    }
    return true;
  }
};

// ---- exact log-space recomputation of one output (underflow guard) -------------

// log Σ_{i≠j, y≠0} e^{a_i + log|y_ij|}, and with h the entropy pair's mean.
std::pair<double, double> exact_log_sum(const double* a, const double* h, const double* x, int64_t n, int64_t j) {
  const double t = x[j];
  double top = -kInf;
  for (int64_t i = 0; i < n; ++i) {
    const double y = one_plus(x[i], t);
    if (i != j && y != 0 && a[i] > -kInf) top = std::max(top, a[i] + std::log(std::abs(y)));
  }
  if (top == -kInf) return {-kInf, 0.0};
  double z = 0, r = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double y = one_plus(x[i], t);
    if (i == j || y == 0 || a[i] == -kInf) continue;
    const double ly = std::log(std::abs(y)), p = std::exp(a[i] + ly - top);
    z += p;
    if (h) r += p * (h[i] - ly);
  }
  return {top + std::log(z), h ? r / z : 0.0};
}

double exact_log_max(const double* a, const double* x, int64_t n, int64_t j, int32_t* who) {
  const double t = x[j];
  double best = -kInf;
  *who = -1;
  for (int64_t i = 0; i < n; ++i) {
    const double y = one_plus(x[i], t);
    if (i == j || y == 0 || a[i] == -kInf) continue;
    const double v = a[i] + std::log(std::abs(y));
    if (v > best) best = v, *who = int32_t(i);
  }
  return best;
}

// ---- tensor plumbing ----------------------------------------------------------

// Row maximum of log values (−∞ for a row without paths) and the largest |x|.
struct RowScale {
  double top, xmax;
};
RowScale scale_of(const double* a, const double* x, int64_t n) { return {row_max(a, n), row_max_abs(x, n)}; }
bool suspect(double sum, int64_t n, double xmax, double t, double guard = kUnderflowGuard) {
  return !(sum >= guard * double(n) * (1.0 + xmax * std::abs(t))) || !std::isfinite(sum);
}
// Log-space weights A = e^{a − top} for the direct pass (single: float lanes):
// those below its flush level dropped. Returns the underflow guard for the outputs.
double flush_for_direct(std::vector<double>& A, int64_t n, bool single) {
  const double flush = single ? DirectRange<float>::kFlush : DirectRange<double>::kFlush;
  zero_below(A.data(), n, flush);
  return single ? DirectRange<float>::kGuard : DirectRange<double>::kGuard;
}

// What an input may hold for the kernels to reproduce the generic arithmetic.
enum class Holds { Finite, LogValues /* no NaN, no +∞ */, Sums /* ≥ 0, +∞ allowed */, AnyButNaN };
template <class T>
bool all_hold(Holds what, const T* v, int64_t n) {
  switch (what) {
    case Holds::Finite: return all_finite(v, n);
    case Holds::LogValues: return all_below_inf(v, n);  // false for NaN
    case Holds::Sums: return all_non_negative(v, n);    // false for NaN
    default: return all_numbers(v, n);
  }
}

// Runs body(r, in, out) over the rows of the (R, N) inputs: each row read in
// its dtype (float32 or float64; all inputs one dtype, CPU) into float64
// buffers and checked (`what[k]` for input k), each output row written back in
// that dtype. kInDtype: the rows are handed over in their own dtype instead,
// in place (no buffers: body reads the inputs' rows and writes the outputs'
// directly), for a body that works in the graph's precision — the float pair
// pass, which the float64 round trip (four conversions a row) slowed: abs's
// float rows of 384, 6.9 → 6.5 µs with finite_weights (benchmarks/norm_rows.py,
// 2026-12-07); body must then take either element type. Any input
// value outside what it may hold, or any other misfit, makes the whole call
// decline: it returns no tensors (the caller takes the generic path). No pass
// over the data besides the rows themselves.
template <bool kInDtype = false, class Body>
std::vector<at::Tensor> over_rows(const std::vector<at::Tensor>& ins, const std::vector<Holds>& what, int nout,
                                  Body body) {
  const auto& first = ins[0];
  if (!first.defined() || first.dim() != 2 || first.size(1) >= (int64_t(1) << 30)) return {};
  const auto dtype = first.scalar_type();
  if (dtype != at::kFloat && dtype != at::kDouble) return {};
  for (const auto& t : ins)
    if (!t.defined() || !t.device().is_cpu() || t.scalar_type() != dtype || !t.sizes().equals(first.sizes()))
      return {};
  const int64_t R = first.size(0), n = first.size(1);
  std::vector<at::Tensor> in, out;
  for (const auto& t : ins) in.push_back(t.contiguous());
  for (int k = 0; k < nout; ++k) out.push_back(at::empty({R, n}, first.options()));
  std::atomic<bool> declined{false};
  auto run = [&](auto tag) {
    using T = decltype(tag);
    using Row = std::conditional_t<kInDtype, T, double>;  // what body sees
    constexpr bool kCopies = !std::is_same_v<Row, T>;
    std::vector<const T*> pin;
    std::vector<T*> pout;
    for (auto& t : in) pin.push_back(t.template data_ptr<T>());
    for (auto& t : out) pout.push_back(t.template data_ptr<T>());
    at::parallel_for(0, R, 1, [&](int64_t r0, int64_t r1) {
      const int64_t buffered = kCopies ? n : 0;
      std::vector<std::vector<Row>> rows(in.size(), std::vector<Row>(buffered)), res(nout, std::vector<Row>(buffered));
      std::vector<const Row*> rin(in.size());
      std::vector<Row*> rout(nout);
      for (int64_t r = r0; r < r1 && !declined.load(std::memory_order_relaxed); ++r) {
        bool ok = true;
        for (size_t k = 0; k < in.size(); ++k) {
          if constexpr (kCopies) {
            convert_row(pin[k] + r * n, rows[k].data(), n);
            rin[k] = rows[k].data();
          } else {
            rin[k] = pin[k] + r * n;
          }
          ok = ok && all_hold(what[k], rin[k], n);
        }
        if (!ok) {
          declined.store(true, std::memory_order_relaxed);
          return;
        }
        for (int k = 0; k < nout; ++k) {
          if constexpr (kCopies) rout[k] = res[k].data();
          else rout[k] = pout[k] + r * n;
        }
        body(r, rin.data(), rout.data());
        if constexpr (kCopies)
          for (int k = 0; k < nout; ++k) convert_row(res[k].data(), pout[k] + r * n, n);
      }
    });
  };
  if (dtype == at::kFloat) run(float{});
  else run(double{});
  if (declined) return {};
  return out;
}

}  // namespace

at::Tensor sum_rows(const at::Tensor& w_in, const at::Tensor& x_in, bool nonzero) {
  // w may hold +∞ (a count or Z beyond the dtype's range): any existing edge
  // from such an i makes the sum +∞; the rest is the sum of the finite ones.
  const int64_t n = x_in.dim() == 2 ? x_in.size(1) : 0;
  const bool single = x_in.scalar_type() == at::kFloat;  // the direct pass in the graph's precision
  const bool by_totals = nonzero && single && !scheme_forced();
  const bool direct = !by_totals && direct_pays(n, kDirectSums(single));
  // Rows in float64 (Row = double), or, for the direct pass, in the graph's dtype.
  auto body = [&, n](int64_t, const auto* const* in, auto* const* o) {
    using Row = std::remove_pointer_t<std::remove_reference_t<decltype(*o)>>;
    thread_local std::vector<Row> finite_w;
    thread_local std::vector<int64_t> infinite;
    const Row *wr = in[0], *xr = in[1];
    finite_w.resize(n), infinite.clear();
    if (finite_weights(wr, finite_w.data(), n))
      for (int64_t i = 0; i < n; ++i)
        if (wr[i] == std::numeric_limits<Row>::infinity()) infinite.push_back(i);
    const Row* wv[] = {finite_w.data()};
    if (direct && nonzero) direct_row<NonzeroTerm>(single, xr, wv, o, n);
    else if (direct) direct_row<AbsTerm>(single, xr, wv, o, n);
    else if constexpr (std::is_same_v<Row, double>) {
      thread_local SumRow<1> row;
      if (by_totals) count_by_totals(xr, finite_w.data(), o[0], n);
      else row.run(xr, n, wv, o, nonzero);
    }
    // Each j needs one existing edge from an infinite i: the first one found
    // settles it (1 + x_i x_j = 0 is rare), so this is O(n) per row even when
    // every w is +∞ (counts of a deep model overflow float32 early). In float64,
    // as the pass's one_plus_exact rounds: 0 only where x_i·x_j = −1 exactly.
    for (int64_t j = 0; j < n && !infinite.empty(); ++j)
      for (int64_t i : infinite)
        if (i != j && one_plus(double(xr[i]), double(xr[j])) != 0) {
          o[0][j] = std::numeric_limits<Row>::infinity();
          break;
        }
  };
  // (body's rows in the graph's dtype only ever take the direct pass)
  const std::vector<Holds> what{Holds::Sums, Holds::Finite};
  auto out = direct ? over_rows</*kInDtype=*/true>({w_in, x_in}, what, 1, body)
                    : over_rows({w_in, x_in}, what, 1, body);
  return out.empty() ? at::Tensor() : out[0];
}

at::Tensor logsumexp_rows(const at::Tensor& a_in, const at::Tensor& x_in) {
  const int64_t n = x_in.dim() == 2 ? x_in.size(1) : 0;
  const bool single = x_in.scalar_type() == at::kFloat;  // the direct pass in the graph's precision
  const bool direct = direct_pays(n, kDirectSums(single));
  auto out = over_rows({a_in, x_in}, {Holds::LogValues, Holds::Finite}, 1, [=](int64_t, const double* const* in,
                                                                               double* const* o) {
    thread_local SumRow<1> row;
    thread_local std::vector<double> A, S;
    const double *ar = in[0], *xr = in[1];
    A.resize(n), S.resize(n);
    const auto sc = scale_of(ar, xr, n);
    if (sc.top == -kInf) {
      std::fill(o[0], o[0] + n, -kInf);
      return;
    }
    exp_shifted(ar, sc.top, A.data(), n, direct && single);  // float lanes where the pass is in float
    const double guard = direct ? flush_for_direct(A, n, single) : kUnderflowGuard;
    const double* wv[] = {A.data()};
    double* ov[] = {S.data()};
    if (direct) direct_row<AbsTerm>(single, xr, wv, ov, n);
    else row.run(xr, n, wv, ov, false);
    log_shifted(S.data(), sc.top, o[0], n, single);  // (the result is rounded to float)
    if (any_suspect(S.data(), xr, n, sc.xmax, guard))
      for (int64_t j = 0; j < n; ++j)
        if (suspect(S[j], n, sc.xmax, xr[j], guard)) o[0][j] = exact_log_sum(ar, nullptr, xr, n, j).first;
  });
  return out.empty() ? at::Tensor() : out[0];
}

std::tuple<at::Tensor, at::Tensor> entropy_rows(const at::Tensor& l_in, const at::Tensor& h_in,
                                                const at::Tensor& x_in) {
  const int64_t n = x_in.dim() == 2 ? x_in.size(1) : 0;
  const bool single = x_in.scalar_type() == at::kFloat;  // φ pass in the graph's precision
  const bool pairs = direct_pays(n, kDirectEntropy(single));
  // The split (near pairs by the polynomial, the far ones by the pair pass)
  // beats both schemes at any length it takes (see kNearSeriesMinRow): it is
  // the direct scheme's, at any length but where TORCH_SEMIRING_NORM_PASS=sorted
  // (or TORCH_SEMIRING_NORM_SERIES=0) says otherwise.
  const bool may_split = n < (int64_t(1) << 24) && !sorted_forced() && near_series_pays(n, single);
  auto out = over_rows({l_in, h_in, x_in}, {Holds::LogValues, Holds::Finite, Holds::Finite}, 2,
                       [=](int64_t, const double* const* in, double* const* o) {
    thread_local SumRow<2> row;
    thread_local std::vector<double> A, Ah, Z, Q, F;
    const double *lr = in[0], *hr = in[1], *xr = in[2];
    double *ol = o[0], *oh = o[1];
    A.resize(n), Ah.resize(n), Z.resize(n), Q.resize(n), F.resize(n);
    const auto sc = scale_of(lr, xr, n);
    if (sc.top == -kInf) {
      std::fill(ol, ol + n, -kInf);
      std::fill(oh, oh + n, 0.0);
      return;
    }
    const bool split = may_split && sc.xmax <= kNearMaxAbs;
    const bool direct = split || pairs;  // the pair pass's precision and flush
    exp_shifted(lr, sc.top, A.data(), n, direct && single);
    const double guard = direct ? flush_for_direct(A, n, single) : kUnderflowGuard;
    for (int64_t i = 0; i < n; ++i) Ah[i] = A[i] == 0 ? 0.0 : A[i] * hr[i];
    if (split) {
      entropy_sums_split(single, xr, A.data(), Ah.data(), n, Z.data(), Q.data(), F.data());  // near pairs by the series
    } else if (direct) {  // Z, Σ A h |y| and Σ A φ(y) in one pass
      const double* wv[] = {A.data(), Ah.data(), A.data()};
      double* ov[] = {Z.data(), Q.data(), F.data()};
      direct_row<EntropyTerms>(single, xr, wv, ov, n);
    } else {  // Z and Σ A h |y| by the sorted sums, Σ A φ(y) by a φ-only pass
      const double* wv[] = {A.data(), Ah.data()};
      double* ov[] = {Z.data(), Q.data()};
      row.run(xr, n, wv, ov, false);
      const double* wf[] = {A.data()};
      double* of[] = {F.data()};
      direct_row<PhiTerm>(single, xr, wf, of, n);
    }
    // R = Σ A|y|(h − log|y|) = Q − F;  ℓ = top + log Z,  h = R/Z.
    log_shifted(Z.data(), sc.top, ol, n, single);
    for (int64_t j = 0; j < n; ++j) {
      if (suspect(Z[j], n, sc.xmax, xr[j], guard)) {
        auto e = exact_log_sum(lr, hr, xr, n, j);
        ol[j] = e.first, oh[j] = e.second;
      } else {
        oh[j] = (Q[j] - F[j]) / Z[j];
      }
    }
  });
  if (out.empty()) return {};
  return {out[0], out[1]};
}

// PrunedMaxPass's budget of terms (ordered pairs) for a row of n: the pair
// pass's n²/2 (the alternative up to the cut-off), and past it about what the
// envelope costs, in the pruned pass's terms: the envelope takes ~0.04–0.05 µs
// an element at N = 1024–4096 (O(N log N), a large constant), a pruned term
// ~0.07 ns in float lanes, twice that in double (2026-11-28, benchmarks/README.md;
// benchmarks/norm_rows.py --weights equal --few-large gives the declined rows:
// the envelope + 6–15 %; rows it keeps cost 2–4.5× less than the envelope).
double pruned_budget(int64_t n, bool single) {
  const double per_element = single ? 600 : 300;
  return std::min(0.5 * double(n) * double(n), per_element * double(n));
}

at::Tensor max_rows(const at::Tensor& w_in, const at::Tensor& x_in, bool log_space, at::Tensor* argmax) {
  const int64_t n = x_in.dim() == 2 ? x_in.size(1) : 0;
  const bool single = x_in.scalar_type() == at::kFloat;  // the direct pass in the graph's precision
  // values only: the winners come from the envelope
  // The pair pass up to the cut-off; PrunedMaxPass (values only) at any length
  // below 2^24 while its survivors stay within budget (pruned_budget), else
  // the pair pass or, past the cut-off, the envelope.
  const bool pairs = !argmax && direct_pays(n, kDirectMaxRows(single));
  const bool pruned = !argmax && n >= kPrunedMaxMinRow && n < (int64_t(1) << 24) && prune_rows() &&
                      !sorted_forced();
  auto winners = argmax ? at::empty(x_in.sizes(), x_in.options().dtype(at::kInt)) : at::Tensor();
  int32_t* pwin = argmax ? winners.data_ptr<int32_t>() : nullptr;
  auto out = over_rows({w_in, x_in}, {log_space ? Holds::LogValues : Holds::Finite, Holds::Finite}, 1,
                       [&, n](int64_t r, const double* const* in, double* const* o) {
    thread_local EnvelopeRow env;
    thread_local std::vector<int32_t> who_buffer;
    thread_local std::vector<double> alpha, best, linear;
    const double *wr = in[0], *xr = in[1];
    who_buffer.resize(n), alpha.resize(2 * n), best.resize(n), linear.resize(n);
    int32_t* who = pwin ? pwin + r * n : who_buffer.data();
    RowScale sc{0.0, 0.0};
    if (log_space) {
      sc = scale_of(wr, xr, n);
      if (sc.top == -kInf) {
        std::fill(o[0], o[0] + n, -kInf);
        std::fill(who, who + n, -1);
        return;
      }
    }
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const double* lin = wr;  // linear-space weights
    double guard = kUnderflowGuard;
    bool direct = pairs || pruned;  // the direct passes' weights: float lanes, tiny ones flushed
    if (log_space) {
      exp_shifted(wr, sc.top, linear.data(), n, direct && single), lin = linear.data();
      if (direct) guard = flush_for_direct(linear, n, single);  // a dropped weight never beats a kept maximum
    }
    // the max over the pairs; weights ≤ 0 and non-edges give 0, "no path"
    bool done = pruned && pruned_max_row(single, xr, lin, best.data(), n, pruned_budget(n, single));
    if (!done && pairs) {
      const double* wv[] = {lin};
      double* ov[] = {best.data()};
      direct_row<MaxAbsTerm>(single, xr, wv, ov, n);
      done = true;
    }
    if (done) {
      std::fill(who, who + n, -1);
    } else {
      if (direct && log_space) {  // declined past the cut-off: the envelope's weights as it takes them
        exp_shifted(wr, sc.top, linear.data(), n, false);
        guard = kUnderflowGuard;
      }
      for (int64_t i = 0; i < n; ++i) {
        const double v = lin[i];
        alpha[2 * i] = v > 0 ? v : nan;  // weight 0: no path through i
        alpha[2 * i + 1] = v > 0 ? -v : nan;
      }
      env.new_row(xr, n);
      env.best_of(alpha.data(), 1.0, best.data(), who);
    }
    if (log_space) {
      log_shifted(best.data(), sc.top, o[0], n, single);
      if (any_suspect(best.data(), xr, n, sc.xmax, guard))
        for (int64_t j = 0; j < n; ++j)
          if (suspect(best[j], n, sc.xmax, xr[j], guard)) o[0][j] = exact_log_max(wr, xr, n, j, &who[j]);
    } else {
      for (int64_t j = 0; j < n; ++j) {
        if (!(best[j] > 0)) best[j] = 0.0, who[j] = -1;  // no edge: the zero of max_abs
        o[0][j] = best[j];
      }
    }
  });
  if (out.empty()) return {};
  if (argmax) *argmax = winners;
  return out[0];
}

std::tuple<at::Tensor, at::Tensor> signed_max_rows(const at::Tensor& M_in, const at::Tensor& m_in,
                                                   const at::Tensor& x_in) {
  // Values are finite path products or the empty (−∞, +∞); anything else
  // (an infinite product, NaN) is left to the generic arithmetic.
  const int64_t n = x_in.dim() == 2 ? x_in.size(1) : 0;
  const bool single = x_in.scalar_type() == at::kFloat;  // the direct pass in the graph's precision
  const bool direct = direct_pays(n, kDirectSignedMax(single));
  const bool pruned = n >= kPrunedMaxMinRow && n < (int64_t(1) << 24) && prune_rows() && !sorted_forced();
  std::atomic<bool> infinite_product{false};
  auto out = over_rows({M_in, m_in, x_in}, {Holds::AnyButNaN, Holds::AnyButNaN, Holds::Finite}, 2,
                       [&, n](int64_t, const double* const* in, double* const* o) {
    thread_local EnvelopeRow env;
    thread_local std::vector<double> alpha, lo, M, m;
    const double *Mr = in[0], *mr = in[1], *xr = in[2];
    M.resize(n), m.resize(n);
    if (!signed_weights(Mr, mr, M.data(), m.data(), n)) {
      infinite_product = true;  // the generic arithmetic takes the whole tensor
      return;
    }
    if (pruned && pruned_signed_row(single, xr, M.data(), m.data(), o[0], o[1], n, pruned_budget(n, single))) return;
    if (direct) {  // no line: the folds' identities (−∞, +∞)
      const double* wv[] = {M.data(), m.data()};
      direct_row<SignedMaxTerms>(single, xr, wv, o, n);
      return;
    }
    alpha.resize(2 * n), lo.resize(n);
    for (int64_t i = 0; i < n; ++i) alpha[2 * i] = M[i], alpha[2 * i + 1] = m[i];
    env.new_row(xr, n);
    env.best_of(alpha.data(), 1.0, o[0]);
    env.best_of(alpha.data(), -1.0, lo.data());
    for (int64_t j = 0; j < n; ++j) o[1][j] = -lo[j];  // no line: (−∞, +∞)
  });
  if (out.empty() || infinite_product) return {};
  return {out[0], out[1]};
}

// One row of kmax values by TopKLanes (K ≤ kTopKLanesMax) in the graph's
// precision (single: float lanes): best[c·n + j], linear, 0 where none; alpha
// (K·n, entry c of element i at c·n + i) ≥ 0, falling with c; with `tags`,
// tags[c·n + j] = the winner i·K + c' of best[c·n + j], −1 where none.
constexpr int64_t kTopKLanesMax = 8;
template <int K>
using TopKWinners = TopKLanes<K, true>;
void topk_lanes_row(bool single, int64_t K, const double* x, const double* alpha, int64_t n, double* best,
                    int32_t* tags) {
  thread_local std::vector<int32_t> order, queries;
  thread_local std::vector<int8_t> group_of;
  thread_local std::vector<uint8_t> bucket;
  // Candidates by size group of α_0[i]·(1 + |x_i|·xmax) / (1 + xmax²) ≤ 1, largest first.
  const double xmax = row_max_abs(x, n);  // (in vectors: the scalar max was a latency chain)
  const double span = 1.0 + xmax * xmax;
  group_of.resize(n);
  int64_t count[kSizeGroups] = {}, cursor[kSizeGroups];
  for (int64_t i = 0; i < n; ++i)
    if (alpha[i] > 0) count[group_of[i] = int8_t(size_group(alpha[i] * (1.0 + std::abs(x[i]) * xmax) / span))]++;
  int64_t m = 0;
  for (int g = 0; g < kSizeGroups; ++g) cursor[g] = m, m += count[g];
  order.resize(m);
  for (int64_t i = 0; i < n; ++i)
    if (alpha[i] > 0) order[cursor[group_of[i]]++] = int32_t(i);
  // Queries by |x| in buckets of width xmax/255 (one counting pass: the order
  // only has to make max|t| small for most vectors).
  bucket.resize(n), queries.resize(n);
  {
    const double per = xmax > 0 ? 255.0 / xmax : 0.0;
    int64_t count_of[256] = {};
    for (int64_t j = 0; j < n; ++j) count_of[bucket[j] = uint8_t(std::min(255.0, std::abs(x[j]) * per))]++;
    int64_t at = 0;
    for (auto& c : count_of) std::swap(c, at), at += c;
    for (int64_t j = 0; j < n; ++j) queries[count_of[bucket[j]]++] = int32_t(j);
  }
  auto run = [&](auto tag) {
    using T = decltype(tag);
    thread_local std::vector<T> xq, lanes[5 + kTopKLanesMax], outs[2 * kTopKLanesMax];
    const int64_t padded = n + kPairPad;
    const T* w[5 + kTopKLanesMax];
    T* o[2 * kTopKLanesMax];
    // The buffers by plain pointers: through the thread_local vectors GCC
    // reloaded each one's data pointer in the loops below (~20 % of this row's
    // set-up in perf of MiniLM-64's kmax(4)).
    T* lane[5 + kTopKLanesMax];
    // what the pass reads past the m candidates and the n queries: α_0 = 0 at m, the pads
    xq.resize(padded);
    T* const xs = xq.data();
    for (int64_t r = 0; r < 5 + K; ++r) {
      lanes[r].resize(padded), w[r] = lane[r] = lanes[r].data();
      std::fill(lane[r] + (r == 4 + K ? n : m), lane[r] + padded, T(r == 1 ? -1 : r == 4 + K ? -2 : 0));
    }
    std::fill(xs + n, xs + padded, T(0));
    const int32_t* const by_query = queries.data();
    for (int64_t q = 0; q < n; ++q) xs[q] = T(x[by_query[q]]), lane[4 + K][q] = T(by_query[q]);
    // the suffix maxima with room for the rounding of α and x to T and of the
    // score's three operations in T (≤ 4 ulp of float: 1e-5 is ample)
    double A = 0, B = 0;
    const int32_t* const candidates = order.data();
    for (int64_t q = m - 1; q >= 0; --q) {
      const int32_t i = candidates[q];
      lane[0][q] = T(x[i]), lane[1][q] = T(i);
      for (int64_t c = 0; c < K; ++c) lane[2 + c][q] = T(alpha[c * n + i]);
      A = std::max(A, alpha[i]), B = std::max(B, alpha[i] * std::abs(x[i]));
      lane[2 + K][q] = T(A * (1.0 + 1e-5)), lane[3 + K][q] = T(B * (1.0 + 1e-5));
    }
    for (int64_t c = 0; c < 2 * K; ++c) outs[c].resize(padded), o[c] = outs[c].data();
    auto pass = [&](auto lanes_of_k) {
      constexpr int k = decltype(lanes_of_k)::value;
      if (tags) pick_row_pass<T, TopKWinners<k>>()(xq.data(), w, o, n);
      else pick_row_pass<T, TopKLanes<k>>()(xq.data(), w, o, n);
    };
    switch (K) {
      case 1: pass(std::integral_constant<int, 1>{}); break;
      case 2: pass(std::integral_constant<int, 2>{}); break;
      case 3: pass(std::integral_constant<int, 3>{}); break;
      case 4: pass(std::integral_constant<int, 4>{}); break;
      case 5: pass(std::integral_constant<int, 5>{}); break;
      case 6: pass(std::integral_constant<int, 6>{}); break;
      case 7: pass(std::integral_constant<int, 7>{}); break;
      default: pass(std::integral_constant<int, 8>{}); break;
    }
    for (int64_t c = 0; c < K; ++c) {
      const T* const values = o[c];
      double* const to = best + c * n;
      for (int64_t q = 0; q < n; ++q) to[by_query[q]] = double(values[q]);
      if (!tags) continue;
      const T* const winners = o[K + c];
      int32_t* const tag_to = tags + c * n;
      for (int64_t q = 0; q < n; ++q) tag_to[by_query[q]] = int32_t(winners[q]);
    }
  };
  if (single) run(float{});
  else run(double{});
}

at::Tensor topk_rows(const at::Tensor& a_in, const at::Tensor& x_in, at::Tensor* argmax) {
  // CPU only, checked before winners' data is touched (over_rows checks the rest)
  if (!a_in.defined() || a_in.dim() != 3 || x_in.dim() != 2 || !a_in.device().is_cpu()) return {};
  const int64_t K = a_in.size(0), R = x_in.size(0), n = x_in.size(1);
  std::vector<at::Tensor> ins;
  std::vector<Holds> what;
  for (int64_t c = 0; c < K; ++c) ins.push_back(a_in.select(0, c)), what.push_back(Holds::LogValues);
  ins.push_back(x_in), what.push_back(Holds::Finite);
  auto winners = argmax ? at::empty({K, R, n}, x_in.options().dtype(at::kInt)) : at::Tensor();
  int32_t* pwin = argmax ? winners.data_ptr<int32_t>() : nullptr;
  const bool single = x_in.scalar_type() == at::kFloat;           // the direct pass in the graph's precision
  const bool lanes = K <= kTopKLanesMax && direct_pays(n, kDirectMaxTopK);  // tags i·K + c exact in float lanes
  auto out = over_rows(ins, what, int(K), [&](int64_t r, const double* const* in, double* const* o) {
    thread_local TopCandidates top;
    thread_local RadixSorter sorter;
    thread_local std::vector<int32_t> by_query, tags;
    thread_local CandidateLanes candidates;
    thread_local std::vector<double> best, linear, logs;
    thread_local std::vector<std::pair<double, int32_t>> exact;
    by_query.resize(n), tags.resize(K * n), best.resize(K * n), exact.resize(K * n), linear.resize(K * n),
        logs.resize(K * n);
    const double* xr = in[K];
    auto score = [&](int64_t c, int64_t i) { return in[c][i]; };
    auto put = [&](int64_t c, int64_t j, double v, int32_t tag) {
      o[c][j] = v;
      if (pwin) pwin[(c * R + r) * n + j] = tag;
    };
    const double top_score = row_max(in[0], n), xmax = row_max_abs(xr, n);  // (in vectors)
    if (top_score == -kInf) {
      for (int64_t c = 0; c < K; ++c)
        for (int64_t j = 0; j < n; ++j) put(c, j, -kInf, -1);
      return;
    }
    for (int64_t c = 0; c < K; ++c) exp_shifted(in[c], top_score, linear.data() + c * n, n, lanes && single);
    double guard = kUnderflowGuard;
    if (lanes) {
      guard = flush_for_direct(linear, K * n, single);
      topk_lanes_row(single, K, xr, linear.data(), n, best.data(), pwin ? tags.data() : nullptr);
      ++topk_lanes_count;
    } else {
      candidates.clear();
      for (int64_t i = 0; i < n; ++i)
        for (int64_t c = 0; c < K; ++c) {
          const double v = linear[c * n + i];
          if (!(v > 0)) break;  // scores descend: the rest are no paths (or underflow, see below)
          candidates.push(v, xr[i], double(i), int32_t(i * K + c));
        }
      candidates.pad();
      sorter.sort(xr, n, by_query.data());
      top.run(candidates, /*abs_lines=*/true, K, K, xr, n, by_query.data(), std::numeric_limits<int64_t>::max(),
              best.data(), tags.data());
    }
    log_shifted(best.data(), top_score, logs.data(), K * n, single);
    for (int64_t j = 0; j < n; ++j) {
      const double t = xr[j];
      // Underflow guard: the K-th slot may miss candidates whose e^{a − top}
      // fell below the double range; recompute such a query in log space.
      if (!(best[(K - 1) * n + j] >= guard * double(n * K) * (1.0 + xmax * std::abs(t)))) {
        int64_t m = 0;
        for (int64_t i = 0; i < n; ++i) {
          const double y = one_plus(xr[i], t);
          if (i == j || y == 0) continue;
          for (int64_t c = 0; c < K && score(c, i) > -kInf; ++c)
            exact[m++] = {score(c, i) + std::log(std::abs(y)), int32_t(i * K + c)};
        }
        std::partial_sort(exact.begin(), exact.begin() + std::min<int64_t>(m, K), exact.begin() + m,
                          [](const auto& p, const auto& q) { return p.first > q.first; });
        for (int64_t c = 0; c < K; ++c) put(c, j, c < m ? exact[c].first : -kInf, c < m ? exact[c].second : -1);
      } else {
        for (int64_t c = 0; c < K; ++c) put(c, j, logs[c * n + j], tags[c * n + j]);
      }
    }
  });
  if (out.empty()) return {};
  if (argmax) *argmax = winners;
  return at::stack(out);
}

NormRowStats norm_row_stats() {
  return {pruned_max_count.load(), declined_max_count.load(), topk_lanes_count.load(), pruned_signed_count.load(),
          declined_signed_count.load()};
}

}  // namespace torch_semiring::kernels
