// viterbi: the best path in log space, max over paths of Σ log|w|.
// ⊕ = max, ⊗ = +, lift(w) = log|w|, zero −∞, one 0.
#pragma once
#include "log_space.h"

#include "kernels/cpu_gemm.h"
#include "kernels/line_envelope.h"

namespace torch_semiring {

class ViterbiSemiring final : public LogSpaceSemiring {
 public:
  std::string name() const override { return "viterbi"; }
  // The max-plus GEMM kernel where it applies (float/double CPU, finite inputs).
  Tensor matmul(const Tensor& g, const Tensor& w) const override {
    auto fast = kernels::max_plus_matmul(g, w);
    return fast.defined() ? fast : Semiring::matmul(g, w);
  }
  // max_i g_i + log|u_i + v_i t_j| = A + log max_i e^{g_i − A}|u_i + v_i t_j| with
  // A the row's largest g (in float64: a line only vanishes 745 nats below A).
  Tensor affine_matmul(const Tensor& g, const Tensor& u, const Tensor& v, const Tensor& t) const override {
    if (!g.device().is_cpu()) return Semiring::affine_matmul(g, u, v, t);
    auto logs = g.select(0, 0).to(at::kDouble);
    auto top = logs.amax(1, true);
    top = at::where(at::isfinite(top), top, at::zeros_like(top));  // a row without paths stays −∞
    auto best = kernels::max_abs_affine((logs - top).exp(), u, v, t);
    return (best.log() + top).to(g.scalar_type()).unsqueeze(0);
  }
  Tensor scatter_oplus(const Tensor& src, const Tensor& index, int64_t numel) const override {
    return at::full({src.size(0), numel}, -std::numeric_limits<double>::infinity(), src.options())
        .scatter_reduce(1, index.unsqueeze(0).expand_as(src), src, "amax", true);
  }

 protected:
  Tensor do_oplus(const Tensor& a, const Tensor& b) const override { return at::maximum(a, b); }
  Tensor do_oplus_reduce(const Tensor& a, at::IntArrayRef dims, bool keepdim) const override {
    return dims.empty() ? a : a.amax(dims, keepdim);
  }
};

}  // namespace torch_semiring
