// count: the number of paths. Every existing edge weighs 1; a zero-weight edge
// does not exist, so lift(0) = 0.
#pragma once
#include "sum_product.h"

namespace torch_semiring {

class CountSemiring final : public SumProductSemiring {
 public:
  std::string name() const override { return "count"; }

 protected:
  Tensor do_lift(const Tensor& w) const override { return w.ne(0).to(w.scalar_type()).unsqueeze(0); }
};

}  // namespace torch_semiring
