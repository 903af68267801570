// viterbi: the best path in log space, max over paths of Σ log|w|.
// ⊕ = max, ⊗ = +, lift(w) = log|w|, zero −∞, one 0.
#pragma once
#include "log_space.h"
#include "selection.h"

#include "kernels/cpu_gemm.h"
#include "kernels/norm_rows.h"

namespace torch_semiring {

class ViterbiSemiring final : public LogSpaceSemiring {
 public:
  std::string name() const override { return "viterbi"; }
  bool selects() const override { return true; }
  // The max-plus GEMM kernel where it applies (float/double CPU, finite inputs).
  Tensor matmul(const Tensor& g, const Tensor& w) const override {
    auto fast = kernels::max_plus_matmul(g, w);
    return fast.defined() ? fast : Semiring::matmul(g, w);
  }
  // max_{i≠j} a_i + log|1 + x_i x_j|: shifted into linear space, an upper
  // envelope of lines (kernels/norm_rows).
  Tensor norm_offdiagonal(const Tensor& a, const Tensor& x) const override {
    auto fast = kernels::max_rows(a.select(0, 0), x, /*log_space=*/true);
    return fast.defined() ? fast.to(a.scalar_type()).unsqueeze(0) : Semiring::norm_offdiagonal(a, x);
  }
  Tensor scatter_oplus(const Tensor& src, const Tensor& index, int64_t numel) const override {
    return at::full({src.size(0), numel}, -std::numeric_limits<double>::infinity(), src.options())
        .scatter_reduce(1, index.unsqueeze(0).expand_as(src), src, "amax", true);
  }
  // Path tracking (provenance.h): the argmax kernels, the tags passed through
  // the edge in the same pass as the scores, a plain argmax for reductions.
  Tensor matmul_select(const Tensor& g, const Tensor& w) const override {
    return selection::max_matmul_select(/*times=*/false, g, w);
  }
  Tensor norm_offdiagonal_select(const Tensor& a, const Tensor& x) const override {
    return selection::max_rows_select(/*log_space=*/true, a, x);
  }
  Tensor otimes_edge_select(const Tensor& a, const Tensor& w) const override {
    auto fused = kernels::fused_edge(kernels::Fused::AddLogAbsIds, a, w);
    return fused.defined() ? fused : Semiring::otimes_edge_select(a, w);
  }
  Tensor oplus_reduce_select(const Tensor& a, at::IntArrayRef dims, bool keepdim) const override {
    return selection::reduce_by_pick(a, dims, keepdim, 1, selection::first_max);
  }

 protected:
  Tensor do_oplus(const Tensor& a, const Tensor& b) const override { return at::maximum(a, b); }
  Tensor do_oplus_reduce(const Tensor& a, at::IntArrayRef dims, bool keepdim) const override {
    return dims.empty() ? a : a.amax(dims, keepdim);
  }
};

}  // namespace torch_semiring
