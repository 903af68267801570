// min_plus: the cheapest path, where an edge of local derivative w costs
// −log|w| (the tropical semiring; the worked example of docs/architecture.md).
// ⊕ = min, ⊗ = +, lift(w) = −log|w| (an edge of weight 0 costs +∞: the zero),
// zero +∞, one 0. Its ⊕ selects, so path tracking (provenance.h) works for it
// with the component-by-component defaults of Semiring::*_select; the best
// path is the one of smallest cost (selects_minimum). No kernel: products and
// scatters take the generic blocked versions.
#pragma once
#include "semiring.h"

#include <limits>

namespace torch_semiring {

class MinPlusSemiring final : public Semiring {
 public:
  std::string name() const override { return "min_plus"; }
  int64_t components() const override { return 1; }
  bool selects() const override { return true; }
  bool selects_minimum() const override { return true; }
  Tensor readout(const Tensor& v) const override { return v.select(0, 0); }

 protected:
  static constexpr double kInf = std::numeric_limits<double>::infinity();
  Tensor do_zero(at::IntArrayRef s, const at::TensorOptions& o) const override { return constant_value({kInf}, s, o); }
  Tensor do_one(at::IntArrayRef s, const at::TensorOptions& o) const override { return constant_value({0.0}, s, o); }
  Tensor do_lift(const Tensor& w) const override { return w.abs().log().neg().unsqueeze(0); }
  Tensor do_otimes(const Tensor& a, const Tensor& b) const override { return a + b; }
  // Nothing flows out of the zero (zero_edges.h): +∞ stays +∞ whatever w is.
  Tensor do_otimes_edge(const Tensor& a, const Tensor& w) const override {
    return (a - w.abs().log()).masked_fill_(a == kInf, kInf);
  }
  Tensor do_oplus(const Tensor& a, const Tensor& b) const override { return at::minimum(a, b); }
  Tensor do_oplus_reduce(const Tensor& a, at::IntArrayRef dims, bool keepdim) const override {
    return dims.empty() ? a : a.amin(dims, keepdim);
  }
};

}  // namespace torch_semiring
