// real: the ordinary gradient. lift(w) = w. Must equal torch.autograd.grad.
#pragma once
#include "sum_product.h"

namespace torch_semiring {

class RealSemiring final : public SumProductSemiring {
 public:
  std::string name() const override { return "real"; }
  bool stock_backward_is_exact() const override { return true; }

 protected:
  Tensor do_lift(const Tensor& w) const override { return w.unsqueeze(0); }
};

}  // namespace torch_semiring
