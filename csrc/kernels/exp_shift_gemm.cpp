// Log-sum-exp and entropy semiring products as ordinary GEMMs (MKL through
// at::matmul), by shifting into linear space. For a block of the contraction
// dim,
//
//   logsumexp_k(a_mk + log|w_kn|) = s_m + t_n + log Σ_k P_mk Q_kn,
//   P = e^{a − s} (s_m = max_k a_mk),  Q = |w|·e^{−t} (t_n = max_k log|w_kn|)
//
// Every factor is ≤ 1, so nothing overflows; a sum loses accuracy only when
// the entry's largest term is far below s_m + t_n (a row spanning ~87 (float)
// or ~708 (double) in log space), through terms that underflow.
//
// Three stages, each only where the previous one is not provably accurate:
//   1. one block (the whole of k): one GEMM, ~1.3× an SGEMM;
//   2. if many entries are suspect: blocks of 64 along k, each with its own
//      row/column shifts, merged per entry in log space (FlashAttention-style),
//      which shrinks the range a single shift must cover;
//   3. the entries still suspect: an exact logsumexp over k, in the dtype.
// "Suspect" comes from a bound, not a guess: each of a block's kb terms loses
// at most `tiny` (FLT_MIN / DBL_MIN, also under flush-to-zero) to underflow,
// so an entry is accurate when Σ_blocks e^{s+t}·kb·tiny ≤ (eps/4)·(its value).
// Rows or columns with no finite entry contribute exactly nothing.
//
// Entropy pairs (ℓ, h) use the same factors: per block, Z = P@Q,
// A = (P∘h)@Q and B = P@(Q∘log|w|) (0 where w = 0) give
//   ℓ = s + t + log Z,   h = (A − B)/Z
// (the softmax(ℓ + log|w|)-weighted mean of h − log|w|), merged across blocks
// with the blocks' softmax weights; stage 3 recomputes both exactly.
//
// Stage 1, which nearly every product ends in, is organised to cost the
// GEMMs plus a few passes over g and the output, never over w:
//   per weight — t, the suspect thresholds per column, Q and, for entropy,
//     QL = Q∘log|w| — made once per weight version and kept in the lift
//     cache (lift_cache.h) when w is a saved leaf operand;
//   per call — s (a max over each row of ℓ), P = e^{ℓ−s}; for entropy P and
//     P∘h stacked like the output's two components, so that ONE GEMM call
//     [P; P∘h]·Q gives Z and A (Q packed once for both; a batched w — the
//     attention's P — one bmm per component instead, as at::matmul would
//     copy Q per component), and B is subtracted
//     in place by a second (A −= P·QL, beta = 1): the three-GEMM floor of
//     entropy in two calls, written straight into the output; then one pass
//     over the output for h = (A − B)/Z and the suspect test
//     (Z < kb·tiny·4/eps), log Z in place, one pass adding s + t.
// The range checks ride along instead of costing passes and host reads: NaN
// or +∞ in ℓ shows up in s (a max over the row), in w in t (checked once per
// weight version), a non-finite h in P∘h (P ∈ [0, 1], so P∘h is finite iff h
// is). Any of them → the product declines to the generic path.
// Cost per call with a cached weight: log 1 GEMM + 2 passes over M·K (max;
// P = e^{a − s}, one vectorised pass: exp_shift_rows) + 2 over M·N (suspect
// count; log Z + s + t in one pass: log_add_shifts); entropy 3 GEMMs' work in
// 2 calls + the same 2 passes over M·K (the second also writes P∘h and checks
// it is finite) + the same 2 over M·N (the second also makes h = (A − B)/Z). Measured at 64 tokens (Llama
// shapes): log ~1.2×, entropy ~3.0–3.4× an SGEMM of the same shape.
// Uncached (w an activation), add 3 passes over K·N for the factors (|w|, its
// column maxima, one fused pass dividing and, for entropy, taking
// Q∘log|w|: divide_columns_and_log). A transposed g (the
// attention's Xᵀ) keeps its layout in P and P∘h, so their passes run along
// memory and the GEMM reads them transposed.
#include "kernels/cpu_gemm.h"
#include "kernels/device_gemm.h"
#include "kernels/elementwise.h"  // the row passes
#include "kernels/lift_cache.h"

#include <atomic>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

namespace torch_semiring {
namespace kernels {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kSmallBlock = 64;

// What the stages did, for tests and benchmarks (see exp_shift_stats).
std::atomic<int64_t> small_block_runs{0}, exact_entries{0};

// log(e^x + e^y) where either may be −∞ (at::logaddexp gives NaN for −∞, −∞).
Tensor log_add(const Tensor& x, const Tensor& y) {
  auto m = at::maximum(x, y);
  auto m0 = at::where(m.eq(-kInf), 0.0, m);
  return m0 + ((x - m0).exp() + (y - m0).exp()).log();
}

// Stage 2: the product over k in blocks of `block`, merged in log space.
// a: (…, M, K) log-values, h: the entropy's h (…, M, K) or undefined,
// lw: log|w| (…, K, N). Returns ℓ (…, M, N), h (or undefined), and the
// suspect mask.
struct Blocked {
  Tensor l, h, suspect;
};

Blocked blocked_product(const Tensor& a, const Tensor& h, const Tensor& lw, int64_t block) {
  const int64_t K = a.size(-1);
  const bool single = a.scalar_type() == at::kFloat;
  const double tiny = single ? std::numeric_limits<float>::min() : std::numeric_limits<double>::min();
  const double eps = single ? std::numeric_limits<float>::epsilon() : std::numeric_limits<double>::epsilon();
  Blocked out;
  Tensor lost;  // log of the largest block's bound on mass lost to underflow
  for (int64_t k0 = 0; k0 < K; k0 += block) {
    const int64_t kb = std::min(block, K - k0);
    auto ab = a.narrow(-1, k0, kb), lb = lw.narrow(-2, k0, kb);
    auto s = ab.amax(-1, /*keepdim=*/true), t = lb.amax(-2, /*keepdim=*/true);
    auto live = s.gt(-kInf).logical_and(t.gt(-kInf));  // (…, M, N): some term may exist
    auto o = at::where(s.eq(-kInf), 0.0, s) + at::where(t.eq(-kInf), 0.0, t);  // the shift s + t
    auto P = (ab - at::where(s.eq(-kInf), 0.0, s)).exp_();
    auto Q = (lb - at::where(t.eq(-kInf), 0.0, t)).exp_();  // |w|e^{−t}, 0 where w = 0
    auto Z = at::matmul(P, Q);
    auto l = o + Z.log();  // −∞ where no term survived
    auto bound = at::where(live, o + std::log(double(kb) * tiny), -kInf);
    Tensor hb;
    if (h.defined()) {
      auto A = at::matmul(P * h.narrow(-1, k0, kb), Q);
      auto B = at::matmul(P, at::where(Q.eq(0), 0.0, Q * lb));  // 0·(−∞) where there is no edge
      hb = at::where(Z.eq(0), 0.0, (A - B).div_(Z));
    }
    if (k0 == 0) {
      out.l = l, out.h = hb, lost = bound;
      continue;
    }
    auto merged = log_add(out.l, l);
    if (h.defined()) {  // softmax weights of the two parts in the merged total
      auto m0 = at::where(merged.eq(-kInf), 0.0, merged);
      out.h = (out.l - m0).exp() * out.h + (l - m0).exp() * hb;
    }
    out.l = merged;
    lost = at::maximum(lost, bound);  // Σ_b ≤ (number of blocks)·max_b: one pass, not a logaddexp
  }
  const double blocks = double((K + block - 1) / block);
  out.suspect = (lost + std::log(blocks)).gt(out.l + std::log(eps / 4));
  return out;
}

// Stage 3: exact recomputation of the entries in `mask`: (nb, K) rows of a and
// columns of log|w| gathered per entry, logsumexp over k; chunked so no
// temporary exceeds ~4M elements. Writes into l (and h) in place.
void recompute_exact(const Tensor& a, const Tensor& h, const Tensor& lw, const Tensor& mask, Tensor& l_out,
                     Tensor& h_out) {
  const int64_t M = a.size(-2), K = a.size(-1), N = lw.size(-1);
  auto rows = a.reshape({-1, M, K}).reshape({-1, K});
  auto h_rows = h.defined() ? h.reshape({-1, M, K}).reshape({-1, K}) : Tensor();
  auto cols = lw.reshape({-1, K, N}).transpose(1, 2).reshape({-1, K});
  auto where = mask.reshape({-1}).nonzero().squeeze(1);  // flat index into (B, M, N)
  auto b = where.div(M * N, "floor"), mn = where.remainder(M * N);
  auto row = b * M + mn.div(N, "floor"), col = b * N + mn.remainder(N);
  auto flat_l = l_out.view({-1});
  auto flat_h = h_out.defined() ? h_out.view({-1}) : Tensor();
  const int64_t nb = where.size(0);
  const int64_t chunk = std::max<int64_t>(1, (int64_t(1) << 22) / std::max<int64_t>(K, 1));
  for (int64_t i = 0; i < nb; i += chunk) {
    const int64_t c = std::min(chunk, nb - i);
    auto ri = row.narrow(0, i, c), ci = col.narrow(0, i, c), idx = where.narrow(0, i, c);
    auto lwc = cols.index_select(0, ci);
    auto x = rows.index_select(0, ri) + lwc;  // every term of each entry
    auto total = at::logsumexp(x, {1}, /*keepdim=*/true);
    flat_l.index_put_({idx}, total.squeeze(1));
    if (h.defined()) {
      auto none = x.eq(-kInf);
      auto p = at::where(none, 0.0, (x - at::where(total.eq(-kInf), 0.0, total)).exp());
      auto hv = at::where(none, 0.0, h_rows.index_select(0, ri) - lwc);
      flat_h.index_put_({idx}, (p * hv).sum(1));
    }
  }
}

// ---- stage 1 ----------------------------------------------------------------

// The suspect count of stage 1 over rows of the output, compiled with -O3
// and cloned for AVX-512 / AVX2 / baseline (picked at load time) so that it
// vectorises: the build's -O2 would leave it scalar. (h's division, written
// here the same way, stayed scalar — GCC does not vectorise a division under
// a condition — and took ~1 % of a MiniLM-128 entropy backward in perf: it
// now rides in log_add_shifts' vector pass.)
#pragma GCC push_options
#pragma GCC optimize("O3")
#define TS_ELEMENTWISE TS_CPU_CLONES

// How many z[n] < threshold[n].
template <class T>
inline __attribute__((always_inline)) int64_t count_below_impl(const T* z, const T* threshold, int64_t n) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) count += z[i] < threshold[i];
  return count;
}

TS_ELEMENTWISE int64_t count_below(const float* z, const float* t, int64_t n) { return count_below_impl(z, t, n); }
TS_ELEMENTWISE int64_t count_below(const double* z, const double* t, int64_t n) { return count_below_impl(z, t, n); }

#undef TS_ELEMENTWISE
#pragma GCC pop_options

// The per-weight factors of stage 1 (w: (…, K, N)), all made once per weight
// version when w is cached:
//   0: t, the column shifts log max_k |w| (…, 1, N), clamped to the lowest
//      finite value (a column without edges: Q = 0 there);
//   1: the suspect threshold per column (…, 1, N): K·tiny·4/eps, or −∞ for a
//      column without edges (nothing to lose there);
//   2: Q = |w|e^{−t} = |w| / max_k |w| (…, K, N), by a division (correctly
//      rounded, where e^{log|w| − t} carried log's error times |log|w| − t|);
//   3: for entropy, QL = Q∘log|w| (0 where Q = 0: no edge, or lost to underflow).
// Empty when w is not finite (NaN or +∞ in max_k |w|): the product declines.
// Cost: |w|, its column maxima and one fused pass (entropy: + a log pass) —
// for the attention's P, an activation prepared on every call, this replaced
// ~10 ATen passes and their temporaries (~1.5 ms a node at 128 tokens).
Prepared weight_factors(const Tensor& w, bool entropy) {
  const bool single = w.scalar_type() == at::kFloat;
  const double lowest = single ? double(std::numeric_limits<float>::lowest()) : std::numeric_limits<double>::lowest();
  const double tiny = single ? std::numeric_limits<float>::min() : std::numeric_limits<double>::min();
  const double eps = single ? std::numeric_limits<float>::epsilon() : std::numeric_limits<double>::epsilon();
  auto Q = at::empty(w.sizes(), w.options());  // |w| first, then Q in place
  at::abs_out(Q, w);
  auto m = Q.amax(-2, /*keepdim=*/true);  // NaN propagates
  if (!m.lt(kInf).all().item<bool>()) return {};
  auto t = m.log();
  auto threshold = at::full_like(t, double(w.size(-2)) * tiny * 4 / eps).masked_fill_(m.eq(0), -kInf);
  t.clamp_min_(lowest);
  Tensor QL = entropy ? at::empty_like(Q) : Tensor();
  const int64_t K = w.size(-2), N = w.size(-1);
  AT_DISPATCH_FLOATING_TYPES(w.scalar_type(), "exp_shift weight factors", [&] {
    divide_columns_and_log<scalar_t>(Q.data_ptr<scalar_t>(), entropy ? QL.data_ptr<scalar_t>() : nullptr,
                                     m.data_ptr<scalar_t>(), K, Q.numel() / std::max<int64_t>(N, 1), N);
  });
  if (!entropy) return {t, threshold, Q};
  return {t, threshold, Q, QL};
}

Prepared factors_of(const Tensor& w, bool entropy) {
  return prepared_weight(w, entropy ? "exp_shift: t, threshold, Q, Q log|w|" : "exp_shift: t, threshold, Q",
                         [entropy](const Tensor& x) { return weight_factors(x, entropy); });
}

// s := max(s, lowest) in place, row_live := s > −∞; false if s holds NaN or
// +∞ (ℓ had one in that row). s: contiguous (B·M), a few hundred values.
template <class T>
bool clamp_row_shifts(Tensor& s, std::vector<char>& row_live) {
  const T lowest = std::numeric_limits<T>::lowest();
  T* p = s.data_ptr<T>();
  row_live.resize(s.numel());
  bool bad = false;
  for (int64_t i = 0, n = s.numel(); i < n; ++i) {
    const T v = p[i];
    bad |= !(v < std::numeric_limits<T>::infinity());
    row_live[i] = v > -std::numeric_limits<T>::infinity();
    p[i] = v > lowest ? v : lowest;
  }
  return !bad;
}

// The three stages for log (h undefined) or entropy. a, h: (…, M, K) (batch
// dims broadcast); w: (…, K, N) as given; out_shape (C, …, M, N). Undefined
// when the inputs are outside what the shifts reproduce exactly.
template <class T>
Tensor exp_shift_product(const Tensor& a, const Tensor& h, const Tensor& w, const std::vector<int64_t>& out_shape) {
  const bool entropy = h.defined();
  auto factors = factors_of(w, entropy);
  if (factors.empty()) return {};
  const int64_t M = a.size(-2), K = a.size(-1), N = w.size(-1);
  auto opts = a.options();

  auto s = a.amax(-1, /*keepdim=*/true);  // (…, M, 1), contiguous
  std::vector<char> row_live;
  if (!clamp_row_shifts<T>(s, row_live)) return {};

  // P = e^{a − s} and, for entropy, P∘h, stacked like the output's (ℓ, h)
  // (see below), in one pass (exp_shift_rows) in a's memory order: a
  // transposed a (the attention's k edge: g = Xᵀ) gets a transposed PS, so
  // the pass runs along memory, not across it (5× slower), and the GEMM reads
  // PS transposed (MKL's transA, no copy). Any other layout (a broadcast
  // batch) is made contiguous first.
  Tensor ac = a, hc = h;
  bool transposed = a.dim() >= 2 && a.stride(-1) != 1 && a.stride(-2) == 1;
  if (!(transposed ? a.transpose(-1, -2).is_contiguous() : a.is_contiguous()) ||
      (entropy && h.strides() != a.strides())) {
    ac = a.contiguous(), hc = entropy ? h.contiguous() : h, transposed = false;
  }
  auto shape = a.sizes().vec();
  shape.insert(shape.begin(), entropy ? 2 : 1);
  if (transposed) std::swap(shape[shape.size() - 1], shape[shape.size() - 2]);
  auto PS = transposed ? at::empty(shape, opts).transpose(-1, -2) : at::empty(shape, opts);
  auto P = PS.select(0, 0), Ph = entropy ? PS.select(0, 1) : Tensor();
  const int64_t along = transposed ? M : K;  // a row in memory
  // P ∈ [0, 1]: P∘h is finite iff h is.
  if (!exp_shift_rows<T>(ac.data_ptr<T>(), entropy ? hc.data_ptr<T>() : nullptr, s.data_ptr<T>(),
                         transposed ? K : 0, P.data_ptr<T>(), entropy ? Ph.data_ptr<T>() : nullptr,
                         a.numel() / std::max<int64_t>(along, 1), along))
    return {};

  auto out = at::empty(out_shape, opts);
  auto l = out.select(0, 0);
  const Tensor& Q = factors[2];
  Tensor D;
  if (entropy) {
    // [P; P∘h]: one GEMM call gives Z and A = (P∘h)·Q (for a 2-D w a single
    // (2·M × K)·(K × N) product, Q packed once), then A −= P·(Q∘log|w|)
    // accumulates in place.
    D = out.select(0, 1);
    if (Q.dim() == 2 && !transposed) {
      at::matmul_out(out, PS, Q);
    } else {  // a batched w (the attention's P): one product per component, as at::matmul would
      at::matmul_out(l, P, Q);  // broadcast Q over the component dim by a copy (4× the two GEMMs' time there)
      at::matmul_out(D, Ph, Q);
    }
    const Tensor& QL = factors[3];
    if (QL.dim() == 2) {
      auto D2 = D.view({-1, N});
      D2.addmm_(P.reshape({-1, K}), QL, /*beta=*/1, /*alpha=*/-1);
    } else {
      D.sub_(at::matmul(P, QL));
    }
  } else {
    at::matmul_out(l, P, Q);
  }

  // Row by row over the flat (B, M, N) output; the per-column factors
  // broadcast to (B, N) (for a 2-D w: used as they are).
  std::vector<int64_t> batch(out_shape.begin() + 1, out_shape.end() - 2);
  std::vector<int64_t> column_shape(batch);
  column_shape.push_back(1), column_shape.push_back(N);
  auto t = factors[0].expand(column_shape).contiguous();
  auto threshold = factors[1].expand(column_shape).contiguous();
  const int64_t rows = l.numel() / N;
  T* z = l.data_ptr<T>();
  T* d = entropy ? D.data_ptr<T>() : nullptr;
  const T* sp = s.data_ptr<T>();
  const T* tp = t.data_ptr<T>();
  const T* thr = threshold.data_ptr<T>();
  int64_t n_suspect = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t column_row = r / M * N;  // the batch entry's column factors
    if (row_live[r]) n_suspect += count_below(z + r * N, thr + column_row, N);
  }
  Tensor suspect;
  if (n_suspect > 0) {  // where, before Z becomes log Z
    suspect = at::zeros(l.sizes(), opts.dtype(at::kBool));
    bool* mask = suspect.data_ptr<bool>();
    for (int64_t r = 0; r < rows; ++r) {
      if (!row_live[r]) continue;
      const T* zr = z + r * N;
      const T* tr = thr + r / M * N;
      for (int64_t n = 0; n < N; ++n) mask[r * N + n] = zr[n] < tr[n];
    }
  }
  log_add_shifts<T>(z, d, sp, tp, M, rows, N);  // and h = (A − B)/Z

  if (n_suspect == 0) return out;
  // Stages 2 and 3 need log|w| itself (and the operands broadcast).
  std::vector<int64_t> w_shape(batch);
  w_shape.push_back(K), w_shape.push_back(N);
  auto lw = w.expand(w_shape).abs().log_();
  Tensor l_out = l, h_out = entropy ? D : Tensor();
  // Stage 2 pays when exact recomputation of the suspects (K terms each)
  // would cost more than ~1/64 of the whole product.
  if (K > kSmallBlock && n_suspect > std::max<int64_t>(64, l.numel() / kSmallBlock)) {
    auto r = blocked_product(a, h, lw, kSmallBlock);
    l_out.copy_(r.l);
    if (entropy) h_out.copy_(r.h);
    suspect = r.suspect;
    n_suspect = r.suspect.sum().item<int64_t>();
    small_block_runs.fetch_add(1, std::memory_order_relaxed);
  }
  if (n_suspect > 0) {
    recompute_exact(a, h, lw, suspect, l_out, h_out);
    exact_entries.fetch_add(n_suspect, std::memory_order_relaxed);
  }
  return out;
}

// Shapes and dtypes the shifts apply to (value ranges are checked on the way,
// see above); undefined → the generic path.
Tensor exp_shift_matmul(const Tensor& g, const Tensor& w, int64_t components) {
  BatchedOperands ops;
  if (!kernel_dtype(g, w) || g.size(0) != components || !broadcast_operands(g, w, ops)) return {};
  for (auto s : ops.out_shape) if (s == 0) return {};
  if (ops.g.size(-1) == 0) return {};
  auto a = ops.g.select(0, 0), h = components == 2 ? ops.g.select(0, 1) : Tensor();
  auto out = g.scalar_type() == at::kFloat ? exp_shift_product<float>(a, h, w, ops.out_shape)
                                           : exp_shift_product<double>(a, h, w, ops.out_shape);
  if (out.defined()) count_kernel_call();
  return out;
}

}  // namespace

std::pair<int64_t, int64_t> exp_shift_stats() { return {small_block_runs.load(), exact_entries.load()}; }

Tensor log_matmul(const Tensor& g, const Tensor& w) {
  return device::routes(g, w) ? device::exp_shift_matmul(false, g, w) : exp_shift_matmul(g, w, 1);
}
Tensor entropy_matmul(const Tensor& g, const Tensor& w) {
  return device::routes(g, w) ? device::exp_shift_matmul(true, g, w) : exp_shift_matmul(g, w, 2);
}

}  // namespace kernels
}  // namespace torch_semiring
