// Row products out[r, n] = ⊕_k g[r, k] ⊗ lift(w[r, k, n]) of the fused
// attention rule, one pass over w per row, vectorised over n.
//
// The semiring arithmetic is carried in LINEAR space wherever the semiring
// allows, so the only transcendental work is per (r, k) and per (r, n), never
// per term (r, k, n):
//   real / abs / count   Σ_k g·w, Σ_k g·|w|, Σ_k g·[w ≠ 0]
//   max_abs              max_k g·|w|
//   max_prod             the (max, min) pair of g·w over signed pairs
//   viterbi, log         with G_r = max_k g[r,k] and a_k = e^{g_k − G_r}:
//                        G_r + log max_k a_k|w| (viterbi), G_r + log Σ_k a_k|w| (log)
//   entropy (ℓ, h)       a_k = e^{ℓ_k − G_r}: Z = Σ a_k|w|, R = Σ a_k|w|(h_k − log|w|),
//                        ℓ = G_r + log Z, h = R/Z (a vectorised log per term)
//   kmax (k ≤ 8)         the k largest a_k[j]·|w| (bitonic top-k merge), G_r + log of each
// Cost: R·K·N terms of a few vector instructions (kmax: ~(k/2·log2 k + k)
// compare-exchanges), R·K exponentials, R·N logarithms.
//
// Exactness of the exp-shift. A result is exact up to rounding when its
// winning (max) or total (sum) linear value is a normal number well above what
// underflow can lose: a_k underflows only when g_k < G_r + log(min normal),
// and a product a_k|w| only below the smallest normal. Every result below the
// row's threshold (2·min normal, times K/ε for sums, times max(1, max|w|) when
// the row has underflowing a_k) — including results that are exactly empty —
// is recomputed exactly by the semiring's own matmul on just those entries.
#include "kernels/attention_blocks.h"

// Vector types in template arguments trigger GCC's "ABI changed" notes; these
// functions are all internal (before tile_arithmetic.h, as in cpu_gemm.cpp).
#pragma GCC diagnostic ignored "-Wpsabi"
#include "kernels/cpu_gemm.h"
#include "kernels/tile_arithmetic.h"
#include "semiring/abs.h"
#include "semiring/count.h"
#include "semiring/entropy.h"
#include "semiring/kmax.h"
#include "semiring/log.h"
#include "semiring/max_abs.h"
#include "semiring/max_prod.h"
#include "semiring/real.h"
#include "semiring/viterbi.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace torch_semiring {
namespace kernels {
namespace {

enum class Family { Real, Abs, Count, MaxAbs, MaxProd, Viterbi, Log, Entropy, KMax };

// The dedicated loop a semiring has here (false: none). k: kmax's list length.
bool family_of(const Semiring& sr, Family& family, int64_t& k) {
  k = 1;
  if (dynamic_cast<const RealSemiring*>(&sr)) family = Family::Real;
  else if (dynamic_cast<const AbsSemiring*>(&sr)) family = Family::Abs;
  else if (dynamic_cast<const CountSemiring*>(&sr)) family = Family::Count;
  else if (dynamic_cast<const MaxAbsSemiring*>(&sr)) family = Family::MaxAbs;
  else if (dynamic_cast<const MaxProdSemiring*>(&sr)) family = Family::MaxProd;
  else if (dynamic_cast<const ViterbiSemiring*>(&sr)) family = Family::Viterbi;
  else if (dynamic_cast<const LogSemiring*>(&sr)) family = Family::Log;
  else if (dynamic_cast<const EntropySemiring*>(&sr)) family = Family::Entropy;
  else if (auto* km = dynamic_cast<const KMaxSemiring*>(&sr)) {
    family = Family::KMax;
    k = km->k();
    return k <= 8;
  } else {
    return false;
  }
  return true;
}

// ---- vector helpers ----------------------------------------------------------

template <class T, int Bytes>
struct VecOf {
  typedef T type __attribute__((vector_size(Bytes)));
};
template <class T>
struct IntOf;
template <>
struct IntOf<float> {
  using type = int32_t;
};
template <>
struct IntOf<double> {
  using type = int64_t;
};
// The integer type with V's lane layout (V itself a scalar or a vector).
template <class V, class T>
struct IntLanes {
  using I = typename IntOf<T>::type;
  using type = typename std::conditional<std::is_same<V, T>::value, I,
                                         typename VecOf<I, sizeof(V)>::type>::type;
};

template <class To, class From>
TS_TILE_FN To bitcast(From x) {
  static_assert(sizeof(To) == sizeof(From), "bitcast: sizes differ");
  To y;
  std::memcpy(&y, &x, sizeof(To));
  return y;
}
template <class V, class T>
TS_TILE_FN V splat(T x) {
  return V{} + x;
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
template <class V>
TS_TILE_FN V magnitude(V x) {
  return x < 0 ? -x : x;
}
template <class V, class T, class IV>
TS_TILE_FN V to_real(IV i) {
  if constexpr (std::is_same<V, T>::value) {
    return static_cast<T>(i);
  } else {
    return __builtin_convertvector(i, V);
  }
}

template <class T>
struct LogConstants;
template <>
struct LogConstants<float> {
  static constexpr int kMantissa = 23;
  static constexpr int32_t kBias = 127, kMantissaMask = 0x7fffff, kOneBits = 0x3f800000;
  static constexpr float kSubnormalScale = 33554432.0f, kSubnormalShift = 25;  // 2^25
  static constexpr float kLn2Hi = 6.93145751953125e-01f, kLn2Lo = 1.428606765330187e-06f;
  static constexpr int kTerms = 4;  // atanh series: relative error z^5/11 < 2e-9 for z ≤ 0.0295
};
template <>
struct LogConstants<double> {
  static constexpr int kMantissa = 52;
  static constexpr int64_t kBias = 1023, kMantissaMask = 0xfffffffffffffLL, kOneBits = 0x3ff0000000000000LL;
  static constexpr double kSubnormalScale = 18014398509481984.0, kSubnormalShift = 54;  // 2^54
  static constexpr double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;
  static constexpr int kTerms = 10;  // relative error z^11/23 < 1e-18
};

// Natural log of x > 0 (finite) for a scalar or a vector, to a few ulp:
// x = 2^e·m with m in [√½, √2), log m = 2·atanh(s), s = (m − 1)/(m + 1),
// |s| ≤ 0.172, by its series. x = 0 gives a finite value: callers mask it.
template <class V, class T>
TS_TILE_FN V log_of(V x) {
  using C = LogConstants<T>;
  using IV = typename IntLanes<V, T>::type;
  auto tiny = x < std::numeric_limits<T>::min();
  x = tiny ? x * C::kSubnormalScale : x;
  IV bits = bitcast<IV>(x);
  IV e = (bits >> C::kMantissa) - C::kBias;
  V m = bitcast<V>((bits & C::kMantissaMask) | C::kOneBits);  // [1, 2)
  auto high = m > T(1.4142135623730951);
  m = high ? m * T(0.5) : m;
  e = high ? e + 1 : e;
  V ef = to_real<V, T>(e) - (tiny ? splat<V>(C::kSubnormalShift) : splat<V>(T(0)));
  V f = m - T(1);
  V s = f / (f + T(2));
  V z = s * s;
  V series = splat<V>(T(2) / T(2 * C::kTerms + 1));
  for (int i = C::kTerms - 1; i >= 1; --i) series = series * z + T(2) / T(2 * i + 1);
  V log_m = s * T(2) + s * z * series;
  return ef * C::kLn2Hi + (ef * C::kLn2Lo + log_m);
}

// ---- per-family term arithmetic -----------------------------------------------
// kAcc accumulators per lane, kPer scalars per k (prepared per row), zero(c):
// the accumulator's start.

template <Family F>
struct SumOf {
  static constexpr int kAcc = 1, kPer = 1;
  template <class T>
  TS_TILE_FN static T zero(int) { return T(0); }
  template <class V, class T>
  TS_TILE_FN static void update(V* acc, const T* s, V w) {
    if constexpr (F == Family::Real) acc[0] += s[0] * w;
    else if constexpr (F == Family::Abs) acc[0] += s[0] * magnitude(w);
    else acc[0] += s[0] * (w != 0 ? splat<V>(T(1)) : splat<V>(T(0)));  // count
  }
};
// max_abs and viterbi (a_k = e^{g_k − G} ≥ 0): max of a·|w|, zero 0.
struct MaxOfProducts {
  static constexpr int kAcc = 1, kPer = 1;
  template <class T>
  TS_TILE_FN static T zero(int) { return T(0); }
  template <class V, class T>
  TS_TILE_FN static void update(V* acc, const T* s, V w) { acc[0] = max_keep(acc[0], s[0] * magnitude(w)); }
};
// max_prod: (M, m) NaN-marked when empty (tile_arithmetic.h's MaxProdPair), a
// zero weight marked NaN here, so neither enters the (max, min).
struct SignedPair {
  static constexpr int kAcc = 2, kPer = 2;
  template <class T>
  TS_TILE_FN static T zero(int c) { return MaxProdPair::zero<T>(c); }
  template <class V, class T>
  TS_TILE_FN static void update(V* acc, const T* s, V w) {
    MaxProdPair::update(acc, s, w == 0 ? splat<V>(std::numeric_limits<T>::quiet_NaN()) : w);
  }
};
// entropy: s = (a, a·h); Z += a|w|, R += a·h·|w| − a·|w|log|w| (|w| log|w| = 0 at w = 0).
struct EntropyPair {
  static constexpr int kAcc = 2, kPer = 2;
  template <class T>
  TS_TILE_FN static T zero(int) { return T(0); }
  template <class V, class T>
  TS_TILE_FN static void update(V* acc, const T* s, V w) {
    V m = magnitude(w);
    V m_log_m = m == 0 ? splat<V>(T(0)) : m * log_of<V, T>(m);
    acc[0] += s[0] * m;
    acc[1] += s[1] * m - s[0] * m_log_m;
  }
};
// kmax: the KP best of a_k[j]·|w| (a_k descending in j), merged bitonically.
template <int KP>
struct TopProducts {
  static constexpr int kAcc = KP, kPer = KP;
  template <class T>
  TS_TILE_FN static T zero(int) { return T(0); }
  template <class V, class T>
  TS_TILE_FN static void update(V* acc, const T* s, V w) { TopKMerge<KP, MaxTimes>::update(acc, s, magnitude(w)); }
};

// ---- the loop ------------------------------------------------------------------

// One row: acc (kAcc, N) := ⊕_k s_k ⊗ w[k, :] over lane blocks of NB vectors;
// `finite` collects w·0 (NaN iff some weight is ±inf or NaN).
template <class Op, class T, class V, int NB>
TS_TILE_FN void lane_block(const T* s, const T* w, int64_t K, int64_t N, int64_t n, T* acc_out, T& finite) {
  constexpr int L = sizeof(V) / sizeof(T);
  V acc[NB][Op::kAcc];
  V check = splat<V>(T(0));
  for (int b = 0; b < NB; ++b)
    for (int c = 0; c < Op::kAcc; ++c) acc[b][c] = splat<V>(Op::template zero<T>(c));
  for (int64_t k = 0; k < K; ++k) {
    const T* sk = s + k * Op::kPer;
    const T* wk = w + k * N + n;
    for (int b = 0; b < NB; ++b) {
      V x = load<V>(wk + b * L);
      check += x * T(0);
      Op::update(acc[b], sk, x);
    }
  }
  for (int b = 0; b < NB; ++b)
    for (int c = 0; c < Op::kAcc; ++c) store(acc_out + c * N + n + b * L, acc[b][c]);
  T lanes[L];
  store(lanes, check);
  for (int i = 0; i < L; ++i) finite += lanes[i];
}

template <class Op, class T, class V>
TS_TILE_FN void row(const T* s, const T* w, int64_t K, int64_t N, T* acc_out, T& finite) {
  constexpr int L = sizeof(V) / sizeof(T);
  constexpr int wide = Op::kAcc <= 2 ? 4 : Op::kAcc <= 4 ? 2 : 1;
  int64_t n = 0;
  for (; n + wide * L <= N; n += wide * L) lane_block<Op, T, V, wide>(s, w, K, N, n, acc_out, finite);
  for (; n + L <= N; n += L) lane_block<Op, T, V, 1>(s, w, K, N, n, acc_out, finite);
  for (; n < N; ++n) lane_block<Op, T, T, 1>(s, w, K, N, n, acc_out, finite);
}

// out[i] = acc[i] > 0 ? G + log acc[i] : −∞ (vectorised).
template <class T, class V>
TS_TILE_FN void shifted_log(const T* acc, T G, int64_t N, T* out) {
  constexpr int L = sizeof(V) / sizeof(T);
  const T ninf = -std::numeric_limits<T>::infinity();
  int64_t n = 0;
  for (; n + L <= N; n += L) {
    V a = load<V>(acc + n);
    V r = log_of<V, T>(a) + G;
    store(out + n, a > 0 ? r : splat<V>(ninf));
  }
  for (; n < N; ++n) out[n] = acc[n] > 0 ? log_of<T, T>(acc[n]) + G : ninf;
}

// Everything one call needs, prepared by the dispatcher.
template <class T>
struct Problem {
  Family family;
  int64_t k;           // kmax list length
  int64_t C, R, K, N;  // value components, rows, contraction, columns
  const T* g;          // strided (C, R, K)
  int64_t gc, gr, gk;
  const T* w;  // contiguous (R, K, N)
  T* out;      // contiguous (C, R, N)
  std::vector<int64_t> flagged;  // r·N + n of results to recompute exactly
  bool declined = false;         // a value or weight outside what the loop handles
};

template <class T>
TS_TILE_FN T g_at(const Problem<T>& p, int64_t c, int64_t r, int64_t k) {
  return p.g[c * p.gc + r * p.gr + k * p.gk];
}

// The row's scalars per k (s), its exp-shift G and threshold; false declines.
template <class Op, class T>
bool prepare_row(Problem<T>& p, int64_t r, std::vector<T>& s, T& G, T& threshold, bool& empty) {
  const T inf = std::numeric_limits<T>::infinity();
  const T nan = std::numeric_limits<T>::quiet_NaN();
  const T min_normal = std::numeric_limits<T>::min();
  const int64_t K = p.K;
  G = 0;
  threshold = 0;
  empty = false;
  switch (p.family) {
    case Family::Real:
    case Family::Abs:
    case Family::Count:
      for (int64_t k = 0; k < K; ++k) s[k] = g_at(p, 0, r, k);
      return true;
    case Family::MaxAbs:
      for (int64_t k = 0; k < K; ++k) {
        s[k] = g_at(p, 0, r, k);
        if (!(s[k] >= 0 && s[k] < inf)) return false;
      }
      return true;
    case Family::MaxProd:
      for (int64_t k = 0; k < K; ++k) {
        T M = g_at(p, 0, r, k), m = g_at(p, 1, r, k);
        if (M == -inf) {
          s[2 * k] = s[2 * k + 1] = nan;  // empty: no paths, drops out of max/min
        } else {
          if (!(std::isfinite(M) && std::isfinite(m))) return false;
          s[2 * k] = M;
          s[2 * k + 1] = m;
        }
      }
      return true;
    default:
      break;
  }
  // Exp-shifted families: the score of a (k, j) entry is g[j, r, k] (entropy: ℓ).
  const int64_t entries = p.family == Family::KMax ? p.k : 1;
  G = -inf;
  for (int64_t k = 0; k < K; ++k) {
    T top = g_at(p, 0, r, k);
    if (std::isnan(top) || top == inf) return false;
    G = std::max(G, top);
  }
  empty = G == -inf;
  if (empty) G = 0;
  const T lowest = G + std::log(min_normal);
  bool underflows = false;
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t j = 0; j < Op::kPer; ++j) {
      if (p.family == Family::Entropy && j == 1) break;
      T score = j < entries ? g_at(p, j, r, k) : -inf;
      if (std::isnan(score) || score == inf) return false;
      s[k * Op::kPer + j] = score == -inf ? T(0) : std::exp(score - G);
      underflows = underflows || (score != -inf && score < lowest);
    }
    if (p.family == Family::Entropy) {
      T h = g_at(p, 1, r, k);
      if (g_at(p, 0, r, k) == -inf) h = 0;
      if (!std::isfinite(h)) return false;
      s[2 * k + 1] = s[2 * k] * h;
    }
  }
  const bool sums = p.family == Family::Log || p.family == Family::Entropy;
  threshold = 2 * min_normal * (sums ? T(K) / std::numeric_limits<T>::epsilon() : T(1));
  if (underflows) {  // rare: a lost a_k could carry a weight up to the row's largest
    T largest = 1;
    const T* w = p.w + r * K * p.N;
    for (int64_t i = 0; i < K * p.N; ++i) largest = std::max(largest, std::abs(w[i]));
    threshold *= largest;
  }
  return true;
}

template <class Op, class T, class V>
TS_TILE_FN void run_rows(Problem<T>& p) {
  const int64_t K = p.K, N = p.N, R = p.R;
  std::vector<T> s(K * Op::kPer), acc(Op::kAcc * N);
  T finite = 0;
  for (int64_t r = 0; r < R; ++r) {
    T G, threshold;
    bool empty;
    if (!prepare_row<Op>(p, r, s, G, threshold, empty)) {
      p.declined = true;
      return;
    }
    row<Op, T, V>(s.data(), p.w + r * K * N, K, N, acc.data(), finite);
    T* out = p.out + r * N;
    const int64_t plane = R * N;  // component stride of out
    switch (p.family) {
      case Family::Real:
      case Family::Abs:
      case Family::Count:
      case Family::MaxAbs:
      case Family::MaxProd:
        for (int c = 0; c < Op::kAcc; ++c) std::memcpy(out + c * plane, acc.data() + c * N, N * sizeof(T));
        break;
      case Family::Viterbi:
      case Family::Log:
        shifted_log<T, V>(acc.data(), G, N, out);
        if (!empty)
          for (int64_t n = 0; n < N; ++n)
            if (acc[n] < threshold) p.flagged.push_back(r * N + n);
        break;
      case Family::Entropy:
        shifted_log<T, V>(acc.data(), G, N, out);
        for (int64_t n = 0; n < N; ++n) {
          const T Z = acc[n];
          out[plane + n] = Z > 0 ? acc[N + n] / Z : T(0);
          if (!empty && Z < threshold) p.flagged.push_back(r * N + n);
        }
        break;
      case Family::KMax:
        for (int64_t c = 0; c < p.k; ++c) shifted_log<T, V>(acc.data() + c * N, G, N, out + c * plane);
        if (!empty)
          for (int64_t n = 0; n < N; ++n)
            if (acc[(p.k - 1) * N + n] < threshold) p.flagged.push_back(r * N + n);
        break;
    }
  }
  if (!(finite == 0)) p.declined = true;  // a weight was ±inf or NaN
}

template <class Op, class T>
__attribute__((flatten)) void run_portable(Problem<T>& p) {
  run_rows<Op, T, typename VecOf<T, 16>::type>(p);
}
#if defined(__x86_64__) || defined(__i386__)
template <class Op, class T>
__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,fma"), flatten)) void run_avx512(Problem<T>& p) {
  run_rows<Op, T, typename VecOf<T, 64>::type>(p);
}
template <class Op, class T>
__attribute__((target("avx2,fma"), flatten)) void run_avx2(Problem<T>& p) {
  run_rows<Op, T, typename VecOf<T, 32>::type>(p);
}
#endif

template <class Op, class T>
void run_isa(Problem<T>& p) {
  const std::string isa = kernel_isa();  // honours TORCH_SEMIRING_KERNEL_ISA, as the GEMMs do
#if defined(__x86_64__) || defined(__i386__)
  if (isa == "avx512") return run_avx512<Op, T>(p);
  if (isa == "avx2") return run_avx2<Op, T>(p);
#endif
  run_portable<Op, T>(p);
}

template <class T>
void run(Problem<T>& p) {
  switch (p.family) {
    case Family::Real: return run_isa<SumOf<Family::Real>, T>(p);
    case Family::Abs: return run_isa<SumOf<Family::Abs>, T>(p);
    case Family::Count: return run_isa<SumOf<Family::Count>, T>(p);
    case Family::MaxAbs:
    case Family::Viterbi: return run_isa<MaxOfProducts, T>(p);
    case Family::Log: return run_isa<SumOf<Family::Abs>, T>(p);
    case Family::MaxProd: return run_isa<SignedPair, T>(p);
    case Family::Entropy: return run_isa<EntropyPair, T>(p);
    case Family::KMax:
      if (p.k <= 2) return run_isa<TopProducts<2>, T>(p);
      if (p.k <= 4) return run_isa<TopProducts<4>, T>(p);
      return run_isa<TopProducts<8>, T>(p);
  }
}

}  // namespace

Tensor attention_row_products(const Semiring& sr, const Tensor& g, const Tensor& w) {
  Family family;
  int64_t k;
  if (!family_of(sr, family, k) || !kernel_dtype(g, w) || g.dim() != 3 || w.dim() != 3) return {};
  const int64_t C = g.size(0), R = g.size(1), K = g.size(2), N = w.size(2);
  if (w.size(0) != R || w.size(1) != K || C != sr.components() || R == 0 || K == 0 || N == 0) return {};
  auto weights = w.contiguous();
  auto out = at::empty({C, R, N}, g.options());
  auto dispatch = [&](auto zero) {
    using T = decltype(zero);
    Problem<T> p{family, k, C, R, K, N, g.data_ptr<T>(), g.stride(0), g.stride(1), g.stride(2),
                 weights.data_ptr<T>(), out.data_ptr<T>()};
    run(p);
    return p;
  };
  std::vector<int64_t> flagged;
  if (g.scalar_type() == at::kFloat) {
    auto p = dispatch(float(0));
    if (p.declined) return {};
    flagged = std::move(p.flagged);
  } else {
    auto p = dispatch(double(0));
    if (p.declined) return {};
    flagged = std::move(p.flagged);
  }
  count_kernel_call();
  if (!flagged.empty()) {  // too close to underflow (or empty): the semiring's exact product on those entries
    auto flat = at::tensor(flagged, g.options().dtype(at::kLong));
    auto rows = flat.div(N, "floor"), cols = flat.remainder(N);
    auto g_rows = g.index_select(1, rows);                                       // (C, F, K)
    auto w_cols = weights.index({rows, at::indexing::Slice(), cols});            // (F, K)
    auto exact = sr.matmul(g_rows.unsqueeze(-2), w_cols.unsqueeze(-1)).reshape({C, -1});
    out.view({C, R * N}).index_copy_(1, flat, exact);
  }
  return out;
}

}  // namespace kernels
}  // namespace torch_semiring
