// viterbi: the best path in log space, max over paths of Σ log|w|.
// ⊕ = max, ⊗ = +, lift(w) = log|w|, zero −∞, one 0.
#pragma once
#include "semiring.h"

#include "kernels/cpu_gemm.h"

namespace torch_semiring {

class ViterbiSemiring final : public Semiring {
 public:
  std::string name() const override { return "viterbi"; }
  int64_t components() const override { return 1; }
  Tensor readout(const Tensor& v) const override { return v.select(0, 0); }
  // The max-plus GEMM kernel where it applies (float/double CPU, finite inputs).
  Tensor matmul(const Tensor& g, const Tensor& w) const override {
    auto fast = kernels::max_plus_matmul(g, w);
    return fast.defined() ? fast : Semiring::matmul(g, w);
  }
  Tensor scatter_oplus(const Tensor& src, const Tensor& index, int64_t numel) const override {
    return at::full({src.size(0), numel}, -std::numeric_limits<double>::infinity(), src.options())
        .scatter_reduce(1, index.unsqueeze(0).expand_as(src), src, "amax", true);
  }

 protected:
  Tensor do_zero(at::IntArrayRef s, const at::TensorOptions& o) const override {
    return constant_value({-std::numeric_limits<double>::infinity()}, s, o);
  }
  Tensor do_one(at::IntArrayRef s, const at::TensorOptions& o) const override {
    return constant_value({0.0}, s, o);
  }
  Tensor do_lift(const Tensor& w) const override { return w.abs().log().unsqueeze(0); }
  Tensor do_otimes(const Tensor& a, const Tensor& b) const override { return a + b; }
  Tensor do_otimes_edge(const Tensor& a, const Tensor& w) const override {
    return a + w.abs().log();
  }
  Tensor do_oplus(const Tensor& a, const Tensor& b) const override { return at::maximum(a, b); }
  Tensor do_oplus_reduce(const Tensor& a, at::IntArrayRef dims, bool keepdim) const override {
    return dims.empty() ? a : a.amax(dims, keepdim);
  }
};

}  // namespace torch_semiring
