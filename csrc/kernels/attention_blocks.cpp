// Row products out[r, n] = ⊕_k g[r, k] ⊗ lift(w[r, k, n]) of the fused
// attention rule (see attention_blocks.h), one pass over the weights per row,
// vectorised over n.
//
// The semiring arithmetic is carried in LINEAR space wherever the semiring
// allows, so transcendental work is per (r, k) and per (r, n), never per term
// (r, k, n) — except entropy's |w|·log|w|:
//   real / abs / count   Σ_k g·w, Σ_k g·|w|, Σ_k g·[w ≠ 0]
//   max_abs              max_k g·|w|
//   max_prod             the (max, min) of g·w over signed pairs
//   viterbi, log         with G_r = max_k g[r,k] and a_k = e^{g_k − G_r}:
//                        G_r + log max_k a_k|w| (viterbi), G_r + log Σ_k a_k|w| (log)
//   entropy (ℓ, h)       a_k = e^{ℓ_k − G_r}: Z = Σ a_k|w|, R = Σ a_k|w|(h_k − log|w|),
//                        ℓ = G_r + log Z, h = R/Z (a vectorised log per term)
//   kmax (k ≤ 8)         the k largest a_k[j]·|w| (bitonic top-k merge), G_r + log of each
//   viterbi / max_abs    as above, the winning k kept beside the max (one compare
//     + paths            and two selects per term), its id copied per (r, n)
//   kmax + paths         the lists as for kmax, then a pass naming their winners
//                        (kmax_winners: a multiply and a compare per term)
// Cost per row: K·N terms of a few vector instructions (kmax: ~k/2·log2 k + k
// compare-exchanges; entropy: + a log), K exponentials, N logarithms (both
// vectorised here: exp_of, log_of).
//
// Exactness of the exp-shift. A result is exact up to rounding when its
// winning (max) or total (sum) linear value is a normal number well above what
// underflow can lose: a_k is flushed to 0 when g_k < G_r + log(min normal), and
// a product a_k|w| loses bits below the smallest normal. Every result below
// its row's threshold (2·min normal; times K/ε for sums; times max(1, max|w|)
// when the row had a_k flushed) is recomputed exactly by the semiring's own
// matmul on just those entries — unless it is exactly empty: in a row without
// flushed a_k, the terms that exist (a_k > 0, w ≠ 0) are counted, and slots
// beyond their number are the zero (a causal first row, tied values).
//
// The fused driver (attention_value_blocks) runs, per key/value head and block
// of query rows: one pass forming Δ on the fly for Y (then ⊗ lift(P), giving X)
// while writing W = P·Δ, one product J = W K into a block buffer (the register
// tile j_product_avx2 on AVX2, else at::mm), one pass of row products over J.
// A block's W is ~2^16 elements (L2); its rows' prepared scalars (the a_k)
// serve both passes. Its weights are bounded up front (max|v|, |out|, |P|,
// |k|), so its loops skip the per-term finiteness check the stand-alone row
// products make.
#include "kernels/attention_blocks.h"

// Vector types in template arguments trigger GCC's "ABI changed" notes; these
// functions are all internal (before tile_arithmetic.h, as in cpu_gemm.cpp).
#pragma GCC diagnostic ignored "-Wpsabi"
#include "kernels/cpu_gemm.h"
#include "kernels/cpu_vectors.h"
#include "kernels/tile_arithmetic.h"
#include "kernels/vector_math.h"  // log_by_table (after cpu_vectors.h, as it asks)
#include "semiring/abs.h"
#include "semiring/count.h"
#include "semiring/entropy.h"
#include "semiring/kmax.h"
#include "semiring/log.h"
#include "semiring/max_abs.h"
#include "semiring/max_prod.h"
#include "semiring/provenance.h"
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

// The loop a semiring has here (false: none). k: kmax's list length; ids:
// the provenance version (values (score, id): the loop also reports which
// term won, and the winner's id is copied — viterbi+paths and max_abs+paths;
// kmax+paths: the lists as for kmax, then their winners, see kmax_winners).
bool family_of(const Semiring& sr, Family& family, int64_t& k, bool& ids) {
  k = 1;
  ids = false;
  if (auto* paths = dynamic_cast<const ProvenanceSemiring*>(&sr)) {
    ids = true;
    if (dynamic_cast<const ViterbiSemiring*>(&paths->base())) family = Family::Viterbi;
    else if (dynamic_cast<const MaxAbsSemiring*>(&paths->base())) family = Family::MaxAbs;
    else if (auto* km = dynamic_cast<const KMaxSemiring*>(&paths->base())) {
      family = Family::KMax;
      k = km->k();
      return k <= 8;
    } else {
      return false;  // other selecting semirings' paths (max_prod, min_plus): the semiring's matmul
    }
    return true;
  }
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

// The integer type with V's lane layout (V a scalar or a vector of T).
template <class V, class T>
struct IntLanes {
  using I = LaneInt<T>;
  using type = typename std::conditional<std::is_same<V, T>::value, I, typename VecOf<I, sizeof(V)>::type>::type;
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
// |x| by clearing the sign bit: one logic op (a compare and a blend cost two
// FP ops a vector more on the hot loops of row_products); −0 becomes +0.
template <class V>
TS_TILE_FN V magnitude(V x) {
  if constexpr (std::is_floating_point<V>::value) {
    return std::abs(x);
  } else {
    using Lane = typename std::remove_reference<decltype(x[0])>::type;
    using IV = typename VecOf<LaneInt<Lane>, sizeof(V)>::type;
    return bitcast<V>(bitcast<IV>(x) & std::numeric_limits<LaneInt<Lane>>::max());
  }
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
struct MathConstants;
template <>
struct MathConstants<float> {
  static constexpr int kMantissa = 23;
  static constexpr int32_t kBias = 127, kMantissaMask = 0x7fffff, kOneBits = 0x3f800000;
  static constexpr float kSubnormalScale = 33554432.0f, kSubnormalShift = 25;  // 2^25
  static constexpr float kLog2e = 1.44269504088896341f, kShifter = 12582912.0f;  // 1.5·2^23
  static constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;        // Cephes' split of log 2
  static constexpr float kLowest = -87.33654475f;  // log(min normal)
  static constexpr int kExpTerms = 7;  // Taylor: r^8/8! < 3e-9 for |r| ≤ log(2)/2
};
template <>
struct MathConstants<double> {
  static constexpr int kMantissa = 52;
  static constexpr int64_t kBias = 1023, kMantissaMask = 0xfffffffffffffLL, kOneBits = 0x3ff0000000000000LL;
  static constexpr double kSubnormalScale = 18014398509481984.0, kSubnormalShift = 54;  // 2^54
  static constexpr double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;
  static constexpr int kLogTerms = 10;  // relative error z^11/23 < 1e-18
  static constexpr double kLog2e = 1.4426950408889634, kShifter = 6755399441055744.0;  // 1.5·2^52
  static constexpr double kLowest = -708.39641853226408;
  static constexpr int kExpTerms = 13;  // r^14/14! < 5e-18
};

// Natural log of x > 0 (finite), scalar or vector, to a few ulp: x = 2^e·m
// with m in [√½, √2). float: log(1 + f), f = m − 1, by Cephes' logf
// polynomial (no division); double: 2·atanh(s), s = (m − 1)/(m + 1),
// |s| ≤ 0.172, by its series. x = 0 gives a finite value: callers mask it.
template <class V, class T>
TS_TILE_FN V log_of(V x) {
  using C = MathConstants<T>;
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
  if constexpr (std::is_same<T, float>::value) {
    V z = f * f;
    V p = splat<V>(7.0376836292e-2f);
    for (float c : {-1.1514610310e-1f, 1.1676998740e-1f, -1.2420140846e-1f, 1.4249322787e-1f, -1.6668057665e-1f,
                    2.0000714765e-1f, -2.4999993993e-1f, 3.3333331174e-1f})
      p = p * f + c;
    V y = f * z * p + ef * -2.12194440e-4f - z * 0.5f;
    return (f + y) + ef * 0.693359375f;
  } else {
    V s = f / (f + T(2));
    V z = s * s;
    V series = splat<V>(T(2) / T(2 * C::kLogTerms + 1));
    for (int i = C::kLogTerms - 1; i >= 1; --i) series = series * z + T(2) / T(2 * i + 1);
    return ef * C::kLn2Hi + (ef * C::kLn2Lo + (s * T(2) + s * z * series));
  }
}

// e^x for x ≤ 0 (scalar or vector), to a few ulp; x below log(min normal),
// −∞ included, gives 0 (flushed: the callers count those as underflowed).
template <class V, class T>
TS_TILE_FN V exp_of(V x) {
  using C = MathConstants<T>;
  using IV = typename IntLanes<V, T>::type;
  auto flushed = x < C::kLowest;
  x = flushed ? splat<V>(T(0)) : x;
  V y = x * C::kLog2e + C::kShifter;
  V n = y - C::kShifter;  // x/log 2 rounded to the nearest integer
  IV ni = bitcast<IV>(y) - bitcast<IV>(splat<V>(C::kShifter));
  V r = (x - n * C::kLn2Hi) - n * C::kLn2Lo;
  V p = splat<V>(T(1));
  for (int i = C::kExpTerms; i >= 1; --i) p = p * (r * (T(1) / T(i))) + T(1);
  V two_n = bitcast<V>((ni + C::kBias) << C::kMantissa);
  return flushed ? splat<V>(T(0)) : p * two_n;
}

// ---- per-family term arithmetic -----------------------------------------------
// kAcc accumulators per lane, kPer prepared scalars per k, zero(c): the start.

template <Family F>
struct SumOf {
  static constexpr int kAcc = 1, kPer = 1;
  static constexpr bool kWinner = false;
  template <class T>
  TS_TILE_FN static T zero(int) { return T(0); }
  template <class V, class T>
  TS_TILE_FN static void update(V* acc, const T* s, V w) {
    if constexpr (F == Family::Real) acc[0] += s[0] * w;
    else if constexpr (F == Family::Count) acc[0] += s[0] * (w != 0 ? splat<V>(T(1)) : splat<V>(T(0)));
    else acc[0] += s[0] * magnitude(w);  // abs, log
  }
};
// max_abs and viterbi (a_k = e^{g_k − G} ≥ 0): max of a·|w|, zero 0.
struct MaxOfProducts {
  static constexpr int kAcc = 1, kPer = 1;
  static constexpr bool kWinner = false;
  template <class T>
  TS_TILE_FN static T zero(int) { return T(0); }
  template <class V, class T>
  TS_TILE_FN static void update(V* acc, const T* s, V w) { acc[0] = max_keep(acc[0], s[0] * magnitude(w)); }
};
// The same with the winning k (plane 1, −1: no term > 0): the first of tied
// maxima wins, as the provenance ⊕ keeps its left operand.
struct ArgMaxOfProducts {
  static constexpr int kAcc = 2, kPer = 1;
  static constexpr bool kWinner = true;
  template <class T>
  TS_TILE_FN static T zero(int c) { return c == 0 ? T(0) : T(-1); }
  template <class V, class T>
  TS_TILE_FN static void update_at(V* acc, const T* s, V w, V k) {
    const V p = s[0] * magnitude(w);
    const auto wins = p > acc[0];
    acc[0] = wins ? p : acc[0];
    acc[1] = wins ? k : acc[1];
  }
};
// max_prod: (M, m) NaN-marked when empty (as tile_arithmetic.h's MaxProdPair
// expects), a zero weight marked NaN here, so neither enters the (max, min).
struct SignedPair {
  static constexpr int kAcc = 2, kPer = 2;
  static constexpr bool kWinner = false;
  template <class T>
  TS_TILE_FN static T zero(int c) { return MaxProdPair::zero<T>(c); }
  template <class V, class T>
  TS_TILE_FN static void update(V* acc, const T* s, V w) {
    MaxProdPair::update(acc, s, w == 0 ? splat<V>(std::numeric_limits<T>::quiet_NaN()) : w);
  }
};
// log m for m ≥ 0 finite, as entropy's terms m·(s1 − s0·log m) need it (0
// gives a finite value: the term is 0·finite = 0). Float vectors of 8 or 16
// lanes by vmath::log_by_table (~15 operations instead of log_of's ~28: entropy
// takes one per term) of max(m, FLT_MIN): a subnormal m's log is taken at the
// smallest normal. Its term then errs by s0·m·log(FLT_MIN/m) ≤ FLT_MIN/e
// (s0 = a ≤ 1; m·log(c/m) peaks at m = c/e), so h = R/Z errs by at most
// 0.19·ε·(subnormal terms)/K wherever Z clears the threshold (2·FLT_MIN·K/ε,
// see `threshold`; below it the result is recomputed exactly) — under one
// rounding of h. One vmaxps where scaling the subnormals took five operations
// of the term's ~28.
template <class V, class T>
TS_TILE_FN V log_magnitude(V m) {
  if constexpr (std::is_same<T, float>::value && !std::is_same<V, T>::value && (sizeof(V) == 64 || sizeof(V) == 32)) {
    return vmath::log_by_table(larger_lanes(m, splat<V>(std::numeric_limits<float>::min())));
  } else {
    return log_of<V, T>(m);
  }
}

// entropy: s = (a, a·h); Z += a|w|, R += |w|·(a·h − a·log|w|). At w = 0 the
// log is finite (log_magnitude), so the term is 0·finite = 0 with no mask:
// 2 operations after the log where |w|log|w| masked, then combined, took 5
// (the fused attention kernel's Y pass: ~9 % fewer per term).
struct EntropyPair {
  static constexpr int kAcc = 2, kPer = 2;
  static constexpr bool kLogPerTerm = true;  // row_products: 2 column blocks at a time on AVX2, not 4
  static constexpr bool kWinner = false;
  template <class T>
  TS_TILE_FN static T zero(int) { return T(0); }
  template <class V, class T>
  TS_TILE_FN static void update(V* acc, const T* s, V w) {
    const V m = magnitude(w);
    acc[0] += s[0] * m;
    acc[1] += m * (s[1] - s[0] * log_magnitude<V, T>(m));
  }
};
// kmax: the KP best of a_k[j]·|w| (a_k descending in j), merged bitonically.
template <int KP>
struct TopProducts {
  static constexpr int kAcc = KP, kPer = KP;
  static constexpr bool kWinner = false;
  template <class T>
  TS_TILE_FN static T zero(int) { return T(0); }
  template <class V, class T>
  TS_TILE_FN static void update(V* acc, const T* s, V w) { TopKMerge<KP, MaxTimes>::update(acc, s, magnitude(w)); }
};

// ---- weights of a row ------------------------------------------------------------

// Stored weights w[k, n] (row stride ld).
template <class T>
struct StoredWeights {
  const T* w;
  int64_t ld;
  template <class V>
  TS_TILE_FN V at(int64_t k, int64_t n) const { return load<V>(w + k * ld + n); }
  template <class V>
  TS_TILE_FN void emit(int64_t, int64_t, V) const {}
  T largest(int64_t K, int64_t N) const {
    T m = 0;
    for (int64_t k = 0; k < K; ++k)
      for (int64_t n = 0; n < N; ++n) m = std::max(m, std::abs(w[k * ld + n]));
    return m;
  }
};
// Value differences Δ[k, n] = vT[k, n] − o[k]; with EMIT also writes
// W[k, n] = p[n]·Δ[k, n] (row stride ldw), the GEMM's operand.
template <class T, bool EMIT>
struct ValueDifferences {
  const T* vT;
  int64_t ld;
  const T* o;
  const T* p;
  T* W;
  int64_t ldw;
  template <class V>
  TS_TILE_FN V at(int64_t k, int64_t n) const { return load<V>(vT + k * ld + n) - o[k]; }
  template <class V>
  TS_TILE_FN void emit(int64_t k, int64_t n, V x) const {
    if constexpr (EMIT) store(W + k * ldw + n, x * load<V>(p + n));
  }
  T largest(int64_t K, int64_t N) const {
    T m = 0;
    for (int64_t k = 0; k < K; ++k)
      for (int64_t n = 0; n < N; ++n) m = std::max(m, std::abs(vT[k * ld + n] - o[k]));
    return m;
  }
};

// acc (kAcc planes of stride ld) := ⊕_k s_k ⊗ w[k, n0 : n0 + NB·L]; with
// !ACC only the weights' emission runs. With CHECK, `finite` collects w·0:
// NaN iff a weight was ±∞ or NaN (callers that bound their weights skip it).
template <class Op, bool ACC, bool CHECK, class T, class V, int NB, class Src>
TS_TILE_FN void lane_block(const T* s, const Src& src, int64_t K, int64_t ld, int64_t n0, T* acc_out, V& finite) {
  constexpr int L = sizeof(V) / sizeof(T);
  // The b loops fully unrolled, so acc stays in registers: as a loop, GCC put
  // acc on the stack and every term paid a load, a store and the store-to-load
  // latency of the chain through it (perf: the max and store of acc took
  // ~20 % of the fused attention kernel).
  V acc[NB][Op::kAcc];
  _Pragma("GCC unroll 4") for (int b = 0; b < NB; ++b)
    _Pragma("GCC unroll 8") for (int c = 0; c < Op::kAcc; ++c) acc[b][c] = splat<V>(Op::template zero<T>(c));
  for (int64_t k = 0; k < K; ++k) {
    const T* sk = s + k * Op::kPer;
    _Pragma("GCC unroll 4") for (int b = 0; b < NB; ++b) {
      V x = src.template at<V>(k, n0 + b * L);
      if constexpr (CHECK) finite += x * T(0);
      if constexpr (ACC && Op::kWinner) Op::update_at(acc[b], sk, x, splat<V>(T(k)));
      else if constexpr (ACC) Op::update(acc[b], sk, x);
      src.template emit<V>(k, n0 + b * L, x);
    }
  }
  if constexpr (ACC)
    _Pragma("GCC unroll 4") for (int b = 0; b < NB; ++b)
      _Pragma("GCC unroll 8") for (int c = 0; c < Op::kAcc; ++c) store(acc_out + c * ld + n0 + b * L, acc[b][c]);
}

// Ops whose term takes a logarithm (entropy's): its ~10 temporaries beside 4 blocks' accumulators, the
// row's scalars and the weights overflow AVX2's 16 registers (GCC spilled ~40 % of the loop's vector
// instructions to the stack), so there they take 2 blocks at a time.
template <class Op, class = void>
struct log_per_term : std::false_type {};
template <class Op>
struct log_per_term<Op, std::void_t<decltype(Op::kLogPerTerm)>> : std::bool_constant<Op::kLogPerTerm> {};

// One row over columns [0, N) into acc planes of stride ld: lane blocks of
// 4/2/1 vectors (2/2/1 for log_per_term ops on AVX2), then scalars. Returns false when a weight was not finite.
template <class Op, bool ACC, bool CHECK, class T, class V, class Src>
TS_TILE_FN bool row_products(const T* s, const Src& src, int64_t K, int64_t N, T* acc_out, int64_t ld) {
  constexpr int L = sizeof(V) / sizeof(T);
  constexpr int wide = Op::kAcc <= 2 ? (sizeof(V) == 32 && log_per_term<Op>::value ? 2 : 4) : Op::kAcc <= 4 ? 2 : 1;
  V finite = splat<V>(T(0));
  T finite_tail = 0;
  int64_t n = 0;
  for (; n + wide * L <= N; n += wide * L) lane_block<Op, ACC, CHECK, T, V, wide>(s, src, K, ld, n, acc_out, finite);
  for (; n + L <= N; n += L) lane_block<Op, ACC, CHECK, T, V, 1>(s, src, K, ld, n, acc_out, finite);
  for (; n < N; ++n) lane_block<Op, ACC, CHECK, T, T, 1>(s, src, K, ld, n, acc_out, finite_tail);
  T lanes[L];
  store(lanes, finite);
  for (int i = 0; i < L; ++i) finite_tail += lanes[i];
  return finite_tail == 0;
}

// out[n] = acc[n] > 0 ? G + log acc[n] : −∞.
template <class T, class V>
TS_TILE_FN void shifted_log(const T* acc, T G, int64_t N, T* out) {
  constexpr int L = sizeof(V) / sizeof(T);
  const T ninf = -std::numeric_limits<T>::infinity();
  int64_t n = 0;
  for (; n + L <= N; n += L) {
    V a = load<V>(acc + n);
    store(out + n, a > 0 ? log_of<V, T>(a) + G : splat<V>(ninf));
  }
  for (; n < N; ++n) out[n] = acc[n] > 0 ? log_of<T, T>(acc[n]) + G : ninf;
}

// ---- one row: its prepared scalars, and its results --------------------------------

// A row's scalars per k (kPer each), its exp-shift and what the threshold needs.
template <class T>
struct RowScalars {
  T* s;             // K·kPer
  T G = 0;          // exp-shift (0 for the linear families)
  bool empty = false;       // no paths at all (every g is the zero): no results to check
  bool underflows = false;  // some a_k were flushed to 0
  const T* ids = nullptr;   // provenance: the row's ids, id of entry j of k at ids[j·id_plane + k·id_stride]
  int64_t id_stride = 1, id_plane = 0;
};

// Lane-wise "any": a comparison mask (vector) or a bool (scalar).
template <class M>
TS_TILE_FN bool any_lane(M m) {
  if constexpr (std::is_same<M, bool>::value) {
    return m;
  } else {
    constexpr int n = sizeof(M) / sizeof(m[0]);
    for (int i = 0; i < n; ++i)
      if (m[i]) return true;
    return false;
  }
}

// Over x[0, K): the largest value (G) and whether a NaN or +∞ occurs.
template <class T, class V>
TS_TILE_FN void scan_scores(const T* x, int64_t K, T& G, bool& bad) {
  constexpr int L = sizeof(V) / sizeof(T);
  const T inf = std::numeric_limits<T>::infinity();
  int64_t k = 0;
  if constexpr (L > 1) {
    V top = splat<V>(-inf);
    // every lane so far below +inf (NaN is not): one compare per vector — GCC builds compares joined
    // by | or & lane by lane in these always-inline templates (they are lowered before inlining)
    auto fine = top < inf;
    for (; k + L <= K; k += L) {
      V v = load<V>(x + k);
      fine &= v < inf;
      top = max_keep(top, v);
    }
    bad = bad || any_lane(~fine);
    T lanes[L];
    store(lanes, top);
    for (int i = 0; i < L; ++i) G = std::max(G, lanes[i]);
  }
  for (; k < K; ++k) {
    bad = bad || std::isnan(x[k]) || x[k] == inf;
    G = std::max(G, x[k]);
  }
}

// a[k] = e^{x[k] − G} (0 where flushed); `underflows`: a finite x was flushed.
template <class T, class V>
TS_TILE_FN void shifted_exps(const T* x, int64_t K, T G, T* a, bool& underflows) {
  constexpr int L = sizeof(V) / sizeof(T);
  const T ninf = -std::numeric_limits<T>::infinity();
  int64_t k = 0;
  if constexpr (L > 1) {
    V lost = splat<V>(T(0));
    for (; k + L <= K; k += L) {
      V v = load<V>(x + k);
      V e = exp_of<V, T>(v - G);
      const V flushed = e == 0 ? v : splat<V>(ninf);  // (selects on one compare each: see scan_scores)
      lost = flushed != ninf ? splat<V>(T(1)) : lost;
      store(a + k, e);
    }
    underflows = underflows || any_lane(lost != 0);
  }
  for (; k < K; ++k) {
    a[k] = exp_of<T, T>(x[k] - G);
    underflows = underflows || (a[k] == 0 && x[k] != ninf);
  }
}

// Reads row r's value g (C components at stride gc, K entries at stride gk)
// into the row's scalars; scratch holds (kPer + 1)·K values. false: a value
// outside what the loops handle.
template <class Op, class T, class V>
TS_TILE_FN bool prepare_row(Family family, int64_t kmax, const T* g, int64_t gc, int64_t gk, int64_t K,
                            RowScalars<T>& row, T* scratch) {
  constexpr int P = Op::kPer;
  const T inf = std::numeric_limits<T>::infinity();
  T* s = row.s;
  row.G = 0;
  row.empty = row.underflows = false;
  // Component j of the row, K contiguous values (gathered when strided).
  auto component = [&](int64_t j) -> const T* {
    if (gk == 1) return g + j * gc;
    T* dst = scratch + P * K;
    for (int64_t k = 0; k < K; ++k) dst[k] = g[j * gc + k * gk];
    return dst;
  };
  switch (family) {
    case Family::Real:
    case Family::Abs:
    case Family::Count:
      std::memcpy(s, component(0), K * sizeof(T));
      return true;
    case Family::MaxAbs: {
      const T* x = component(0);
      for (int64_t k = 0; k < K; ++k)
        if (!(x[k] >= 0 && x[k] < inf)) return false;
      std::memcpy(s, x, K * sizeof(T));
      return true;
    }
    case Family::MaxProd:
      for (int64_t k = 0; k < K; ++k) {
        const T M = g[k * gk], m = g[gc + k * gk];
        if (M == -inf) {  // empty: NaN drops out of (max, min)
          s[2 * k] = s[2 * k + 1] = std::numeric_limits<T>::quiet_NaN();
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
  // Exp-shifted: entry j of k scores g[j, k] (kmax: j < kmax lists, sorted so
  // that j = 0 holds the largest; else component 0 only).
  const int64_t entries = family == Family::KMax ? kmax : 1;
  T G = -inf;
  bool bad = false;
  scan_scores<T, V>(component(0), K, G, bad);
  row.empty = G == -inf;
  if (row.empty) G = 0;
  row.G = G;
  T* a = scratch;  // (entries, K)
  for (int64_t j = 0; j < entries; ++j) {
    const T* x = component(j);
    if (j > 0) {
      T ignored = -inf;
      scan_scores<T, V>(x, K, ignored, bad);
    }
    shifted_exps<T, V>(x, K, G, a + j * K, row.underflows);
  }
  if (bad) return false;
  if (family == Family::Entropy) {  // s = (a_k, a_k·h_k); h of an empty value is 0
    const T* h = component(1);
    for (int64_t k = 0; k < K; ++k) {
      const T hk = g[k * gk] == -inf ? T(0) : h[k];
      if (!std::isfinite(hk)) return false;
      s[2 * k] = a[k];
      s[2 * k + 1] = a[k] * hk;
    }
    return true;
  }
  if (entries < P) std::memset(s, 0, K * P * sizeof(T));
  for (int64_t j = 0; j < entries; ++j)
    for (int64_t k = 0; k < K; ++k) s[k * P + j] = a[j * K + k];
  return true;
}

// The lowest exact result of a row (see the header comment): below it, recompute.
template <class T, class Src>
T threshold(Family family, const RowScalars<T>& row, const Src& src, int64_t K, int64_t N) {
  const bool sums = family == Family::Log || family == Family::Entropy;
  T t = 2 * std::numeric_limits<T>::min() * (sums ? T(K) / std::numeric_limits<T>::epsilon() : T(1));
  if (row.underflows) t *= std::max(T(1), src.largest(K, N));
  return t;
}

// The first n ≥ from with !(a[n] ≥ limit), or N: whole vectors at a time (a
// scalar loop here, once per result, cost as much as the row's terms at
// S = 64 keys and D = 32).
template <class T, class V>
TS_TILE_FN int64_t next_below(const T* a, int64_t N, T limit, int64_t from) {
  constexpr int L = sizeof(V) / sizeof(T);
  int64_t n = from;
  if constexpr (L > 1) {
    const V bound = splat<V>(limit);
    for (; n + L <= N; n += L)
      if (lanes_where<kAtLeast>(load<V>(a + n), bound) != (uint32_t(1) << L) - 1) break;
  }
  for (; n < N; ++n)
    if (!(a[n] >= limit)) return n;
  return N;
}

// kmax+paths: the ids of a row's lists. The lists (acc: E planes of stride
// Ntot, linear, descending, 0 where no path) are the kernel's; a winner
// scores at least t = the E-th best, and as the entries of s descend, only
// the k whose first entry reaches t (and is a path, > 0) can hold one —
// about E per result. A vector of results takes each such k's entries while
// any lane reaches t; an entry takes the first free slot holding its score
// (ties: the smallest k, then entry, as the kmax GEMM's winners), and the
// slot gets the entry's id. Compares feed selects only (GCC turns a compare
// kept as a vector value into code lane by lane). Cost: K·N terms of a
// multiply and a compare, plus O(E) per entry that reaches t.
template <class T, class V>
TS_TILE_FN bool any_positive(V x) {  // NaN lanes: no
  if constexpr (std::is_same<V, T>::value) return x > 0;
  else return lanes_where<kGreater>(x, splat<V>(T(0))) != 0;
}
template <class T, class V>
TS_TILE_FN void place_ids(const V* lists, V* ids, int64_t E, V x, V id) {
  const V none = splat<V>(std::numeric_limits<T>::quiet_NaN());
  for (int64_t c = 0; c < E; ++c) {
    const V free_x = ids[c] < 0 ? x : none;  // x, where slot c is free
    ids[c] = lists[c] == free_x ? id : ids[c];
    x = lists[c] == free_x ? none : x;  // placed: no further slot
  }
}
template <class T, class V, class Src>
TS_TILE_FN void kmax_winners_at(const RowScalars<T>& row, const Src& src, int64_t K, int64_t n, const T* acc,
                                int64_t Ntot, int64_t E, int P, T* out, int64_t plane) {
  const V none = splat<V>(std::numeric_limits<T>::quiet_NaN());
  V lists[8], ids[8];
  for (int64_t c = 0; c < E; ++c) lists[c] = load<V>(acc + c * Ntot + n), ids[c] = splat<V>(T(-1));
  const V t = lists[E - 1];
  for (int64_t k = 0; k < K; ++k) {
    const V w = magnitude(src.template at<V>(k, n));
    const T* sk = row.s + k * P;
    for (int64_t j = 0; j < E; ++j) {
      const V x = sk[j] * w;  // the loop's term, bit for bit
      V reach = x >= t ? x : none;
      reach = reach > 0 ? reach : none;  // 0: no path
      if (!any_positive<T>(reach)) break;    // the entries descend
      place_ids<T, V>(lists, ids, E, reach, splat<V>(row.ids[j * row.id_plane + k * row.id_stride]));
    }
  }
  for (int64_t c = 0; c < E; ++c) store(out + c * plane + n, ids[c]);
}
template <class T, class V, class Src>
TS_TILE_FN void kmax_winners(const RowScalars<T>& row, const Src& src, int64_t K, int64_t N, int64_t Ntot,
                             const T* acc, int64_t E, int P, T* out, int64_t plane) {
  constexpr int L = sizeof(V) / sizeof(T);
  int64_t n = 0;
  for (; n + L <= N; n += L) kmax_winners_at<T, V>(row, src, K, n, acc, Ntot, E, P, out, plane);
  for (; n < N; ++n) kmax_winners_at<T, T>(row, src, K, n, acc, Ntot, E, P, out, plane);
  for (; n < Ntot; ++n)  // columns past N (a causal block's later keys): no path
    for (int64_t c = 0; c < E; ++c) out[c * plane + n] = T(-1);
}

// Writes a row's results (C planes at stride `plane`) from acc (kAcc planes of
// stride Ntot; columns [N, Ntot) hold the zero) and lists the columns to
// recompute. A result below the threshold is exact when it is exactly empty:
// in a row without flushed a_k, its slots beyond the number of terms that
// exist (g_k not the zero, w ≠ 0: a_k > 0 there) are empty, the rest must
// clear the threshold (kmax: the last such slot, they are sorted).
template <class Op, class T, class V, class Src>
TS_TILE_FN void finish_row(Family family, int64_t kmax, const RowScalars<T>& row, const Src& src, int64_t K,
                           int64_t N, int64_t Ntot, const T* acc, T* out, int64_t plane, std::vector<int64_t>& redo) {
  constexpr int kscores = Op::kWinner ? 1 : Op::kAcc;  // a winner plane follows the score
  if constexpr (Op::kWinner)
    for (int64_t n = 0; n < Ntot; ++n) {
      const T won = acc[Ntot + n];
      out[plane + n] = won >= 0 ? row.ids[static_cast<int64_t>(won) * row.id_stride] : T(-1);
    }
  switch (family) {
    case Family::Real:
    case Family::Abs:
    case Family::Count:
    case Family::MaxAbs:
    case Family::MaxProd:
      for (int c = 0; c < kscores; ++c) std::memcpy(out + c * plane, acc + c * Ntot, Ntot * sizeof(T));
      return;
    default:
      break;
  }
  const int64_t lists = family == Family::KMax ? kmax : 1;
  if (family == Family::KMax && row.ids) kmax_winners<T, V>(row, src, K, N, Ntot, acc, kmax, Op::kPer, out + kmax * plane, plane);
  for (int64_t c = 0; c < lists; ++c) shifted_log<T, V>(acc + c * Ntot, row.G, Ntot, out + c * plane);
  if (family == Family::Entropy) {  // h = R/Z, 0 where no path (in vectors: a scalar division per result cost ~4 %)
    constexpr int L = sizeof(V) / sizeof(T);
    int64_t n = 0;
    for (; n + L <= Ntot; n += L) {
      const V z = load<V>(acc + n);
      const V positive = z > 0 ? z : splat<V>(T(1));
      store(out + plane + n, z > 0 ? load<V>(acc + Ntot + n) / positive : splat<V>(T(0)));
    }
    for (; n < Ntot; ++n) out[plane + n] = acc[n] > 0 ? acc[Ntot + n] / acc[n] : T(0);
  }
  if (row.empty) return;
  const T limit = threshold(family, row, src, K, N);
  const T* last = acc + (lists - 1) * Ntot;
  for (int64_t n = next_below<T, V>(last, N, limit, 0); n < N; n = next_below<T, V>(last, N, limit, n + 1)) {
    int64_t filled = lists;
    if (!row.underflows) {
      filled = 0;
      for (int64_t k = 0; k < K && filled < lists; ++k)
        if (src.template at<T>(k, n) != 0)
          for (int64_t j = 0; j < lists; ++j) filled += row.s[k * Op::kPer + j] > 0;
      filled = std::min(filled, lists);
    }
    if (filled > 0 && acc[(filled - 1) * Ntot + n] < limit) redo.push_back(n);
  }
}

// out ⊗= lift(p[n]) for a row's results (C planes at stride `plane`): the
// linear families multiply (|p|, [p ≠ 0], signed pairs), the log-space ones
// add log|p| (entropy: ℓ + log|p|, h − log|p|); p = 0 gives the zero.
template <class T, class V>
TS_TILE_FN void apply_factor(Family family, int64_t kmax, const T* p, int64_t N, T* out, int64_t plane, T* log_p) {
  constexpr int L = sizeof(V) / sizeof(T);
  const T inf = std::numeric_limits<T>::infinity();
  // Each loop in vectors of L, then scalars: as plain loops GCC at -O2 kept
  // them scalar (out and p may alias), ~9 % of the fused driver's time.
  auto each = [&](auto&& f) __attribute__((always_inline)) {
    int64_t n = 0;
    for (; n + L <= N; n += L) f(V{}, n);  // the first argument: a tag naming the width
    for (; n < N; ++n) f(T{}, n);
  };
  switch (family) {
    case Family::Real:
      each([&](auto tag, int64_t n) {
        using W = decltype(tag);
        store(out + n, load<W>(out + n) * load<W>(p + n));
      });
      return;
    case Family::Abs:
    case Family::MaxAbs:
      each([&](auto tag, int64_t n) {
        using W = decltype(tag);
        store(out + n, load<W>(out + n) * magnitude(load<W>(p + n)));
      });
      return;
    case Family::Count:
      each([&](auto tag, int64_t n) {
        using W = decltype(tag);
        const W x = load<W>(out + n);
        store(out + n, load<W>(p + n) != 0 ? x : splat<W>(T(0)));
      });
      return;
    case Family::MaxProd:
      for (int64_t n = 0; n < N; ++n) {
        const T M = out[n], m = out[plane + n];
        if (p[n] == 0 || M == -inf) {
          out[n] = -inf;
          out[plane + n] = inf;
        } else {
          out[n] = std::max(M * p[n], m * p[n]);
          out[plane + n] = std::min(M * p[n], m * p[n]);
        }
      }
      return;
    default:
      break;
  }
  each([&](auto tag, int64_t n) {
    using W = decltype(tag);
    const W x = magnitude(load<W>(p + n));
    store(log_p + n, x > 0 ? log_of<W, T>(x) : splat<W>(-inf));
  });
  const int64_t lists = family == Family::KMax ? kmax : 1;
  for (int64_t c = 0; c < lists; ++c)
    each([&](auto tag, int64_t n) {
      using W = decltype(tag);
      store(out + c * plane + n, load<W>(out + c * plane + n) + load<W>(log_p + n));
    });
  if (family == Family::Entropy)
    each([&](auto tag, int64_t n) {
      using W = decltype(tag);
      const W h = load<W>(out + plane + n) - load<W>(log_p + n);
      store(out + plane + n, load<W>(out + n) == -inf ? splat<W>(T(0)) : h);
    });
}

// ---- instruction-set dispatch -------------------------------------------------------
// A job has `template <class Op, class T, class V> void run()`; it is compiled
// for AVX-512, AVX2 or the baseline ISA (as cpu_gemm.cpp does) and the best
// one the machine (and TORCH_SEMIRING_KERNEL_ISA) allows is picked.

template <class Op, class T, class Job>
__attribute__((flatten)) void run_portable(Job& job) {
  job.template run<Op, T, typename VecOf<T, 16>::type>();
}
#if defined(__x86_64__) || defined(__i386__)
template <class Op, class T, class Job>
__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,fma"), flatten)) void run_avx512(Job& job) {
  job.template run<Op, T, typename VecOf<T, 64>::type>();
}
template <class Op, class T, class Job>
__attribute__((target("avx2,fma"), flatten)) void run_avx2(Job& job) {
  job.template run<Op, T, typename VecOf<T, 32>::type>();
}
#endif

template <class Op, class T, class Job>
void run_isa(Job& job) {
  const std::string isa = kernel_isa();
#if defined(__x86_64__) || defined(__i386__)
  if (isa == "avx512") return run_avx512<Op, T>(job);
  if (isa == "avx2") return run_avx2<Op, T>(job);
#endif
  run_portable<Op, T>(job);
}

template <class T, class Job>
void run_family(Family family, int64_t k, bool ids, Job& job) {
  if (ids && family != Family::KMax) return run_isa<ArgMaxOfProducts, T>(job);  // viterbi / max_abs + paths
  switch (family) {
    case Family::Real: return run_isa<SumOf<Family::Real>, T>(job);
    case Family::Abs:
    case Family::Log: return run_isa<SumOf<Family::Abs>, T>(job);
    case Family::Count: return run_isa<SumOf<Family::Count>, T>(job);
    case Family::MaxAbs:
    case Family::Viterbi: return run_isa<MaxOfProducts, T>(job);
    case Family::MaxProd: return run_isa<SignedPair, T>(job);
    case Family::Entropy: return run_isa<EntropyPair, T>(job);
    case Family::KMax:
      if (k <= 2) return run_isa<TopProducts<2>, T>(job);
      if (k <= 4) return run_isa<TopProducts<4>, T>(job);
      return run_isa<TopProducts<8>, T>(job);
  }
}

// Entries (row, column) below their threshold, recomputed by the semiring's
// matmul: g_rows (C, F, K) values, w_cols (F, K) their weights.
Tensor exact_products(const Semiring& sr, const Tensor& g_rows, const Tensor& w_cols) {
  return sr.matmul(g_rows.unsqueeze(-2), w_cols.unsqueeze(-1)).reshape({g_rows.size(0), -1});
}

Tensor long_tensor(const std::vector<int64_t>& v, const Tensor& like) {
  return at::tensor(v, like.options().dtype(at::kLong));
}

// ---- the row products alone -------------------------------------------------------

template <class T>
struct RowProductsJob {
  Family family;
  int64_t kmax, C, R, K, N;
  bool ids;
  const T* g;
  int64_t gc, gr, gk;
  const T* w;  // contiguous (R, K, N)
  T* out;      // contiguous (C, R, N)
  std::vector<int64_t> redo;  // r·N + n
  bool declined = false;

  template <class Op, class TT, class V>
  TS_TILE_FN void run() {
    std::vector<T> s(K * Op::kPer), acc(Op::kAcc * N), scratch((Op::kPer + 1) * K);
    std::vector<int64_t> cols;
    RowScalars<T> row{s.data()};
    for (int64_t r = 0; r < R && !declined; ++r) {
      StoredWeights<T> src{w + r * K * N, N};
      if (ids) {  // the ids follow the scores (read only by the winner loops)
        row.ids = g + r * gr + (family == Family::KMax ? kmax : 1) * gc;
        row.id_stride = gk, row.id_plane = gc;
      }
      if (!prepare_row<Op, T, V>(family, kmax, g + r * gr, gc, gk, K, row, scratch.data()) ||
          !row_products<Op, true, true, T, V>(s.data(), src, K, N, acc.data(), N)) {
        declined = true;
        return;
      }
      cols.clear();
      finish_row<Op, T, V>(family, kmax, row, src, K, N, N, acc.data(), out + r * N, R * N, cols);
      for (auto n : cols) redo.push_back(r * N + n);
    }
  }
};

// ---- J = W K by a register tile ---------------------------------------------------
// A block's J (M = rows·D rows × E) = W (M × keys) · K (keys × E), both
// row-major where the pass wrote them. at::mm (MKL's SGEMM) packs W for every
// block before a product only E = 32 wide: 55 µs a block of 512 × 128 · 128 × 32
// at 128 tokens, 576 blocks a MiniLM backward (Zen 3). This tile keeps MR rows ×
// NV vectors of J in accumulators, broadcasts W's entries from its rows and
// loads K's rows as they lie (one FMA a multiply-add, no packing): AVX2, 6 × 2
// vectors of 8 floats, 43 µs, ~49 G multiply-adds/s, Zen 3's FMA peak; AVX-512,
// 12 × 2 vectors of 16 (24 of the 32 registers). Each J[m, e] is summed over
// the keys in order. Taken where the kernels run AVX2 or AVX-512 and E is a
// whole number of vectors (head dims 32, 64, 128 …); elsewhere — other E,
// other ISAs — at::mm. Cost: M·keys·E multiply-adds, as the GEMM's.
#if defined(__x86_64__)
// The tile's vector operations per vector type (each compiled for its ISA;
// flatten in the entry points below inlines them into the loop). Intrinsics,
// not GCC's vector operators: the generic form measured ~4 % slower on
// MiniLM-128's abs with the same FMAs in the tile's loop.
template <class V>
struct JLanes;
#define TS_J_AVX2 __attribute__((target("avx2,fma"))) static inline
#define TS_J_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,fma"))) static inline
#define TS_J_LANES(V, T, FN, setzero, set1, loadu, storeu, fmadd)           \
  template <>                                                              \
  struct JLanes<V> {                                                       \
    FN V zero() { return setzero(); }                                      \
    FN V broadcast(const T* p) { return set1(*p); }                        \
    FN V load(const T* p) { return loadu(p); }                             \
    FN void store(T* p, V v) { storeu(p, v); }                             \
    FN V fma(V a, V b, V c) { return fmadd(a, b, c); }                     \
  };
TS_J_LANES(__m256, float, TS_J_AVX2, _mm256_setzero_ps, _mm256_set1_ps, _mm256_loadu_ps, _mm256_storeu_ps,
           _mm256_fmadd_ps)
TS_J_LANES(__m256d, double, TS_J_AVX2, _mm256_setzero_pd, _mm256_set1_pd, _mm256_loadu_pd, _mm256_storeu_pd,
           _mm256_fmadd_pd)
TS_J_LANES(__m512, float, TS_J_AVX512, _mm512_setzero_ps, _mm512_set1_ps, _mm512_loadu_ps, _mm512_storeu_ps,
           _mm512_fmadd_ps)
TS_J_LANES(__m512d, double, TS_J_AVX512, _mm512_setzero_pd, _mm512_set1_pd, _mm512_loadu_pd, _mm512_storeu_pd,
           _mm512_fmadd_pd)
#undef TS_J_LANES
#undef TS_J_AVX2
#undef TS_J_AVX512

// C[MR × NV vectors] = A[MR × K] · B[K × NV vectors]; A's rows K apart, B's and C's N apart.
template <class T, class V, int MR, int NV>
inline void j_tile(const T* A, int64_t K, const T* B, int64_t N, T* C) {
  using Op = JLanes<V>;
  constexpr int L = sizeof(V) / sizeof(T);
  V acc[MR][NV];
  TS_UNROLL(12) for (int r = 0; r < MR; ++r) TS_UNROLL(2) for (int c = 0; c < NV; ++c) acc[r][c] = Op::zero();
  TS_UNROLL(4) for (int64_t k = 0; k < K; ++k) {  // unrolled: the loop's own ops off the FMA stream
    V b[NV];
    TS_UNROLL(2) for (int c = 0; c < NV; ++c) b[c] = Op::load(B + k * N + c * L);
    TS_UNROLL(12) for (int r = 0; r < MR; ++r) {
      const V a = Op::broadcast(A + r * K + k);
      TS_UNROLL(2) for (int c = 0; c < NV; ++c) acc[r][c] = Op::fma(a, b[c], acc[r][c]);
    }
  }
  TS_UNROLL(12) for (int r = 0; r < MR; ++r) TS_UNROLL(2) for (int c = 0; c < NV; ++c) Op::store(C + r * N + c * L, acc[r][c]);
}

// The strip's last rows (fewer than MR) by the tile of their number.
template <class T, class V, int MR, int NV>
inline void j_tile_rows(int64_t rows, const T* A, int64_t K, const T* B, int64_t N, T* C) {
  if constexpr (MR == 1) {
    j_tile<T, V, 1, NV>(A, K, B, N, C);
  } else {
    if (rows == MR) return j_tile<T, V, MR, NV>(A, K, B, N, C);
    return j_tile_rows<T, V, MR - 1, NV>(rows, A, K, B, N, C);
  }
}

// C (M × N) = A (M × K) · B (K × N), all contiguous, N a multiple of the vector.
// By strips of MR rows (W's strip stays in L1 for every panel of K's columns).
template <class T, class V, int MR>
inline void j_product(const T* A, int64_t M, int64_t K, const T* B, int64_t N, T* C) {
  constexpr int L = sizeof(V) / sizeof(T);
  for (int64_t m = 0; m < M; m += MR) {
    const int64_t rows = std::min<int64_t>(MR, M - m);
    for (int64_t n = 0; n < N; n += 2 * L) {
      if (N - n >= 2 * L) j_tile_rows<T, V, MR, 2>(rows, A + m * K, K, B + n, N, C + m * N + n);
      else j_tile_rows<T, V, MR, 1>(rows, A + m * K, K, B + n, N, C + m * N + n);
    }
  }
}
template <class T>
__attribute__((target("avx2,fma"), flatten)) void j_product_avx2(const T* A, int64_t M, int64_t K, const T* B,
                                                                 int64_t N, T* C) {
  j_product<T, typename std::conditional<sizeof(T) == 4, __m256, __m256d>::type, 6>(A, M, K, B, N, C);
}
template <class T>
__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,fma"), flatten)) void j_product_avx512(
    const T* A, int64_t M, int64_t K, const T* B, int64_t N, T* C) {
  j_product<T, typename std::conditional<sizeof(T) == 4, __m512, __m512d>::type, 12>(A, M, K, B, N, C);
}
#endif

// v (B, Hkv, S, D) as (B, Hkv, D, S), contiguous: the Y pass reads Δ along
// the keys. v arrives as a view of the projection's heads (Hkv·D apart from key
// to key), which ATen's copy gathers element by element (~75 µs for
// MiniLM-128's 12 × 128 × 32, 0.4 % of its abs backward); float with d
// contiguous goes here by 8 × 8 tiles, eight row loads, 24 shuffles and eight
// row stores each. Cost: one read and one write of v, in whole vectors.
#if defined(__x86_64__)
__attribute__((target("avx2"))) void transpose_keys_avx2(const float* v, int64_t key_stride, int64_t S, int64_t D,
                                                         float* out) {
  int64_t s0 = 0;
  for (; s0 + 8 <= S; s0 += 8) {
    int64_t d0 = 0;
    for (; d0 + 8 <= D; d0 += 8) {
      __m256 r[8], t[8], u[8];
      for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(v + (s0 + i) * key_stride + d0);
      for (int i = 0; i < 8; i += 2)  // pairs of keys interleaved: (k, k+1) per d
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
      for (int i = 0; i < 8; i += 4) {  // quads of keys per d, within each 128-bit half
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44), u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44), u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
      }
      for (int i = 0; i < 4; ++i) {  // the eight keys of d0 + i (low halves) and d0 + 4 + i (high halves)
        _mm256_storeu_ps(out + (d0 + i) * S + s0, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
        _mm256_storeu_ps(out + (d0 + i + 4) * S + s0, _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
      }
    }
    for (; d0 < D; ++d0)
      for (int64_t s = s0; s < s0 + 8; ++s) out[d0 * S + s] = v[s * key_stride + d0];
  }
  for (; s0 < S; ++s0)
    for (int64_t d = 0; d < D; ++d) out[d * S + s0] = v[s0 * key_stride + d];
}
#endif
Tensor keys_along_rows(const Tensor& v) {
#if defined(__x86_64__)
  if (v.scalar_type() == at::kFloat && v.device().is_cpu() && v.stride(3) == 1 && kernel_isa() != "portable") {
    const int64_t B = v.size(0), H = v.size(1), S = v.size(2), D = v.size(3);
    auto out = at::empty({B, H, D, S}, v.options());
    const float* src = v.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        transpose_keys_avx2(src + b * v.stride(0) + h * v.stride(1), v.stride(2), S, D, dst + (b * H + h) * D * S);
    return out;
  }
#endif
  return v.transpose(-1, -2).contiguous();
}

// The register tile J's blocks take (decided once per node): 0 none (at::mm), else its vector bytes.
template <class T>
int j_tile_for(int64_t E) {
#if defined(__x86_64__)
  const std::string isa = kernel_isa();
  if (isa == "avx512" && E % (64 / int64_t(sizeof(T))) == 0) return 64;
  if ((isa == "avx512" || isa == "avx2") && E % (32 / int64_t(sizeof(T))) == 0) return 32;
  return 0;
#else
  return 0;
#endif
}

// ---- the fused blocks ------------------------------------------------------------

template <class T>
struct ValueBlocksJob {
  Family family;
  int64_t kmax, C, BH, R, T_, S, D, E;
  bool ids;
  bool causal, need_x, need_q;
  const T* g;   // contiguous (C, BH, R, D)
  const T* vT;  // contiguous (BH, D, S)
  const T* o;   // contiguous (BH, R, D)
  const T* P;   // contiguous (BH, R, S)
  Tensor k;     // contiguous (BH, S, E)
  T* X;         // contiguous (C, BH, R, S)
  T* Q;         // contiguous (C, BH, R, E)
  int64_t block_rows;
  const Semiring* sr;
  Tensor g_tensor, Q_tensor;          // for the exact recomputation of Q entries
  std::vector<int64_t> redo_x;        // (bh·R + r)·S + s: Y recomputed there, then ⊗ lift(P)
  bool declined = false;

  template <class Op, class TT, class V>
  TS_TILE_FN void run() {
    const int64_t Kp = D * Op::kPer;
    std::vector<T> scalars(block_rows * Kp), acc(Op::kAcc * std::max(S, E)), scratch((Op::kPer + 1) * D), log_p(S);
    std::vector<RowScalars<T>> rows(block_rows);
    for (int64_t i = 0; i < block_rows; ++i) rows[i].s = scalars.data() + i * Kp;
    auto W = at::empty({block_rows * D * S}, k.options());
    auto J = at::empty({block_rows * D * E}, k.options());
    std::vector<int64_t> cols, redo_q;
    const int64_t group = R / T_;
    // The GEMM's operands as views made once per shape, not per block: a block's
    // GEMM is ~40 µs at 128 tokens, and the ~7 view ops per block that made
    // them again (narrow, view, select) cost a few µs each.
    Tensor Wb, Jb, kb;
    int64_t view_rows = -1, view_keys = -1, view_bh = -1;
    const int j_tile = j_tile_for<T>(E);
    for (int64_t bh = 0; bh < BH; ++bh)
      for (int64_t member = 0; member < group; ++member)
        for (int64_t t0 = 0; t0 < T_; t0 += block_rows) {
          const int64_t rows_here = std::min(block_rows, T_ - t0);
          const int64_t keys = causal ? std::min(S, t0 + rows_here) : S;
          const int64_t r0 = member * T_ + t0;
          T* Wp = W.data_ptr<T>();
          // Pass 1: the rows' scalars; X = Y ⊗ lift(P) with Δ on the fly, emitting W.
          for (int64_t i = 0; i < rows_here; ++i) {
            const int64_t r = r0 + i;
            const T* g_row = g + (bh * R + r) * D;
            if (ids) {  // the ids follow the scores
              rows[i].ids = g_row + (family == Family::KMax ? kmax : 1) * BH * R * D;
              rows[i].id_plane = BH * R * D;
            }
            if (!prepare_row<Op, T, V>(family, kmax, g_row, BH * R * D, 1, D, rows[i], scratch.data())) {
              declined = true;
              return;
            }
            const T* o_row = o + (bh * R + r) * D;
            const T* p_row = P + (bh * R + r) * S;
            ValueDifferences<T, false> deltas{vT + bh * D * S, S, o_row, p_row, nullptr, 0};
            ValueDifferences<T, true> emitting{vT + bh * D * S, S, o_row, p_row, Wp + i * D * keys, keys};
            if (!need_x) {
              row_products<Op, false, false, T, V>(rows[i].s, emitting, D, keys, acc.data(), S);
              continue;
            }
            if (need_q) row_products<Op, true, false, T, V>(rows[i].s, emitting, D, keys, acc.data(), S);
            else row_products<Op, true, false, T, V>(rows[i].s, deltas, D, keys, acc.data(), S);
            for (int c = 0; c < Op::kAcc; ++c)  // keys after a causal block: the zero
              for (int64_t n = keys; n < S; ++n) acc[c * S + n] = Op::template zero<T>(c);
            T* x_row = X + (bh * R + r) * S;
            cols.clear();
            finish_row<Op, T, V>(family, kmax, rows[i], deltas, D, keys, S, acc.data(), x_row, BH * R * S, cols);
            apply_factor<T, V>(family, kmax, p_row, S, x_row, BH * R * S, log_p.data());
            for (auto n : cols) redo_x.push_back((bh * R + r) * S + n);
          }
          if (!need_q) continue;
          // J = W K for the block's rows: (rows·D × keys) @ (keys × E).
          if (j_tile) {
#if defined(__x86_64__)
            const T* Kp = k.data_ptr<T>() + bh * S * E;
            if (j_tile == 64) j_product_avx512<T>(Wp, rows_here * D, keys, Kp, E, J.data_ptr<T>());
            else j_product_avx2<T>(Wp, rows_here * D, keys, Kp, E, J.data_ptr<T>());
#endif
          } else {
            if (rows_here != view_rows || keys != view_keys) {
              Wb = W.narrow(0, 0, rows_here * D * keys).view({rows_here * D, keys});
              Jb = J.narrow(0, 0, rows_here * D * E).view({rows_here * D, E});
              view_rows = rows_here;
            }
            if (bh != view_bh || keys != view_keys) kb = k[bh].narrow(0, 0, keys), view_bh = bh;
            view_keys = keys;
            at::mm_out(Jb, Wb, kb);
          }
          const T* Jp = J.data_ptr<T>();
          // Pass 2: Q's row products over the block's J.
          redo_q.clear();
          for (int64_t i = 0; i < rows_here; ++i) {
            const int64_t r = r0 + i;
            StoredWeights<T> src{Jp + i * D * E, E};
            if (!row_products<Op, true, false, T, V>(rows[i].s, src, D, E, acc.data(), E)) {
              declined = true;
              return;
            }
            cols.clear();
            finish_row<Op, T, V>(family, kmax, rows[i], src, D, E, E, acc.data(), Q + (bh * R + r) * E,
                             BH * R * E, cols);
            for (auto n : cols) redo_q.push_back(i * E + n);
          }
          if (!redo_q.empty()) {  // while the block's J exists
            auto flat = long_tensor(redo_q, k);
            auto local = flat.div(E, "floor"), cols_e = flat.remainder(E);
            auto Jv = J.narrow(0, 0, rows_here * D * E).view({rows_here, D, E});
            auto g_rows = g_tensor.select(1, bh).index_select(1, local + r0);  // (C, F, D)
            auto exact = exact_products(*sr, g_rows, Jv.index({local, at::indexing::Slice(), cols_e}));
            Q_tensor.select(1, bh).narrow(1, r0, rows_here).view({C, rows_here * E}).index_copy_(1, flat, exact);
          }
        }
  }
};

}  // namespace

Tensor attention_row_products(const Semiring& sr, const Tensor& g, const Tensor& w) {
  Family family;
  int64_t k;
  bool ids;
  if (!family_of(sr, family, k, ids) || !kernel_dtype(g, w) || g.dim() != 3 || w.dim() != 3) return {};
  const int64_t C = g.size(0), R = g.size(1), K = g.size(2), N = w.size(2);
  if (w.size(0) != R || w.size(1) != K || C != sr.components() || R == 0 || K == 0 || N == 0) return {};
  auto weights = w.contiguous();
  auto out = at::empty({C, R, N}, g.options());
  std::vector<int64_t> redo;
  bool declined = false;
  AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "attention_row_products", [&] {
    RowProductsJob<scalar_t> job{family, k, C, R, K, N, ids, g.data_ptr<scalar_t>(), g.stride(0), g.stride(1),
                                 g.stride(2), weights.data_ptr<scalar_t>(), out.data_ptr<scalar_t>()};
    run_family<scalar_t>(family, k, ids, job);
    declined = job.declined;
    redo = std::move(job.redo);
  });
  if (declined) return {};
  count_kernel_call();
  if (!redo.empty()) {
    auto flat = long_tensor(redo, g);
    auto rows = flat.div(N, "floor"), cols = flat.remainder(N);
    auto exact = exact_products(sr, g.index_select(1, rows), weights.index({rows, at::indexing::Slice(), cols}));
    out.view({C, R * N}).index_copy_(1, flat, exact);
  }
  return out;
}

bool attention_value_blocks(const Semiring& sr, const Tensor& g, const Tensor& v, const Tensor& out, const Tensor& P,
                            const Tensor& k, int64_t T, bool causal, bool need_x, bool need_q, int64_t block_elements,
                            Tensor& X, Tensor& Q) {
  Family family;
  int64_t kmax;
  bool ids;
  if (!family_of(sr, family, kmax, ids) || (!need_x && !need_q)) return false;
  if (g.dim() != 5 || v.dim() != 4 || !kernel_dtype(g, v)) return false;
  for (const auto* t : {&out, &P, &k})
    if (t->scalar_type() != g.scalar_type() || !t->device().is_cpu() || (t->requires_grad() && at::GradMode::is_enabled()))
      return false;
  const int64_t C = g.size(0), B = g.size(1), Hkv = g.size(2), R = g.size(3), D = g.size(4);
  const int64_t S = v.size(2), E = k.size(3), BH = B * Hkv;
  if (C != sr.components() || BH == 0 || R == 0 || D == 0 || S == 0 || E == 0 || T <= 0 || R % T != 0) return false;
  // Bounded weights, so the loops need no check per term: |Δ| ≤ max|v| + max|out|,
  // |W| ≤ max P·|Δ| and |J| ≤ S·max|W|·max|k|, all finite.
  const double largest = g.scalar_type() == at::kFloat ? std::numeric_limits<float>::max()
                                                       : std::numeric_limits<double>::max();
  auto peak = [](const Tensor& t) {  // max |t| in one pass without an |t| temporary; NaN propagates (to both)
    auto [low, high] = at::aminmax(t);
    const double lo = low.item<double>(), hi = high.item<double>();
    return std::isnan(lo) ? lo : std::max(-lo, hi);
  };
  // The bounds read the contiguous operands the loops need anyway: aminmax
  // copies a strided input first (v and out arrive as views of the heads).
  auto vT = keys_along_rows(v);
  auto oc = out.contiguous(), Pc = P.contiguous();
  auto kc = k.reshape({BH, S, E}).contiguous();
  const double W_max = (peak(vT) + peak(oc)) * std::max(1.0, peak(Pc));
  if (!(std::isfinite(W_max) && W_max * std::max(1.0, double(S) * peak(kc)) < 0.25 * largest)) return false;
  auto gc = g.contiguous();
  if (need_x) X = at::empty({C, B, Hkv, R, S}, g.options());
  if (need_q) Q = at::empty({C, B, Hkv, R, E}, g.options());
  const int64_t block_rows = std::max<int64_t>(1, std::min<int64_t>(T, block_elements / (D * S)));
  std::vector<int64_t> redo_x;
  bool declined = false;
  AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "attention_value_blocks", [&] {
    ValueBlocksJob<scalar_t> job{family, kmax, C, BH, R, T, S, D, E, ids, causal, need_x, need_q,
                                 gc.data_ptr<scalar_t>(), vT.data_ptr<scalar_t>(), oc.data_ptr<scalar_t>(),
                                 Pc.data_ptr<scalar_t>(), kc,
                                 need_x ? X.data_ptr<scalar_t>() : nullptr, need_q ? Q.data_ptr<scalar_t>() : nullptr,
                                 block_rows, &sr, gc.view({C, BH, R, D}), need_q ? Q.view({C, BH, R, E}) : Tensor()};
    run_family<scalar_t>(family, kmax, ids, job);
    declined = job.declined;
    redo_x = std::move(job.redo_x);
  });
  if (declined) {
    X = Tensor();
    Q = Tensor();
    return false;
  }
  count_kernel_call();
  if (!redo_x.empty()) {  // Y entries near underflow: the semiring's exact product on Δ formed for just those
    auto flat = long_tensor(redo_x, g);
    auto s = flat.remainder(S), row = flat.div(S, "floor");
    auto bh = row.div(R, "floor"), r = row.remainder(R);
    auto delta = vT.view({BH, D, S}).index({bh, at::indexing::Slice(), s}) - oc.view({BH, R, D}).index({bh, r});
    auto g_rows = gc.view({C, BH, R, D}).index({at::indexing::Slice(), bh, r});  // (C, F, D)
    auto exact = sr.otimes_edge(exact_products(sr, g_rows, delta), Pc.view({BH, R, S}).index({bh, r, s}));
    X.view({C, BH * R * S}).index_copy_(1, flat, exact);
  }
  return true;
}

}  // namespace kernels
}  // namespace torch_semiring
