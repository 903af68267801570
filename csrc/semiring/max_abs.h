// max_abs: the largest path product of |w| (the paper's max-product on
// magnitudes). ⊕ = max, ⊗ = ×, lift(w) = |w|, zero 0, one 1.
#pragma once
#include "selection.h"
#include "semiring.h"
#include "zero_edges.h"

#include "kernels/cpu_gemm.h"
#include "kernels/norm_rows.h"

namespace torch_semiring {

class MaxAbsSemiring final : public Semiring {
 public:
  std::string name() const override { return "max_abs"; }
  int64_t components() const override { return 1; }
  bool selects() const override { return true; }
  bool zero_is_numeric_zero() const override { return true; }
  std::vector<bool> infinite_split_components() const override { return {true}; }
  bool edge_scales_magnitude() const override { return true; }
  Tensor readout(const Tensor& v) const override { return v.select(0, 0); }
  // The max-times GEMM kernel where it applies (float/double CPU, finite inputs).
  Tensor matmul(const Tensor& g, const Tensor& w) const override {
    auto fast = kernels::max_times_matmul(g, w);
    return fast.defined() ? fast : Semiring::matmul(g, w);
  }
  // max_{i≠j} a_i·|1 + x_i x_j|: an upper envelope of lines (kernels/norm_rows).
  Tensor norm_offdiagonal(const Tensor& a, const Tensor& x) const override {
    auto fast = kernels::max_rows(a.select(0, 0), x, /*log_space=*/false);
    return fast.defined() ? fast.to(a.scalar_type()).unsqueeze(0) : Semiring::norm_offdiagonal(a, x);
  }
  Tensor scatter_oplus(const Tensor& src, const Tensor& index, int64_t numel) const override {
    return at::zeros({src.size(0), numel}, src.options())
        .scatter_reduce(1, index.unsqueeze(0).expand_as(src), src, "amax", true);
  }
  // Path tracking (provenance.h): the argmax kernels, a plain argmax for reductions.
  Tensor matmul_select(const Tensor& g, const Tensor& w) const override {
    return selection::max_matmul_select(/*times=*/true, g, w);
  }
  Tensor norm_offdiagonal_select(const Tensor& a, const Tensor& x) const override {
    return selection::max_rows_select(/*log_space=*/false, a, x);
  }
  Tensor oplus_reduce_select(const Tensor& a, at::IntArrayRef dims, bool keepdim) const override {
    return selection::reduce_by_pick(a, dims, keepdim, 1, selection::first_max);
  }

 protected:
  Tensor do_zero(at::IntArrayRef s, const at::TensorOptions& o) const override {
    return constant_value({0.0}, s, o);
  }
  Tensor do_one(at::IntArrayRef s, const at::TensorOptions& o) const override {
    return constant_value({1.0}, s, o);
  }
  Tensor do_lift(const Tensor& w) const override { return w.abs().unsqueeze(0); }
  Tensor do_otimes(const Tensor& a, const Tensor& b) const override { return a * b; }
  Tensor do_otimes_edge(const Tensor& a, const Tensor& w) const override { return times_abs_edge(a, w); }
  Tensor do_oplus(const Tensor& a, const Tensor& b) const override { return at::maximum(a, b); }
  Tensor do_oplus_reduce(const Tensor& a, at::IntArrayRef dims, bool keepdim) const override {
    return dims.empty() ? a : a.amax(dims, keepdim);
  }
};

}  // namespace torch_semiring
