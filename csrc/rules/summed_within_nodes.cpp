// within_node_oplus="sum" (summed_within_nodes.h): the paper's max semantics.
//
// Du et al.'s implementation computes its max semirings node by node with the
// node's ordinary backward: the backward of a matmul SUMS over the contracted
// dim, the broadcast reduction after it SUMS, and only the accumulation of
// the contributions of a tensor's different consumers takes the max. Here the
// same split is made with the semirings we have. Every max semiring has a
// "sum twin" with the same carrier and ⊗ but ⊕ = +:
//     max_abs  (max, ×) on |w|   → abs  (+, ×) on |w|
//     viterbi  (max, +) on log|w| → log (logaddexp, +) on log|w|
//     max_prod (max, min) of signed products → real (+, ×), run on M and on m
//              separately and the two results re-sorted into (max, min) per
//              element — exactly brunoflow's max/min pass.
// The wrapper semiring carries the max semiring's values and does its ⊕
// between nodes (the engine's input buffers, .grad); each node runs the
// twin's rule (registry: apply_rule), and the result is reduced to the
// input's shape with the twin's ⊕ here, so the engine's broadcast reduction
// is the identity. Not a semiring: a value depends on how ops are grouped
// into nodes (see ts.decomposed("paper") for the paper's grouping).
//
// max_prod detail: the real twin has no "no path" element, so the zero
// (−∞, +∞) enters it as 0 and a node's output is a number everywhere, 0 where
// no edge leads: as in brunoflow, whose every consumer sends its adjoint,
// zeros included, into the max. An input reached only through zero
// derivatives reads 0, not −∞.
//
// Cost model: a node costs its twin's rule plus one reduction per input —
// abs / log rules as in those semirings; max_prod two stock backward calls
// (2× a gradient) and an element-wise max/min per input.
#include "summed_within_nodes.h"

#include <limits>

#include "../semiring/entropy.h"
#include "../semiring/log.h"
#include "../semiring/max_abs.h"
#include "../semiring/max_prod.h"
#include "../semiring/sum_product.h"
#include "../semiring/viterbi.h"

namespace torch_semiring {

namespace {

class SummedWithinNodes final : public Semiring {
 public:
  SummedWithinNodes(SemiringPtr base, SemiringPtr twin, bool signed_pair)
      : base_(std::move(base)), twin_(std::move(twin)), signed_pair_(signed_pair) {}

  std::string name() const override { return base_->name() + " (within_node_oplus='sum')"; }
  int64_t components() const override { return base_->components(); }
  bool zero_is_numeric_zero() const override { return base_->zero_is_numeric_zero(); }
  std::vector<bool> infinite_split_components() const override { return base_->infinite_split_components(); }
  Tensor readout(const Tensor& v) const override { return base_->readout(v); }

  // The node's rule in the twin, reduced to each input's shape in the twin.
  std::vector<Tensor> apply(Node& node, const std::vector<bool>& needed, const std::vector<Tensor>& values,
                            bool create_graph) const {
    const RuleContext ctx{node, *this, create_graph, needed};
    auto reduced = [&](std::vector<Tensor> out) {
      for (size_t i = 0; i < out.size(); ++i)
        if (out[i].defined())
          out[i] = oplus_sum_to(*twin_, out[i], ctx.input_shape(i), "the rule of " + node.name());
      return out;
    };
    if (!signed_pair_) return reduced(apply_rule(node, *twin_, needed, values, create_graph));
    const double inf = std::numeric_limits<double>::infinity();
    std::vector<Tensor> hi_in(values.size()), lo_in(values.size());
    for (size_t j = 0; j < values.size(); ++j) {
      if (!values[j].defined()) continue;
      auto M = values[j].narrow(0, 0, 1), m = values[j].narrow(0, 1, 1);
      hi_in[j] = M.masked_fill(M == -inf, 0);  // the zero (no path) enters the real twin as 0
      lo_in[j] = m.masked_fill(m == inf, 0);
    }
    auto hi = reduced(apply_rule(node, *twin_, needed, hi_in, create_graph));
    auto lo = reduced(apply_rule(node, *twin_, needed, lo_in, create_graph));
    std::vector<Tensor> out(std::max(hi.size(), lo.size()));
    for (size_t i = 0; i < out.size(); ++i) {
      auto a = i < hi.size() ? hi[i] : Tensor(), b = i < lo.size() ? lo[i] : Tensor();
      if (!a.defined() && !b.defined()) continue;
      if (!a.defined()) a = at::zeros_like(b);
      if (!b.defined()) b = at::zeros_like(a);
      out[i] = at::cat({at::maximum(a, b), at::minimum(a, b)}, 0);  // a sign flip swaps max and min
    }
    return out;
  }

  // Everything else is the max semiring's own (⊕ = max): these run between
  // nodes, or wherever a caller uses the handle directly.
  Tensor matmul(const Tensor& g, const Tensor& w) const override { return base_->matmul(g, w); }
  Tensor scatter_oplus(const Tensor& src, const Tensor& index, int64_t numel) const override {
    return base_->scatter_oplus(src, index, numel);
  }
  Tensor exclusive_oplus(const Tensor& v, int64_t dim) const override { return base_->exclusive_oplus(v, dim); }
  Tensor norm_offdiagonal(const Tensor& a, const Tensor& x) const override { return base_->norm_offdiagonal(a, x); }
  Tensor prefix_oplus(const Tensor& v, int64_t dim, bool reverse) const override {
    return base_->prefix_oplus(v, dim, reverse);
  }

 protected:
  Tensor do_zero(at::IntArrayRef s, const at::TensorOptions& o) const override { return base_->zero(s, o); }
  Tensor do_one(at::IntArrayRef s, const at::TensorOptions& o) const override { return base_->one(s, o); }
  Tensor do_lift(const Tensor& w) const override { return base_->lift(w); }
  Tensor do_otimes(const Tensor& a, const Tensor& b) const override { return base_->otimes(a, b); }
  Tensor do_otimes_edge(const Tensor& a, const Tensor& w) const override { return base_->otimes_edge(a, w); }
  Tensor do_oplus(const Tensor& a, const Tensor& b) const override { return base_->oplus(a, b); }
  Tensor do_oplus_reduce(const Tensor& a, at::IntArrayRef dims, bool keepdim) const override {
    std::vector<int64_t> element_dims;
    for (auto d : dims) element_dims.push_back(d - 1);
    return base_->oplus_reduce(a, element_dims, keepdim);
  }

 private:
  SemiringPtr base_, twin_;
  bool signed_pair_;
};

}  // namespace

SemiringPtr summed_within_nodes(SemiringPtr base) {
  const Semiring* s = base.get();
  if (dynamic_cast<const SummedWithinNodes*>(s) || dynamic_cast<const SumProductSemiring*>(s) ||
      dynamic_cast<const LogSemiring*>(s) || dynamic_cast<const EntropySemiring*>(s))
    return base;  // ⊕ is a sum already (or the option is set): nothing changes
  const bool signed_pair = dynamic_cast<const MaxProdSemiring*>(s) != nullptr;
  const char* twin = signed_pair                                   ? "real"
                     : dynamic_cast<const MaxAbsSemiring*>(s)      ? "abs"
                     : dynamic_cast<const ViterbiSemiring*>(s)     ? "log"
                                                                   : nullptr;
  TORCH_CHECK_VALUE(twin, "torch_semiring: within_node_oplus='sum' (the paper's max semantics) is defined for the "
                    "built-in max semirings max_prod, max_abs and viterbi (and changes nothing for real, abs, "
                    "count, log, entropy); semiring '", base->name(), "' has no sum twin to run its nodes in. "
                    "Drop within_node_oplus, or run one of those semirings on its own (not in a product).");
  return std::make_shared<SummedWithinNodes>(base, make_semiring(twin, 1), signed_pair);
}

bool sums_within_nodes(const Semiring& semiring) { return dynamic_cast<const SummedWithinNodes*>(&semiring); }

std::vector<at::Tensor> apply_summed_within_node(Node& node, const Semiring& semiring, std::vector<bool> needed,
                                                 const std::vector<at::Tensor>& values, bool create_graph) {
  return static_cast<const SummedWithinNodes&>(semiring).apply(node, needed, values, create_graph);
}

}  // namespace torch_semiring
