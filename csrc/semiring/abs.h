// abs: Z = Σ_paths Π|w| — the partition function of the path distribution.
#pragma once
#include "sum_product.h"
#include "zero_edges.h"

#include "kernels/norm_rows.h"

namespace torch_semiring {

class AbsSemiring final : public NonNegativeSumProduct {
 public:
  std::string name() const override { return "abs"; }
  bool edge_scales_magnitude() const override { return true; }
  Tensor matmul_nonnegative(const Tensor& g, const Tensor& w) const override { return at::matmul(g, w); }
  // Σ_{i≠j} a_i |1 + x_i x_j|: sorted prefix sums (kernels/norm_rows).
  Tensor norm_offdiagonal(const Tensor& a, const Tensor& x) const override {
    auto fast = kernels::sum_rows(a.select(0, 0), x, /*nonzero=*/false);
    return fast.defined() ? fast.to(a.scalar_type()).unsqueeze(0) : Semiring::norm_offdiagonal(a, x);
  }

 protected:
  Tensor do_lift(const Tensor& w) const override { return w.abs().unsqueeze(0); }
  Tensor do_otimes_edge(const Tensor& a, const Tensor& w) const override { return times_abs_edge(a, w); }
};

}  // namespace torch_semiring
