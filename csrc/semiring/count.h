// count: the number of paths. Every existing edge weighs 1; a zero-weight edge
// does not exist, so lift(0) = 0.
#pragma once
#include "sum_product.h"

#include "kernels/elementwise.h"
#include "kernels/norm_rows.h"

namespace torch_semiring {

class CountSemiring final : public NonNegativeSumProduct {
 public:
  std::string name() const override { return "count"; }
  // Σ_{i≠j, 1 + x_i x_j ≠ 0} a_i: sorted range sums (kernels/norm_rows).
  Tensor norm_offdiagonal(const Tensor& a, const Tensor& x) const override {
    auto fast = kernels::sum_rows(a.select(0, 0), x, /*nonzero=*/true);
    return fast.defined() ? fast.to(a.scalar_type()).unsqueeze(0) : Semiring::norm_offdiagonal(a, x);
  }

  // Σ_k g[k]·[w[k, n] ≠ 0]. A column of w without zeros (every column of a
  // dense layer) weighs every k by 1: its output is the row sum of g, so one
  // O(M·K) reduction stands in for the GEMM's O(M·K·N), and only the columns
  // that hold a zero go through a GEMM (all of them, the whole GEMM, once they
  // are more than a quarter). The lift and those columns come from the lift
  // cache: once per version of a frozen weight. (Values here are finite and
  // ≥ 0 — the engine splits off +∞ — so a row sum is 0 exactly where no path is.)
  Tensor matmul(const Tensor& g, const Tensor& w) const override {
    if (g.dim() < 2 || w.dim() < 2 || w.numel() == 0 || g.is_meta() || w.is_meta())
      return NonNegativeSumProduct::matmul(g, w);
    auto prepared = kernels::prepared_weight(w, "count lift, columns with zeros", [this](const Tensor& x) {
      auto with_zero = x.eq(0).any(-2).reshape({-1, x.size(-1)}).any(0);  // a zero in any batch entry
      return kernels::Prepared{do_lift(x).select(0, 0), with_zero.nonzero().squeeze(1)};
    });
    const auto &lifted = prepared[0], &columns = prepared[1];
    const int64_t N = w.size(-1);
    if (columns.numel() * 4 > N) return at::matmul(g, lifted);
    auto shape = at::infer_size(g.sizes().slice(0, g.dim() - 2), w.sizes().slice(0, w.dim() - 2));
    shape.push_back(g.size(-2));
    shape.push_back(N);
    auto out = g.sum(-1, /*keepdim=*/true).expand(shape).contiguous();
    if (columns.numel() > 0) out.index_copy_(-1, columns, at::matmul(g, lifted.index_select(-1, columns)));
    return out;
  }

 protected:
  Tensor do_lift(const Tensor& w) const override { return w.ne(0).to(w.scalar_type()).unsqueeze(0); }
  // a·[w ≠ 0] in one fused pass where it applies (CPU float/double), else the lift's three.
  Tensor do_otimes_edge(const Tensor& a, const Tensor& w) const override {
    auto fused = kernels::fused_edge(kernels::Fused::TimesNonzero, a, w);
    return fused.defined() ? fused : NonNegativeSumProduct::do_otimes_edge(a, w);
  }
};

}  // namespace torch_semiring
