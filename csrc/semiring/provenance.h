// Path tracking over any selecting semiring (Semiring::selects): "Viterbi with
// back-pointers", written once. A value holds the E = C components of the
// base semiring's value, each followed by an id saying where it came from:
//     layout (2E, *S) = (component_0 … component_{E−1}, id_0 … id_{E−1})
// — a tagged value (selection.h). ⊕, ⊗ by an edge and ⊕-reductions are the
// base semiring's *_select operations, so ids travel with the entries they
// belong to (ties keep the left operand: the first contribution delivered
// wins). The engine's path recorder (paths/path_recorder.h) re-seeds ids at
// every node (with_origin) and tags them with the contribution they arrive as
// (tag_contributor); following them back from an input element walks the
// best path(s). ids are stored in the value's dtype: the recorder checks they
// stay exactly representable.
#pragma once
#include "selection.h"
#include "semiring.h"

#include "kernels/elementwise.h"

namespace torch_semiring {

class ProvenanceSemiring final : public Semiring {
 public:
  explicit ProvenanceSemiring(SemiringPtr base) : base_(std::move(base)), E_(base_->components()) {
    TORCH_CHECK_VALUE(base_->selects(), "torch_semiring: semiring '", base_->name(), "' has no paths to extract "
                      "(its ⊕ does not select one path; see Semiring::selects)");
  }
  const Semiring& base() const { return *base_; }
  std::string name() const override { return base_->name() + "+paths"; }
  int64_t components() const override { return 2 * E_; }
  bool selects_minimum() const override { return base_->selects_minimum(); }
  bool readout_lists_components() const override { return base_->readout_lists_components(); }
  bool tracks_origin() const override { return true; }
  int64_t origin_entries() const override { return E_; }
  Tensor readout(const Tensor& v) const override { return base_->readout(selection::scores(v, E_)); }
  // At kernel speed where the base has a kernel that reports winners; else
  // the generic blocked versions, composed from the tagged ops below.
  Tensor matmul(const Tensor& g, const Tensor& w) const override {
    auto fast = base_->matmul_select(g, w);
    return fast.defined() ? fast : Semiring::matmul(g, w);
  }
  Tensor norm_offdiagonal(const Tensor& a, const Tensor& x) const override {
    auto fast = base_->norm_offdiagonal_select(a, x);
    return fast.defined() ? fast : Semiring::norm_offdiagonal(a, x);
  }
  Tensor with_origin(const Tensor& v, int64_t first) const override {
    auto fast = kernels::origin_ids(v, E_, first);  // one pass (CPU)
    if (fast.defined()) return fast;
    auto elements = v.numel() / v.size(0);
    auto flat = at::arange(first, first + elements, v.options()).view(v.sizes().slice(1));
    std::vector<int64_t> entry_shape(v.dim(), 1);
    entry_shape[0] = E_;
    auto entry = at::arange(E_, v.options()).view(entry_shape);
    return selection::tagged(selection::scores(v, E_), flat.unsqueeze(0) * E_ + entry);
  }
  Tensor tag_contributor(const Tensor& v, int64_t e, int64_t n) const override {
    if (n == 1 && e == 0) return v;  // id·1 + 0: the only contributor keeps its ids (no copy)
    auto fast = kernels::tag_ids(v, E_, n, e);  // one pass (CPU)
    if (fast.defined()) return fast;
    auto ids = selection::tags(v, E_);
    return selection::tagged(selection::scores(v, E_), at::where(ids >= 0, ids * n + e, ids));
  }

 protected:
  Tensor no_path(const Tensor& scores) const {
    return selection::tagged(scores, at::full_like(scores, -1));
  }
  Tensor do_zero(at::IntArrayRef shape, const at::TensorOptions& o) const override {
    return no_path(base_->zero(shape, o));
  }
  Tensor do_one(at::IntArrayRef shape, const at::TensorOptions& o) const override {
    return no_path(base_->one(shape, o));
  }
  Tensor do_lift(const Tensor& w) const override { return do_otimes_edge(one(w.sizes(), w.options()), w); }
  Tensor do_otimes(const Tensor&, const Tensor&) const override {
    TORCH_CHECK(false, "torch_semiring: ", name(), " combines values with edges only (value ⊗ value has no "
                "single back-pointer); this rule needs a rule written with otimes_edge");
  }
  Tensor do_otimes_edge(const Tensor& a, const Tensor& w) const override { return base_->otimes_edge_select(a, w); }
  Tensor do_oplus(const Tensor& a, const Tensor& b) const override { return base_->oplus_select(a, b); }
  Tensor do_oplus_reduce(const Tensor& a, at::IntArrayRef dims, bool keepdim) const override {
    return base_->oplus_reduce_select(a, dims, keepdim);
  }

 private:
  SemiringPtr base_;
  int64_t E_;
};

}  // namespace torch_semiring
