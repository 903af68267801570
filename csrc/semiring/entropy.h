// entropy: H = −Σ p log p of the path distribution p ∝ Π|w|.
//
// The expectation semiring ⟨Z, R⟩ (⊕ adds, ⟨a,b⟩⊗⟨c,d⟩ = ⟨ac, ad+cb⟩,
// lift(w) = ⟨|w|, −|w|log|w|⟩, H = R/Z + log Z) underflows in linear space on
// deep nets, so a value is carried as ℓ = log Z and h = R/Z:
//   ⊗ by w:  (ℓ + log|w|, h − log|w|)      ⊗ of values: (ℓ1 + ℓ2, h1 + h2)
//   ⊕:       ℓ = logaddexp(ℓ1, ℓ2), h = softmax(ℓ)-weighted mean of h
//   zero (−∞, 0), one (0, 0), readout H = ℓ + h (NaN where there is no path).
#pragma once
#include "semiring.h"

#include "kernels/cpu_gemm.h"
#include "kernels/elementwise.h"
#include "kernels/norm_rows.h"

namespace torch_semiring {

class EntropySemiring final : public Semiring {
 public:
  std::string name() const override { return "entropy"; }
  int64_t components() const override { return 2; }
  Tensor readout(const Tensor& v) const override {
    auto l = v.select(0, 0);
    return at::where(l == -kInf, std::numeric_limits<double>::quiet_NaN(), l + v.select(0, 1));
  }
  // Exp-shifted GEMMs with exact recomputation of underflowing entries, where they apply.
  Tensor matmul(const Tensor& g, const Tensor& w) const override {
    auto fast = kernels::entropy_matmul(g, w);
    return fast.defined() ? fast : Semiring::matmul(g, w);
  }
  // Z by sorted prefix sums, its |y| log|y| term by a direct symmetric pass (kernels/norm_rows).
  Tensor norm_offdiagonal(const Tensor& a, const Tensor& x) const override {
    auto fast = kernels::entropy_rows(a.select(0, 0), a.select(0, 1), x);
    if (!std::get<0>(fast).defined()) return Semiring::norm_offdiagonal(a, x);
    return at::stack({std::get<0>(fast), std::get<1>(fast)}).to(a.scalar_type());
  }

 protected:
  static constexpr double kInf = std::numeric_limits<double>::infinity();
  // h of an empty set of paths is 0 by convention, whatever arithmetic gave.
  static Tensor pair(const Tensor& l, const Tensor& h) {
    return at::stack({l, at::where(l == -kInf, at::zeros_like(h), h)});
  }
  Tensor do_zero(at::IntArrayRef s, const at::TensorOptions& o) const override {
    return constant_value({-kInf, 0.0}, s, o);
  }
  Tensor do_one(at::IntArrayRef s, const at::TensorOptions& o) const override {
    return constant_value({0.0, 0.0}, s, o);
  }
  Tensor do_lift(const Tensor& w) const override {
    auto lw = w.abs().log();
    return pair(lw, -lw);
  }
  Tensor do_otimes(const Tensor& a, const Tensor& b) const override {
    return pair(a.select(0, 0) + b.select(0, 0), a.select(0, 1) + b.select(0, 1));
  }
  Tensor do_otimes_edge(const Tensor& a, const Tensor& w) const override {
    auto fused = kernels::fused_edge(kernels::Fused::EntropyOps, a, w);  // one pass
    if (fused.defined()) return fused;
    auto lw = w.abs().log();
    auto l = a.select(0, 0) + lw;  // no path in: no path out (zero_edges.h)
    l.masked_fill_(a.select(0, 0) == -kInf, -kInf);
    return pair(l, a.select(0, 1) - lw);
  }
  Tensor do_oplus(const Tensor& a, const Tensor& b) const override {
    auto fused = kernels::fused_pair(kernels::Fused::EntropyOps, a, b);  // one pass
    if (fused.defined()) return fused;
    auto l1 = a.select(0, 0), l2 = b.select(0, 0);
    auto l = at::logaddexp(l1, l2);
    auto w1 = weight(l1, l), w2 = weight(l2, l);
    return pair(l, w1 * a.select(0, 1) + w2 * b.select(0, 1));
  }
  Tensor do_oplus_reduce(const Tensor& a, at::IntArrayRef dims, bool keepdim) const override {
    if (dims.empty()) return a;
    std::vector<int64_t> d;
    for (auto x : dims) d.push_back(x - 1);
    auto l = a.select(0, 0), h = a.select(0, 1);
    auto total = at::logsumexp(l, d, /*keepdim=*/true);
    auto mean_h = (weight(l, total) * h).sum(d, keepdim);
    return pair(keepdim ? total : at::logsumexp(l, d, false), mean_h);
  }

 private:
  // exp(l − total): a part's share of the total mass; 0 for empty parts.
  static Tensor weight(const Tensor& l, const Tensor& total) {
    return at::where(l == -kInf, at::zeros_like(l), at::exp(l - total));
  }
};

}  // namespace torch_semiring
