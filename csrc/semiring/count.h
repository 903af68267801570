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

 protected:
  Tensor do_lift(const Tensor& w) const override { return w.ne(0).to(w.scalar_type()).unsqueeze(0); }
  // a·[w ≠ 0] in one fused pass where it applies (CPU float/double), else the lift's three.
  Tensor do_otimes_edge(const Tensor& a, const Tensor& w) const override {
    auto fused = kernels::fused_edge(kernels::Fused::TimesNonzero, a, w);
    return fused.defined() ? fused : NonNegativeSumProduct::do_otimes_edge(a, w);
  }
};

}  // namespace torch_semiring
