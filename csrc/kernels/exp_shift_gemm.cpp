// Log-sum-exp and entropy semiring products as ordinary GEMMs (MKL through
// at::matmul), by shifting into linear space:
//
//   logsumexp_k(a_mk + log|w_kn|) = s_m + t_n + log Σ_k P_mk Q_kn,
//   P = e^{a − s} (s_m = max_k a_mk),  Q = |w|·e^{−t} (t_n = max_k log|w_kn|)
//
// Every factor is ≤ 1, so nothing overflows; a sum underflows or loses
// precision only when the entry's largest term is far below s_m + t_n (a row
// spanning ~87 (float) or ~708 (double) in log space). Such entries are found
// by a bound on the rounding error (see `suspect`) and recomputed exactly, in
// the input dtype, by a direct logsumexp over k — so the result never depends
// on the shift having been good. Rows or columns without any path give −∞
// directly.
//
// Entropy pairs (ℓ, h) use the same factors: with Z = P@Q,
// A = (P∘h)@Q and B = P@(Q∘log|w|) (0 where w = 0),
//   ℓ_out = s + t + log Z,   h_out = (A − B)/Z
// (h_out is the softmax(ℓ + log|w|)-weighted mean of h − log|w|), and the same
// exact recomputation for suspect entries.
#include "kernels/cpu_gemm.h"

#include <cmath>
#include <limits>

namespace torch_semiring {
namespace kernels {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

bool gemm_dtype(const Tensor& g, const Tensor& w) {
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

// The shifted factors of one product.
struct Shifted {
  Tensor lw;    // log|w|, −∞ where w = 0
  Tensor s, t;  // row shifts (…, M, 1) and column shifts (…, 1, N); 0 where the row/column is empty
  Tensor P, Q;  // e^{a − s}, e^{lw − t}
  Tensor live;  // (…, M, N) bool: row and column both have a finite entry
};

Shifted shift(const Tensor& a, const Tensor& w) {
  Shifted f;
  f.lw = w.abs().log();
  auto s = a.amax(-1, /*keepdim=*/true), t = f.lw.amax(-2, /*keepdim=*/true);
  f.live = s.gt(-kInf).logical_and(t.gt(-kInf));
  f.s = at::where(s.eq(-kInf), 0.0, s);
  f.t = at::where(t.eq(-kInf), 0.0, t);
  f.P = (a - f.s).exp_();
  f.Q = (f.lw - f.t).exp_();
  return f;
}

// Entries whose sum Z may have lost accuracy. Each of the K terms P·Q ≤ 1 is
// exact to a relative eps unless it is (or comes from a factor that is)
// subnormal, which costs at most FLT_MIN/DBL_MIN in absolute terms (also with
// flush-to-zero). So Z >= K·min/eps·4 guarantees a relative error of ~K·eps,
// the usual GEMM error; anything smaller with a live row and column (a path
// may exist) is recomputed.
Tensor suspect(const Tensor& Z, const Shifted& f, int64_t K) {
  const bool single = Z.scalar_type() == at::kFloat;
  const double tiny = single ? std::numeric_limits<float>::min() : std::numeric_limits<double>::min();
  const double eps = single ? std::numeric_limits<float>::epsilon() : std::numeric_limits<double>::epsilon();
  return Z.lt(double(K) * tiny / eps * 4).logical_and_(f.live.expand_as(Z));
}

// Exact recomputation of listed entries. rows: (nb, K) values of a at the
// entries' (batch, m); cols: (nb, K) log|w| at their (batch, n). Chunked so
// that no temporary exceeds ~4M elements.
template <class F>
void for_chunks(int64_t nb, int64_t K, F f) {
  const int64_t chunk = std::max<int64_t>(1, (int64_t(1) << 22) / std::max<int64_t>(K, 1));
  for (int64_t i = 0; i < nb; i += chunk) f(i, std::min(chunk, nb - i));
}

// Flat (batch·M, K) and (batch·N, K) views for gathering rows of a and
// columns of lw by entry index.
struct Gather {
  Tensor rows_of_a;   // (B·M, K)
  Tensor cols_of_lw;  // (B·N, K)
  Tensor row_index, col_index;  // (nb,) into them
};

Gather gather_index(const Tensor& a, const Tensor& lw, const Tensor& bad) {
  const int64_t M = a.size(-2), K = a.size(-1), N = lw.size(-1);
  Gather gi;
  gi.rows_of_a = a.reshape({-1, M, K}).reshape({-1, K});
  gi.cols_of_lw = lw.reshape({-1, K, N}).transpose(1, 2).reshape({-1, K});
  auto flat = bad.reshape({-1}).nonzero().squeeze(1);  // index into (B, M, N)
  auto b = flat.div(M * N, "floor"), mn = flat.remainder(M * N);
  auto m = mn.div(N, "floor"), n = mn.remainder(N);
  gi.row_index = b * M + m;
  gi.col_index = b * N + n;
  return gi;
}

}  // namespace

Tensor log_matmul(const Tensor& g, const Tensor& w) {
  BatchedOperands ops;
  if (!gemm_dtype(g, w) || g.size(0) != 1 || !broadcast_operands(g, w, ops)) return {};
  for (auto s : ops.out_shape) if (s == 0) return {};
  const int64_t K = ops.g.size(-1);
  if (K == 0) return {};
  // The shifts need a finite w and no NaN/+∞ in g (where the generic
  // arithmetic itself would give NaN or +∞).
  auto rw = range_of(ops.w), rg = range_of(ops.g);
  if (!std::isfinite(rw.first) || !std::isfinite(rw.second) || !(rg.second < kInf)) return {};

  count_kernel_call();
  auto a = ops.g.select(0, 0);
  auto f = shift(a, ops.w);
  auto Z = at::matmul(f.P, f.Q);
  auto out = (f.s + f.t) + Z.log();  // log 0 = −∞: no path
  auto bad = suspect(Z, f, K);
  if (bad.any().item<bool>()) {
    auto gi = gather_index(a, f.lw, bad);
    auto flat_out = out.view({-1});
    auto where_bad = bad.reshape({-1}).nonzero().squeeze(1);
    const int64_t nb = where_bad.size(0);
    for_chunks(nb, K, [&](int64_t i, int64_t c) {
      auto x = gi.rows_of_a.index_select(0, gi.row_index.narrow(0, i, c)) +
               gi.cols_of_lw.index_select(0, gi.col_index.narrow(0, i, c));
      flat_out.index_put_({where_bad.narrow(0, i, c)}, at::logsumexp(x, {1}));
    });
  }
  return out.unsqueeze(0);
}

Tensor entropy_matmul(const Tensor& g, const Tensor& w) {
  BatchedOperands ops;
  if (!gemm_dtype(g, w) || g.size(0) != 2 || !broadcast_operands(g, w, ops)) return {};
  for (auto s : ops.out_shape) if (s == 0) return {};
  const int64_t K = ops.g.size(-1);
  if (K == 0) return {};
  auto l = ops.g.select(0, 0), h = ops.g.select(0, 1);
  auto rw = range_of(ops.w), rl = range_of(l), rh = range_of(h);
  if (!std::isfinite(rw.first) || !std::isfinite(rw.second) || !(rl.second < kInf) || !std::isfinite(rh.first) ||
      !std::isfinite(rh.second))
    return {};

  count_kernel_call();
  auto f = shift(l, ops.w);
  auto Z = at::matmul(f.P, f.Q);
  auto A = at::matmul(f.P * h, f.Q);
  auto Ql = at::where(ops.w.eq(0), 0.0, f.Q * f.lw);  // 0·(−∞) where there is no edge
  auto B = at::matmul(f.P, Ql);
  auto l_out = (f.s + f.t) + Z.log();
  auto h_out = (A - B).div_(Z);
  h_out = at::where(Z.eq(0), 0.0, h_out);  // empty: h = 0 by convention
  auto bad = suspect(Z, f, K);
  if (bad.any().item<bool>()) {
    auto gi = gather_index(l, f.lw, bad);
    auto h_rows = h.reshape({-1, l.size(-2), K}).reshape({-1, K});
    auto flat_l = l_out.view({-1}), flat_h = h_out.view({-1});
    auto where_bad = bad.reshape({-1}).nonzero().squeeze(1);
    const int64_t nb = where_bad.size(0);
    for_chunks(nb, K, [&](int64_t i, int64_t c) {
      auto ri = gi.row_index.narrow(0, i, c), ci = gi.col_index.narrow(0, i, c);
      auto lw = gi.cols_of_lw.index_select(0, ci);
      auto x = gi.rows_of_a.index_select(0, ri) + lw;  // ℓ + log|w| per term
      auto total = at::logsumexp(x, {1}, /*keepdim=*/true);
      auto none = x.eq(-kInf);
      auto p = at::where(none, 0.0, (x - at::where(total.eq(-kInf), 0.0, total)).exp());
      auto hv = at::where(none, 0.0, h_rows.index_select(0, ri) - lw);
      auto idx = where_bad.narrow(0, i, c);
      flat_l.index_put_({idx}, total.squeeze(1));
      flat_h.index_put_({idx}, (p * hv).sum(1));
    });
  }
  return at::stack({l_out, h_out});
}

}  // namespace kernels
}  // namespace torch_semiring
