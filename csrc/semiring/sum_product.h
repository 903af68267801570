// Shared base of the (+, ×) semirings — real, abs, count. They differ only in
// how a local derivative is lifted; the matrix product is an ordinary GEMM and
// the scatter an index_add, so these are as fast as stock backward.
#pragma once
#include "kernels/lift_cache.h"
#include "semiring.h"

namespace torch_semiring {

class SumProductSemiring : public Semiring {
 public:
  int64_t components() const override { return 1; }
  bool zero_is_numeric_zero() const override { return true; }
  Tensor readout(const Tensor& v) const override { return v.select(0, 0); }
  Tensor matmul(const Tensor& g, const Tensor& w) const override {
    return at::matmul(g, do_lift(w).select(0, 0));
  }
  // ⊕ has an inverse here: everything but me = total − me.
  Tensor exclusive_oplus(const Tensor& v, int64_t dim) const override {
    const int64_t d = at::maybe_wrap_dim(dim, v.dim() - 1) + 1;
    return v.sum(d, /*keepdim=*/true) - v;
  }
  Tensor scatter_oplus(const Tensor& src, const Tensor& index, int64_t numel) const override {
    return at::zeros({src.size(0), numel}, src.options()).index_add_(1, index, src);
  }

 protected:
  Tensor do_zero(at::IntArrayRef shape, const at::TensorOptions& o) const override {
    return constant_value({0.0}, shape, o);
  }
  Tensor do_one(at::IntArrayRef shape, const at::TensorOptions& o) const override {
    return constant_value({1.0}, shape, o);
  }
  Tensor do_otimes(const Tensor& a, const Tensor& b) const override { return a * b; }
  Tensor do_otimes_edge(const Tensor& a, const Tensor& w) const override {
    return a * do_lift(w);
  }
  Tensor do_oplus(const Tensor& a, const Tensor& b) const override { return a + b; }
  Tensor do_oplus_reduce(const Tensor& a, at::IntArrayRef dims, bool keepdim) const override {
    return dims.empty() ? a : a.sum(dims, keepdim);
  }
};

// abs and count: (+, ×) over [0, +∞] (see infinite_split_components).
class NonNegativeSumProduct : public SumProductSemiring {
 public:
  std::vector<bool> infinite_split_components() const override { return {true}; }
  // lift(w) of a saved leaf weight (a frozen layer) is kept across calls
  // (kernels/lift_cache.h): the GEMM is then all that is left, as in stock.
  Tensor matmul(const Tensor& g, const Tensor& w) const override {
    auto lifted = kernels::prepared_weight(w, name() + " lift", [this](const Tensor& x) {
      return kernels::Prepared{do_lift(x).select(0, 0)};
    });
    return at::matmul(g, lifted[0]);
  }
};

}  // namespace torch_semiring
