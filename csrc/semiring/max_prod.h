// max_prod: the highest SIGNED path product M, with the lowest m carried along.
// Plain (max, ×) over signed numbers is not a semiring (a negative factor turns
// the minimum into the maximum), so a value is the pair (M, m) — the extreme
// products over its paths. ⊗ by an edge w gives (max(wM, wm), min(wM, wm)),
// ⊕ is (max, min), the zero (−∞, +∞) is the empty set of paths.
#pragma once
#include "selection.h"
#include "semiring.h"

#include "kernels/cpu_gemm.h"
#include "kernels/elementwise.h"
#include "kernels/norm_rows.h"

namespace torch_semiring {

class MaxProdSemiring final : public Semiring {
 public:
  std::string name() const override { return "max_prod"; }
  int64_t components() const override { return 2; }
  bool selects() const override { return true; }
  Tensor readout(const Tensor& v) const override { return v.select(0, 0); }
  // The signed-pair GEMM kernel where it applies (float/double CPU, no NaN).
  Tensor matmul(const Tensor& g, const Tensor& w) const override {
    auto fast = kernels::max_prod_matmul(g, w);
    return fast.defined() ? fast : Semiring::matmul(g, w);
  }
  // (max, min)_{i≠j} of M_i y_ij, m_i y_ij (y = 1 + x_i x_j): upper and lower
  // envelopes of lines (kernels/norm_rows).
  Tensor norm_offdiagonal(const Tensor& a, const Tensor& x) const override {
    auto fast = kernels::signed_max_rows(a.select(0, 0), a.select(0, 1), x);
    if (!std::get<0>(fast).defined()) return Semiring::norm_offdiagonal(a, x);
    return at::stack({std::get<0>(fast), std::get<1>(fast)}).to(a.scalar_type());
  }
  Tensor scatter_oplus(const Tensor& src, const Tensor& index, int64_t numel) const override {
    auto inf = std::numeric_limits<double>::infinity();
    auto idx = index.unsqueeze(0).expand({1, index.size(0)});
    auto hi = at::full({1, numel}, -inf, src.options())
                  .scatter_reduce(1, idx, src.narrow(0, 0, 1), "amax", true);
    auto lo = at::full({1, numel}, inf, src.options())
                  .scatter_reduce(1, idx, src.narrow(0, 1, 1), "amin", true);
    return at::cat({hi, lo}, 0);
  }
  // Path tracking (provenance.h). A negative edge swaps M and m, tags with
  // them; an emptied entry (from the zero, or over an edge of weight 0) has no path.
  Tensor otimes_edge_select(const Tensor& a, const Tensor& w) const override {
    auto value = do_otimes_edge(selection::scores(a, 2), w);
    auto id = selection::tags(a, 2);
    const auto shape = value.sizes().slice(1).vec();
    auto negative = (w < 0).expand(shape);
    auto empty = (a.select(0, 0) == -kInf).logical_or(w == 0).expand(shape);
    auto idM = id.select(0, 0).expand(shape), idm = id.select(0, 1).expand(shape);
    return selection::tagged(value, at::stack({at::where(empty, -1.0, at::where(negative, idm, idM)),
                                               at::where(empty, -1.0, at::where(negative, idM, idm))}));
  }
  Tensor oplus_reduce_select(const Tensor& a, at::IntArrayRef dims, bool keepdim) const override {
    return selection::reduce_by_pick(a, dims, keepdim, 2, [](const Tensor& s) {
      return at::stack({s.select(0, 0).argmax(-1, true), s.select(0, 1).argmin(-1, true)});
    });
  }
  Tensor matmul_select(const Tensor& g, const Tensor& w) const override {
    return selection::matmul_by_winners(g, w, 2, /*on_device=*/false, [](const Tensor& s, const Tensor& w) {
      return kernels::max_prod_matmul_argmax(s, w);
    });
  }

 protected:
  static constexpr double kInf = std::numeric_limits<double>::infinity();
  Tensor do_zero(at::IntArrayRef s, const at::TensorOptions& o) const override {
    return constant_value({-kInf, kInf}, s, o);
  }
  Tensor do_one(at::IntArrayRef s, const at::TensorOptions& o) const override {
    return constant_value({1.0, 1.0}, s, o);
  }
  Tensor do_lift(const Tensor& w) const override {
    auto none = w == 0;
    return at::stack({at::where(none, -kInf, w), at::where(none, kInf, w)});
  }
  // Products of two intervals of path products; empty ⊗ anything = empty.
  Tensor do_otimes(const Tensor& a, const Tensor& b) const override {
    auto M1 = a.select(0, 0), m1 = a.select(0, 1), M2 = b.select(0, 0), m2 = b.select(0, 1);
    auto p = at::stack({M1 * M2, M1 * m2, m1 * M2, m1 * m2});
    auto empty = (M1 == -kInf).logical_or(M2 == -kInf);
    return at::stack({at::where(empty, -kInf, p.amax(0)), at::where(empty, kInf, p.amin(0))});
  }
  Tensor do_otimes_edge(const Tensor& a, const Tensor& w) const override {
    auto fused = kernels::fused_edge(kernels::Fused::MaxProdOps, a, w);  // one pass
    if (fused.defined()) return fused;
    auto hi = a.select(0, 0) * w, lo = a.select(0, 1) * w;
    auto empty = (a.select(0, 0) == -kInf).logical_or(w == 0);
    return at::stack({at::where(empty, -kInf, at::maximum(hi, lo)),
                      at::where(empty, kInf, at::minimum(hi, lo))});
  }
  Tensor do_oplus(const Tensor& a, const Tensor& b) const override {
    auto fused = kernels::fused_pair(kernels::Fused::MaxProdOps, a, b);  // one pass
    if (fused.defined()) return fused;
    return at::stack({at::maximum(a.select(0, 0), b.select(0, 0)),
                      at::minimum(a.select(0, 1), b.select(0, 1))});
  }
  Tensor do_oplus_reduce(const Tensor& a, at::IntArrayRef dims, bool keepdim) const override {
    if (dims.empty()) return a;
    // dims are already shifted past the component dim; reduce each component.
    std::vector<int64_t> d;
    for (auto x : dims) d.push_back(x - 1);
    return at::stack({a.select(0, 0).amax(d, keepdim), a.select(0, 1).amin(d, keepdim)});
  }
};

}  // namespace torch_semiring
