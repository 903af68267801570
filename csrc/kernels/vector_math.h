// exp and log on GCC vector-extension lanes (float or double), for the fused
// CPU kernels (elementwise.cpp, norm_rows.cpp). Written once for any lane
// count; the instruction set comes from the target attribute of the function
// they are inlined into (AVX-512, AVX2 or the baseline), as in
// tile_arithmetic.h.
//
//   vector_exp   full range: overflow → +∞, underflow → 0 (through the
//                subnormals), −∞ → 0, NaN → NaN. ≤ 2 ulp.
//   vector_log   full range: 0 → −∞, +∞ → +∞, x < 0 or NaN → NaN,
//                subnormals rescaled. ≤ 2 ulp.
//   vector_log_normal  positive normal finite lanes only (no special cases;
//                0 gives a finite value) — the hot inner loop of norm_rows.
//   log_by_table float lanes (8 or 16), positive normal finite only, by a
//                16-entry (in 8 lanes an 8-entry) table: ~15 operations
//                instead of 26 (below), 4e-9 relative before rounding.
// Accuracy is checked against torch.exp/torch.log over the whole range,
// special values included (tests/test_elementwise.py).
//
// No include guard and no includes, on purpose: GCC lowers wide-vector code
// in a function compiled for the baseline ISA before inlining it (comparisons
// combined into masks come out scalar), so code for each instruction set must
// be compiled under that set's target — kernels/elementwise.cpp includes this
// file once per set, inside a namespace of its own under
// `#pragma GCC target(...)`. Include <cstdint>, <limits> and kernels/cpu_vectors.h
// first.

namespace vmath {

template <class T, int Bytes>
using Vec = ::torch_semiring::kernels::VecOf<T, Bytes>;  // kernels/cpu_vectors.h

template <class T>
struct Bits;
template <>
struct Bits<float> {
  using type = int32_t;
  static constexpr int kMantissa = 23, kBias = 127;
  static constexpr int32_t kMantissaMask = 0x007fffff, kOne = 0x3f800000, kExpMask = 0xff;
  static constexpr float kTiny = 1.17549435e-38f;  // smallest normal
  static constexpr float kScaleUp = 16777216.0f;   // 2^24: subnormals → normals
  static constexpr int kScaleUpExp = 24;
  static constexpr float kExpHi = 88.72283905206835f, kExpLo = -103.97208f;
  static constexpr int kExpTerms = 7;  // e^r, |r| ≤ ln2/2: r^7/7! < 2^-24 relative
};
template <>
struct Bits<double> {
  using type = int64_t;
  static constexpr int kMantissa = 52, kBias = 1023;
  static constexpr int64_t kMantissaMask = 0x000fffffffffffffLL, kOne = 0x3ff0000000000000LL, kExpMask = 0x7ff;
  static constexpr double kTiny = 2.2250738585072014e-308;
  static constexpr double kScaleUp = 18014398509481984.0;  // 2^54
  static constexpr int kScaleUpExp = 54;
  static constexpr double kExpHi = 709.782712893384, kExpLo = -745.1332191019412;
  static constexpr int kExpTerms = 13;
};

#define TS_VMATH_FN inline __attribute__((always_inline))

// log of positive, normal, finite lanes: x = 2^e·m, m ∈ [√½, √2).
//   float:  log m = f − f²/2 + f³ P(f), f = m − 1, P of degree 8 fitted to
//           relative error (≤ 1.2e-7 in float arithmetic): no division;
//   double: log m = 2 atanh(u) = 2u Σ_k u^{2k}/(2k+1), u = (m − 1)/(m + 1),
//           |u| ≤ 0.172, 11 terms.
template <class T, class V>
TS_VMATH_FN V vector_log_normal(V x) {
  using B = Bits<T>;
  using IV = typename Vec<typename B::type, sizeof(V)>::type;
  IV bits = (IV)x;
  IV e = ((bits >> B::kMantissa) & B::kExpMask) - B::kBias;
  V m = (V)((bits & B::kMantissaMask) | B::kOne);  // [1, 2)
  IV big = m > T(1.4142135623730951);              // −1 where m ≥ √2
  m = big ? m * T(0.5) : m;
  e = e - big;
  V log_m;
  if constexpr (sizeof(T) == 4) {
    constexpr float P[] = {0.33333311f, -0.25000014f, 0.20002202f, -0.16667784f, 0.14218026f,
                           -0.12408933f, 0.11901551f, -0.11658812f, 0.06696866f};
    const V f = m - T(1), f2 = f * f, f4 = f2 * f2;
    // Estrin's scheme: a dependency chain of 4 steps instead of Horner's 8
    const V p01 = P[0] + P[1] * f, p23 = P[2] + P[3] * f, p45 = P[4] + P[5] * f, p67 = P[6] + P[7] * f;
    const V p = (p01 + p23 * f2) + (p45 + p67 * f2) * f4 + P[8] * (f4 * f4);
    log_m = f - T(0.5) * f2 + f2 * f * p;
  } else {
    const V u = (m - T(1)) / (m + T(1)), s = u * u;
    V series = V{} + T(1) / T(21);
#pragma GCC unroll 16
    for (int k = 9; k >= 0; --k) series = series * s + T(1) / T(2 * k + 1);
    log_m = T(2) * u * series;
  }
  // ln 2 split so that e·ln2_hi is exact: the sum keeps log's relative accuracy near 1
  const V ef = __builtin_convertvector(e, V);
  return ef * T(0.693145751953125) + (log_m + ef * T(1.4286068203094173e-06));
}

template <class T, class V>
TS_VMATH_FN V vector_log(V x) {
  using B = Bits<T>;
  using IV = typename Vec<typename B::type, sizeof(V)>::type;
  const IV subnormal = (x < B::kTiny) & (x > T(0));
  const V scaled = subnormal ? x * B::kScaleUp : x;
  V r = vector_log_normal<T, V>(scaled);
  r = subnormal ? r - T(B::kScaleUpExp) * T(0.6931471805599453) : r;
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  r = x == T(0) ? V{} - inf : r;
  r = x == inf ? V{} + inf : r;
  return (x < T(0)) | (x != x) ? V{} + nan : r;
}

// Σ_{k ≤ K} r^k/k! (K = Bits<T>::kExpTerms: 7 or 13) by Estrin's scheme: a
// dependency chain of ~5 multiply-adds instead of Horner's 2K operations — in
// the fused ⊕ loops (an exp and a log per element, ~160 instructions) the
// chain, not the instruction count, had bounded the loop (one instruction a cycle).
template <class T, class V>
TS_VMATH_FN V exp_series(V r) {
  constexpr int K = Bits<T>::kExpTerms;
  constexpr int N = (K + 2) / 2;  // pairs c_{2j} + c_{2j+1}·r
  T c[2 * N] = {};
  double f = 1;
#pragma GCC unroll 16
  for (int k = 0; k <= K; ++k) f = k ? f * k : 1, c[k] = T(1 / f);
  V level[N];
#pragma GCC unroll 16
  for (int j = 0; j < N; ++j) level[j] = c[2 * j] + c[2 * j + 1] * r;
  V power = r * r;
#pragma GCC unroll 4
  for (int width = N; width > 1; width = (width + 1) / 2) {  // fold pairs: level[j] = level[2j] + r^(2^m)·level[2j+1]
#pragma GCC unroll 8
    for (int j = 0; j < width / 2; ++j) level[j] = level[2 * j] + power * level[2 * j + 1];
    if (width % 2) level[width / 2] = level[width - 1];
    power = power * power;
  }
  return level[0];
}

// e^x = 2^n e^r with n = round(x / ln2), r = x − n ln2 (|r| ≤ ln2/2, ln2 in two
// parts), e^r by its Taylor series (exp_series); 2^n built in the exponent bits, in two
// halves so that the subnormal range is reached.
template <class T, class V>
TS_VMATH_FN V vector_exp(V x) {
  using B = Bits<T>;
  using I = typename B::type;
  using IV = typename Vec<I, sizeof(V)>::type;
  const V clamped = x > B::kExpHi ? V{} + B::kExpHi : (x < B::kExpLo ? V{} + B::kExpLo : x);
  const V nf = __builtin_convertvector(__builtin_convertvector(clamped * T(1.4426950408889634) +
                                                                   (clamped < T(0) ? T(-0.5) : T(0.5)),
                                                               IV),
                                       V);  // round half away from zero
  const V r = (clamped - nf * T(0.693145751953125)) - nf * T(1.4286068203094173e-06);
  const V p = exp_series<T, V>(r);
  const IV n = __builtin_convertvector(nf, IV);
  const IV half = n >> 1;
  const V s1 = (V)((half + B::kBias) << B::kMantissa), s2 = (V)((n - half + B::kBias) << B::kMantissa);
  V y = p * s1 * s2;
  const T inf = std::numeric_limits<T>::infinity();
  y = x > B::kExpHi ? V{} + inf : y;
  y = x < B::kExpLo ? V{} : y;
  return x != x ? x : y;
}

// log_by_table: log of positive normal float lanes (8 or 16 of them) by a
// 16-entry table (8 lanes: an 8-entry one, below), for the per-pair and per-term logarithms of norm_rows' φ
// pass and the attention kernel's entropy (in the graph's precision):
// z = 2^-k·a brought into [0.6875, 1.375) (the offset below), the 4 bits
// after it pick a subinterval with centre c,
// and log a = k·ln2 + log c + log1p(r), r = z/c − 1, with 1/c and −log(1/c)
// from the table (1/c rounded to float first, so that r = z·(1/c) − 1 is the
// argument of log1p exactly, up to one rounding). The two subintervals around
// 1 take c = 1: near a = 1 the result is r + r²·P(r) itself, so it keeps its
// relative accuracy there. r ∈ [−1/32, 1/16] (16 entries) or [−1/16, 1/8]
// (8), where log1p(r) ≈ r + r²·P(r), P of degree 3 or 4 fitted for the least
// largest relative error (Lawson-weighted least squares on 4 000 Chebyshev
// nodes, coefficients then rounded to float): 3.7e-9 / 3.6e-9 relative with
// the float coefficients (a Taylor series needs two more terms for that).
// k·ln2 is one multiply-add with ln2 rounded to float: its error, 1.9e-9·|k|,
// is below 6e-9 of |log a| (≥ 0.318 where k ≠ 0), so the two-part ln2 of
// vector_log_normal buys nothing here. The pass is bound by its
// multiply-adds (two pipes of Zen 3's four): one permute per table where a
// vector holds 16 or 8 floats (AVX-512, AVX2), and 8 (AVX2) or 7 (AVX-512)
// multiplies or multiply-adds, against 11 / 9 with the Taylor series and a
// two-part ln2, and 26 operations in vmath::vector_log_normal's degree-11
// polynomial. Entries:
// c = the centre of [0.6875 + i/32, …) below 1, of [1 + (i − 10)/16, …)
// above; inv = float(1/c), logc = float(−log(double(inv))).
alignas(64) constexpr float kLogInvC[16] = {
    1.4222222566604614f, 1.3617020845413208f, 1.3061224222183228f, 1.2549020051956177f,
    1.2075471878051758f, 1.163636326789856f,  1.1228070259094238f, 1.0847457647323608f,
    1.049180269241333f,  1.0f,                1.0f,                0.9142857193946838f,
    0.8648648858070374f, 0.8205128312110901f, 0.7804877758026123f, 0.7441860437393188f};
alignas(64) constexpr float kLogC[16] = {
    -0.3522206246852875f, -0.3087354600429535f, -0.2670627534389496f, -0.22705748677253723f,
    -0.18859118223190308f, -0.15154986083507538f, -0.11583182215690613f, -0.08134564012289047f,
    -0.04800916463136673f, 0.0f, 0.0f, 0.08961215615272522f,
    0.14518198370933533f, 0.19782572984695435f, 0.24783620238304138f, 0.2954642176628113f};
// With 8 lanes (AVX2) a permute reaches 8 entries only (16 took two and a
// blend per table): 8 subintervals, 1/16 wide below 1 and 1/8 above, the two
// around 1 again with c = 1; r ∈ [−1/16, 1/8), so P takes one degree more
// — one multiply-add more, four permutes and blends fewer.
alignas(32) constexpr float kLogInvC8[8] = {1.39130437374115f, 1.2799999713897705f, 1.185185194015503f,
                                            1.1034482717514038f, 1.0f, 1.0f, 0.8421052694320679f,
                                            0.761904776096344f};
alignas(32) constexpr float kLogC8[8] = {-0.33024170994758606f, -0.2468600571155548f, -0.16989904642105103f,
                                         -0.09844006597995758f, 0.0f, 0.0f, 0.17185024917125702f,
                                         0.2719337046146393f};
template <class V, class IV>
TS_VMATH_FN V lookup(const float* table, IV idx) {  // table[idx], one entry per lane: a single permute
  V t;
  std::memcpy(&t, table, sizeof(V));
  return __builtin_shuffle(t, idx);
}
template <class V>
TS_VMATH_FN V log_by_table(V a) {
  using IV = typename Vec<int32_t, sizeof(V)>::type;
  constexpr int L = sizeof(V) / sizeof(float);
  static_assert(L == 16 || L == 8, "a table per permute needs 8 or 16 float lanes");
  const float* inv_c = L == 16 ? kLogInvC : kLogInvC8;
  const float* log_c = L == 16 ? kLogC : kLogC8;
  const IV bits = (IV)a;
  const IV shifted = bits - 0x3f300000;  // 0.6875: 1.0 starts subinterval 10 of 16 (5 of 8)
  const IV k = shifted >> 23;
  const V z = (V)(bits - (shifted & int32_t(0xff800000)));
  // (No "& (L − 1)": a shuffle's mask counts modulo L, as vpermps reads only its low bits.)
  const IV idx = shifted >> (L == 16 ? 19 : 20);
  const V r = z * lookup<V>(inv_c, idx) - 1.0f;
  const V r2 = r * r;
  V P;  // by pairs (Estrin): a shorter chain than Horner's
  if constexpr (L == 16) {
    P = (-0.5f + r * 0.333344519f) + r2 * (-0.250061065f + r * 0.188460365f);
  } else {
    P = (-0.499999851f + r * 0.333334863f) + r2 * ((-0.250122666f + r * 0.200017199f) + r2 * -0.144312084f);
  }
  const V kf = __builtin_convertvector(k, V);
  return kf * 0.693147182f + (lookup<V>(log_c, idx) + (r + r2 * P));
}

#undef TS_VMATH_FN
}  // namespace vmath
