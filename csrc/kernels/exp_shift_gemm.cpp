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
#include "kernels/cpu_gemm.h"

#include <atomic>
#include <cmath>
#include <limits>

namespace torch_semiring {
namespace kernels {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kSmallBlock = 64;

// What the stages did, for tests and benchmarks (see exp_shift_stats).
std::atomic<int64_t> small_block_runs{0}, exact_entries{0};

bool finite(std::pair<double, double> r) { return std::isfinite(r.first) && std::isfinite(r.second); }

// log(e^x + e^y) where either may be −∞ (at::logaddexp gives NaN for −∞, −∞).
Tensor log_add(const Tensor& x, const Tensor& y) {
  auto m = at::maximum(x, y);
  auto m0 = at::where(m.eq(-kInf), 0.0, m);
  return m0 + ((x - m0).exp() + (y - m0).exp()).log();
}

// The product over k in blocks of `block`, merged in log space.
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

// Exact recomputation of the entries in `mask`: (nb, K) rows of a and columns
// of log|w| gathered per entry, logsumexp over k; chunked so no temporary
// exceeds ~4M elements. Writes into l (and h) in place.
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

// The three stages for log (h undefined) or entropy.
std::pair<Tensor, Tensor> exp_shift_product(const Tensor& a, const Tensor& h, const Tensor& w) {
  count_kernel_call();
  const int64_t K = a.size(-1);
  auto lw = w.abs().log();
  auto r = blocked_product(a, h, lw, K);
  int64_t n_suspect = r.suspect.sum().item<int64_t>();
  // Stage 2 pays when exact recomputation of the suspects (K terms each)
  // would cost more than ~1/64 of the whole product.
  if (K > kSmallBlock && n_suspect > std::max<int64_t>(64, r.l.numel() / kSmallBlock)) {
    r = blocked_product(a, h, lw, kSmallBlock);
    n_suspect = r.suspect.sum().item<int64_t>();
    small_block_runs.fetch_add(1, std::memory_order_relaxed);
  }
  if (n_suspect > 0) {
    recompute_exact(a, h, lw, r.suspect, r.l, r.h);
    exact_entries.fetch_add(n_suspect, std::memory_order_relaxed);
  }
  return {r.l, r.h};
}

// Shapes, dtypes and value ranges the shifts are exact on; undefined → the
// generic path. Infinite w, NaN anywhere or +∞ in ℓ would make the generic
// arithmetic itself produce NaN/∞, which the shifted form would not reproduce.
bool prepare(const Tensor& g, const Tensor& w, int64_t components, BatchedOperands& ops) {
  if (!kernel_dtype(g, w) || g.size(0) != components || !broadcast_operands(g, w, ops)) return false;
  for (auto s : ops.out_shape) if (s == 0) return false;
  if (ops.g.size(-1) == 0 || !finite(range_of(ops.w))) return false;
  if (!(range_of(ops.g.select(0, 0)).second < kInf)) return false;  // false for NaN too
  return components == 1 || finite(range_of(ops.g.select(0, 1)));
}

}  // namespace

std::pair<int64_t, int64_t> exp_shift_stats() { return {small_block_runs.load(), exact_entries.load()}; }

Tensor log_matmul(const Tensor& g, const Tensor& w) {
  BatchedOperands ops;
  if (!prepare(g, w, 1, ops)) return {};
  return exp_shift_product(ops.g.select(0, 0), Tensor(), ops.w).first.unsqueeze(0);
}

Tensor entropy_matmul(const Tensor& g, const Tensor& w) {
  BatchedOperands ops;
  if (!prepare(g, w, 2, ops)) return {};
  auto r = exp_shift_product(ops.g.select(0, 0), ops.g.select(0, 1), ops.w);
  return at::stack({r.first, r.second});
}

}  // namespace kernels
}  // namespace torch_semiring
