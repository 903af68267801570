// The semiring interface every rule and the engine are written against.
//
// Value convention (torch-struct's): the semiring value of a tensor of shape S
// is ONE tensor of shape (C, *S), its C components stacked along a leading
// dimension (C = 1 for real/log/…, 2 for the max_prod and entropy pairs, k for
// kmax). An undefined at::Tensor stands for "semiring zero everywhere" and lets
// the engine skip work for unreached tensors.
//
// A concrete semiring implements the element-wise primitives (do_*). Matrix
// products and scatters have generic defaults composed from those primitives
// (blocked, so no M·K·N temporary is ever built); a semiring overrides them
// only when it has something faster.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

namespace torch_semiring {

using at::Tensor;

class Semiring {
 public:
  virtual ~Semiring() = default;

  virtual std::string name() const = 0;
  // Number of stacked components C of a value.
  virtual int64_t components() const = 0;
  // True when the zero is 0 in every component, so "fill with zeros" (what a
  // stock backward does for unreached positions) is already the semiring zero.
  virtual bool zero_is_numeric_zero() const { return false; }
  // True when values are exactly ordinary gradients (the real semiring): the
  // engine then runs every node's own stock backward instead of its rule.
  virtual bool stock_backward_is_exact() const { return false; }
  // The components that live in [0, +∞] with ⊗ = × and 0 annihilating (abs,
  // count, max_abs: all of theirs; a product: its such parts'; else none). A
  // value there can overflow to +∞ on a deep model (float32 path counts of a
  // 6-layer transformer do), and inside a rule IEEE 0·∞ would turn "no path"
  // into NaN; apply_rule (rules/registry.cpp) then splits the +∞ entries off,
  // so no rule ever sees one. (An infinite local derivative, sqrt at 0,
  // meeting a zero value is NaN as in stock.)
  virtual std::vector<bool> infinite_split_components() const { return {}; }
  // True when a ⊗ lift(w) = a·|w| for every value a rule meets: one
  // component in [0, ∞) (+∞ split off, above) with 0 annihilating (abs,
  // max_abs). Element-wise rules then run the node's backward on the value
  // itself and take |·| (rules/families.cpp: diagonal_by_scaled_backward).
  virtual bool edge_scales_magnitude() const { return false; }
  // The dtype a value travels in along an edge into a tensor of `tensor_dtype`:
  // the tensor's (as a gradient would) for real and for float32/float64, at
  // least float32 for bf16/fp16 tensors in every other semiring — log-space
  // scores, path counts and sums of |path products| in bf16 would keep 8 bits
  // of a sum over millions of paths. Weights stay in the tensors' dtype (the
  // rules' arithmetic promotes them).
  at::ScalarType value_dtype(at::ScalarType tensor_dtype) const {
    const bool reduced = tensor_dtype == at::kBFloat16 || tensor_dtype == at::kHalf;
    return reduced && !stock_backward_is_exact() ? at::kFloat : tensor_dtype;
  }

  // ---- element-wise primitives; all shapes broadcast over element dims -----
  Tensor zero(at::IntArrayRef shape, const at::TensorOptions& opts) const;
  Tensor one(at::IntArrayRef shape, const at::TensorOptions& opts) const;
  // Edge weight of a local derivative w (a plain tensor): (C, *w.shape).
  // lift(0) is always the zero: a zero-weight edge does not exist.
  Tensor lift(const Tensor& w) const { return do_lift(w); }
  Tensor otimes(const Tensor& a, const Tensor& b) const;
  // a ⊗ lift(w) for a value a and a plain local-derivative tensor w.
  Tensor otimes_edge(const Tensor& a, const Tensor& w) const;
  Tensor oplus(const Tensor& a, const Tensor& b) const;
  // ⊕ over element dims `dims` (0-based, not counting the component dim).
  Tensor oplus_reduce(const Tensor& a, at::IntArrayRef dims, bool keepdim) const;
  // What the user sees per element: shape S (kmax: (*S, k)).
  virtual Tensor readout(const Tensor& v) const = 0;

  // ---- selection: the semirings whose ⊕ picks, path tracking -------------
  // A selecting semiring's ⊕ returns, for every component, one of its
  // operands' components (max, min, a top-k merge): it says which operand
  // wins, as torch-struct's sparse_sum returns the argmax beside the max. Then
  // the generic path-tracking wrapper (provenance.h) follows the best paths of
  // it with no code of its own. The *_select operations work on TAGGED values
  // (selection.h): (2C, *S) = the C components, then one tag per component,
  // and every result component carries the tag of the candidate it is. The
  // defaults select component by component — result component c is a's or
  // b's component c, the first in element order on ties — which is what
  // viterbi, max_abs, max_prod and min_plus need; kmax (whose ⊕ merges lists)
  // overrides them, and a semiring with a faster pass (a fused kernel, an
  // argmax GEMM) overrides one with it.
  virtual bool selects() const { return false; }
  // Selecting semirings whose best is the smallest (min_plus): paths rank ascending.
  virtual bool selects_minimum() const { return false; }
  // True when readout() lists the components beside the element dims (kmax:
  // (*S, k)), so a readout does not fit a tensor's .grad.
  virtual bool readout_lists_components() const { return false; }
  // Tagged a ⊕ b (ties keep a's entries).
  virtual Tensor oplus_select(const Tensor& a, const Tensor& b) const;
  // Tagged a ⊗ lift(w): each tag stays with its component (max_prod swaps
  // its pair on a negative edge, and drops the tags of emptied entries).
  virtual Tensor otimes_edge_select(const Tensor& a, const Tensor& w) const;
  // Tagged ⊕ over value dims `dims` (1-based, sorted: the do_oplus_reduce convention).
  virtual Tensor oplus_reduce_select(const Tensor& a, at::IntArrayRef dims, bool keepdim) const;
  // The same products as matmul / norm_offdiagonal on tagged values, from
  // kernels that report their winners; undefined where none applies (the
  // wrapper then composes the generic versions from the ops above).
  virtual Tensor matmul_select(const Tensor& g, const Tensor& w) const { return {}; }
  virtual Tensor norm_offdiagonal_select(const Tensor& a, const Tensor& x) const { return {}; }

  // ---- path provenance (the wrapper of provenance.h) ------------------------
  // A provenance value carries, beside each of its E selected entries, the id
  // of where that entry came from, so the best paths can be followed back.
  virtual bool tracks_origin() const { return false; }
  virtual int64_t origin_entries() const { return 0; }
  // ids := (first + flat element index)·E + entry: "I am element o of this node".
  virtual Tensor with_origin(const Tensor& v, int64_t first) const;
  // ids := ids·n + e: "and I arrived as contribution e of n into this buffer".
  virtual Tensor tag_contributor(const Tensor& v, int64_t e, int64_t n) const;

  // ---- composite operations (generic defaults) -----------------------------
  // g: (C, *batch, M, K) value, w: (*batch, K, N) plain tensor →
  // (C, *batch, M, N) with out[m,n] = ⊕_k g[m,k] ⊗ lift(w[k,n]).
  virtual Tensor matmul(const Tensor& g, const Tensor& w) const;
  // The same for a w known to be ≥ 0 (attention's probabilities): a semiring
  // whose lift is w itself there (abs: |w| = w) skips the lift's pass.
  virtual Tensor matmul_nonnegative(const Tensor& g, const Tensor& w) const { return matmul(g, w); }
  // src: (C, n) values, index: (n,) int64 into [0, numel) →
  // (C, numel) with out[i] = ⊕_{j: index[j]=i} src[j] (zero where none).
  virtual Tensor scatter_oplus(const Tensor& src, const Tensor& index, int64_t numel) const;
  // out[j] = ⊕_{i≠j} v[i] along element dim `dim` ("all but me": the
  // off-diagonal part of softmax-like Jacobians). The default is a prefix and
  // a suffix scan (log-step doubling, binary ⊕ only), so it needs no inverse
  // of ⊕; semirings with a cheaper exact form override it.
  virtual Tensor exclusive_oplus(const Tensor& v, int64_t dim) const;
  // The off-diagonal part of centred normalisation Jacobians (layer norm,
  // batch norm with batch statistics), row by row: a (C, R, N) value, x (R, N)
  // plain tensor →
  //     out[r, j] = ⊕_{i ≠ j} a[r, i] ⊗ lift(1 + x[r, i] · x[r, j]).
  // The default builds each row's N×N block, a chunk of rows at a time,
  // through matmul (O(N²) a row, memory included); the built-in semirings use
  // kernels/norm_rows instead (O(N log N) a row; entropy's |y| log|y| term
  // O(N²) work but no block).
  virtual Tensor norm_offdiagonal(const Tensor& a, const Tensor& x) const;
  // Inclusive scan along element dim `dim`: out[j] = ⊕_{i≤j} v[i], or with
  // reverse ⊕_{i≥j} v[i] (cumsum's Jacobian). The default is the log-step
  // doubling scan exclusive_oplus uses (binary ⊕ only).
  virtual Tensor prefix_oplus(const Tensor& v, int64_t dim, bool reverse = false) const;

 protected:
  virtual Tensor do_zero(at::IntArrayRef shape, const at::TensorOptions& opts) const = 0;
  virtual Tensor do_one(at::IntArrayRef shape, const at::TensorOptions& opts) const = 0;
  virtual Tensor do_lift(const Tensor& w) const = 0;
  virtual Tensor do_otimes(const Tensor& a, const Tensor& b) const = 0;
  virtual Tensor do_otimes_edge(const Tensor& a, const Tensor& w) const { return do_otimes(a, do_lift(w)); }
  virtual Tensor do_oplus(const Tensor& a, const Tensor& b) const = 0;
  virtual Tensor do_oplus_reduce(const Tensor& a, at::IntArrayRef value_dims, bool keepdim) const = 0;
};

using SemiringPtr = std::shared_ptr<const Semiring>;

// ---- helpers shared by semirings, rules and the engine ----------------------

// View of a plain tensor t with leading singleton dims so it has `rank` dims.
Tensor pad_rank(const Tensor& t, int64_t rank);
// The same for a value: element rank raised to `rank`, component dim kept first.
Tensor pad_value_rank(const Tensor& v, int64_t rank);
// Element dims of a value, shifted past the component dim.
std::vector<int64_t> value_dims(at::IntArrayRef element_dims);
// Splits a value into its components (each of element shape).
std::vector<Tensor> components_of(const Tensor& v);
// A full tensor of shape (C, *shape) holding `per_component[c]` in component c.
Tensor constant_value(const std::vector<double>& per_component, at::IntArrayRef shape,
                      const at::TensorOptions& opts);

// The semiring sum_to: ⊕ over the broadcast dims of a value of element shape
// S down to `shape` (S must be `shape` broadcast), as the stock engine's
// InputMetadata::reduce_grad sums a gradient. `who` names the caller in the
// error raised when S does not reduce to `shape`.
Tensor oplus_sum_to(const Semiring& sr, const Tensor& value, at::IntArrayRef shape, const std::string& who);

// Name → semiring. `k` is the kmax parameter (ignored elsewhere).
SemiringPtr make_semiring(const std::string& name, int64_t k);
std::vector<std::string> semiring_names();
// One pass for several semirings: values are the parts concatenated along dim 0.
SemiringPtr make_product(std::vector<SemiringPtr> parts);
// A selecting semiring (Semiring::selects) with origin ids for path
// extraction: the named one (k: kmax's parameter) wrapped by provenance.h.
SemiringPtr make_provenance(const std::string& base, int64_t k);
std::vector<Tensor> split_product_value(const Semiring& product, const Tensor& v);
std::vector<SemiringPtr> product_parts(const Semiring& s);

}  // namespace torch_semiring
