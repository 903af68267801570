// The operations a generated rule (build/generated/generated_rules.cpp, from
// tools/gen_semiring_rules.py) is written in: a derivatives.yaml formula
// rewritten over semiring VALUES (shape (C, *S)) uses only these — as
// PyTorch's generated Functions.cpp uses FunctionsManual.cpp. Every check
// names the node and the way out (register a rule with ts.register_rule).
#pragma once

#include <torch/csrc/autograd/generated/Functions.h>

#include <utility>
#include <vector>

#include "rule.h"

namespace torch_semiring {
namespace generated_rules {

using at::Tensor;

// Edge weights: a formula's factor E as a plain tensor.
Tensor weight_of(const Tensor& t);
Tensor weight_of(const at::Scalar& s);
Tensor weight_of(const c10::SymInt& s);
Tensor weight_of(double s);
Tensor weight_of(int64_t s);
Tensor weight_of(int s);
Tensor weight_of(float s);
// 1/E for `grad / E` (the node computes g / E; its edge weight is 1/E).
Tensor reciprocal_weight(const Tensor& w);

// v ⊗ lift(w) inside a formula: w may not broadcast v up (each element of v
// must stay one vertex).
Tensor scale(const RuleContext& ctx, const Tensor& v, const Tensor& w);
// v ⊗ lift(w) as a formula's result: it may broadcast to the forward's
// broadcast shape B, which the engine then ⊕-reduces to the input's shape —
// exact only if every position of B is a distinct (output, input) element
// pair, else the stock formula sums several terms into ONE edge (checked).
Tensor scale_top(const RuleContext& ctx, size_t input, const Tensor& v, const Tensor& w, bool holds_copies);
// A value holding copies of one grad element must already have the input's
// shape: ⊕-reducing copies is not what the stock sum does (checked).
Tensor exact_shape(const RuleContext& ctx, size_t input, const Tensor& v);

// Gathers (each result element copies one element, weight 1): every
// component moved the same way.
template <class F>
Tensor move_each(const RuleContext&, const Tensor& v, F&& f) {
  std::vector<Tensor> parts;
  for (int64_t c = 0; c < v.size(0); ++c) parts.push_back(f(v.select(0, c)));
  return at::stack(parts);
}
// Moves that write numeric zeros: a written zero is "no edge", so it becomes
// the semiring zero where moving ones reaches nothing (zero_where_unreached).
template <class F>
Tensor move_masked(const RuleContext& ctx, const Tensor& v, F&& f) {
  auto moved = move_each(ctx, v, f);
  if (ctx.semiring.zero_is_numeric_zero()) return moved;
  return zero_where_unreached(ctx.semiring, moved, f(at::ones(v.sizes().slice(1), v.options())));
}

// X.sum(): ⊕ over all elements (each a distinct path).
Tensor oplus_all(const RuleContext& ctx, const Tensor& v);
// sum_to(X, sizes): ⊕ over the broadcast dims (the semiring's oplus_sum_to).
Tensor oplus_sum_to(const RuleContext& ctx, const Tensor& v, c10::SymIntArrayRef sizes);
Tensor oplus_sum_to(const RuleContext& ctx, const Tensor& v, at::IntArrayRef sizes);
// out[.., m, n] = ⊕_k v[.., m, k] ⊗ lift(w[.., k, n]): the semiring matmul.
Tensor value_mm(const RuleContext& ctx, const Tensor& v, const Tensor& w);

}  // namespace generated_rules
}  // namespace torch_semiring
