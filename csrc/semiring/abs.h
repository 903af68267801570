// abs: Z = Σ_paths Π|w| — the partition function of the path distribution.
#pragma once
#include "sum_product.h"

namespace torch_semiring {

class AbsSemiring final : public SumProductSemiring {
 public:
  std::string name() const override { return "abs"; }

 protected:
  Tensor do_lift(const Tensor& w) const override { return w.abs().unsqueeze(0); }
};

}  // namespace torch_semiring
