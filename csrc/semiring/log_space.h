// Shared base of the semirings that carry log|path product| — log and
// viterbi. They differ only in ⊕ (logaddexp vs max); ⊗ is +, lift(w) = log|w|
// (log 0 = −∞, the zero), the one is 0.
#pragma once
#include "semiring.h"
#include "zero_edges.h"

#include "kernels/elementwise.h"

namespace torch_semiring {

class LogSpaceSemiring : public Semiring {
 public:

  int64_t components() const override { return 1; }
  Tensor readout(const Tensor& v) const override { return v.select(0, 0); }

 protected:
  Tensor do_zero(at::IntArrayRef s, const at::TensorOptions& o) const override {
    return constant_value({-std::numeric_limits<double>::infinity()}, s, o);
  }
  Tensor do_one(at::IntArrayRef s, const at::TensorOptions& o) const override {
    return constant_value({0.0}, s, o);
  }
  Tensor do_lift(const Tensor& w) const override { return w.abs().log().unsqueeze(0); }
  Tensor do_otimes(const Tensor& a, const Tensor& b) const override { return a + b; }
  Tensor do_otimes_edge(const Tensor& a, const Tensor& w) const override { return add_log_abs_scores(a, w); }
};

}  // namespace torch_semiring
