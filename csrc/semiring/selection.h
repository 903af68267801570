// Tagged values of selecting semirings (Semiring::selects) and the shared
// steps of their *_select operations.
//
// A tagged value is (2C, *S): the C components of a value, then one tag per
// component (path tracking's origin ids, provenance.h), stored in the value's
// dtype as exact integers; a tag of −1 means "no path". A selection copies
// the tag of the candidate each result component is: nothing here looks at
// a tag, so the same steps serve any selecting semiring.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <tuple>

namespace torch_semiring::selection {

using at::Tensor;

inline Tensor scores(const Tensor& v, int64_t C) { return v.narrow(0, 0, C); }
inline Tensor tags(const Tensor& v, int64_t C) { return v.narrow(0, C, C); }
inline Tensor tagged(const Tensor& scores, const Tensor& tags) { return at::cat({scores, tags}, 0); }

// The tagged result of a kernel that reported winners: values (C, *B, M, N),
// winner (integer, same shape; w = k·C + entry: entry `entry` of candidate k,
// −1 for no path) and the candidates' tags (C, *B, M, K), any strides →
// (2C, *B, M, N). One pass on the CPU (kernels::winners_with_ids), else a gather.
Tensor with_winner_tags(const Tensor& values, const Tensor& winner, const Tensor& tags, int64_t C);

// A tagged product g (2C, *batch, M, K) ⊕⊗ w (*batch, K, N) by a kernel that
// reports winners: kernel(scores, w) → (values, winner) as with_winner_tags
// takes them, or undefined tensors where it declines. Undefined when the
// operands are not the kernel's (dtype, or off the CPU unless `on_device`),
// do not broadcast, or the product is empty.
using WinnerKernel = std::function<std::tuple<Tensor, Tensor>(const Tensor& scores, const Tensor& w)>;
Tensor matmul_by_winners(const Tensor& g, const Tensor& w, int64_t C, bool on_device, const WinnerKernel& kernel);

// A value (or tagged value) with the value dims `dims` (1-based, ascending)
// moved last and flattened into one: (components, *kept, R); and back, the
// reduced dims dropped or (keepdim) kept as size 1.
Tensor reduced_last(const Tensor& a, at::IntArrayRef dims);
Tensor reduced_result(Tensor out, at::IntArrayRef dims, bool keepdim);

// A tagged ⊕ over value dims `dims` (1-based) by picking, per result
// component, one of the reduced elements: pick(scores (C, *kept, R)) → int64
// (C, *kept, 1), the reduced element (row-major over `dims`) that component
// is. The reduced dims are moved last and flattened; scores and tags are
// gathered by the pick.
using Pick = std::function<Tensor(const Tensor& scores)>;
Tensor reduce_by_pick(const Tensor& a, at::IntArrayRef dims, bool keepdim, int64_t C, const Pick& pick);

}  // namespace torch_semiring::selection

namespace torch_semiring::selection {

// ---- the max selections (viterbi, max_abs: one component, ⊕ = max) ----------

// The first maximum of each row of reduced elements (deterministic ties).
inline Tensor first_max(const Tensor& scores) { return scores.argmax(-1, /*keepdim=*/true); }
// The max-plus (`times` false) or max-times product of a tagged g by w with
// the argmax GEMM kernels (CPU, or a device they route to), where their
// preconditions hold: finite w, no +∞ (or NaN) in g, max-times g ≥ 0.
Tensor max_matmul_select(bool times, const Tensor& g, const Tensor& w);
// The off-diagonal normalisation product of a tagged a (kernels::max_rows).
Tensor max_rows_select(bool log_space, const Tensor& a, const Tensor& x);

}  // namespace torch_semiring::selection
