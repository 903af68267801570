// The operations generated rules are written in (see generated_support.h).
#include "generated_support.h"

#include <ATen/ExpandUtils.h>

namespace torch_semiring {
namespace generated_rules {

namespace {
std::vector<int64_t> elements_of(const Tensor& v) { return v.sizes().slice(1).vec(); }
Tensor as_weight_for(const Tensor& v, const Tensor& w) {
  return w.scalar_type() == v.scalar_type() ? w : w.to(v.scalar_type());
}
}  // namespace

// A number becomes a 0-dim CPU tensor on purpose: ATen combines it with a
// value on any device as a scalar (no copy), as it does with C++ numbers.
Tensor weight_of(const Tensor& t) { return t; }
Tensor weight_of(const at::Scalar& s) { return at::scalar_tensor(s, at::TensorOptions(at::kDouble).device(at::kCPU)); }
Tensor weight_of(const c10::SymInt& s) { return weight_of(at::Scalar(s.expect_int())); }
Tensor weight_of(double s) { return weight_of(at::Scalar(s)); }
Tensor weight_of(int64_t s) { return weight_of(at::Scalar(s)); }
Tensor weight_of(int s) { return weight_of(at::Scalar(int64_t(s))); }
Tensor weight_of(float s) { return weight_of(at::Scalar(double(s))); }
Tensor reciprocal_weight(const Tensor& w) { return w.to(at::kDouble).reciprocal(); }

Tensor scale(const RuleContext& ctx, const Tensor& v, const Tensor& w) {
  TORCH_CHECK(at::is_expandable_to(w.sizes(), elements_of(v)), "torch_semiring: generated rule of ",
              ctx.node.name(), ": a weight of shape ", w.sizes(), " would broadcast a value of shape ",
              at::IntArrayRef(elements_of(v)));
  return ctx.semiring.otimes_edge(v, as_weight_for(v, w));
}

Tensor scale_top(const RuleContext& ctx, size_t input, const Tensor& v, const Tensor& w, bool holds_copies) {
  const auto V = elements_of(v);
  const auto broadcast = at::infer_size(V, w.sizes());
  const std::vector<int64_t> B(broadcast.begin(), broadcast.end());
  const auto In = ctx.input_shape(input);
  bool exact = true;
  if (holds_copies) {
    exact = B == In;
  } else {
    for (int64_t d = 1; d <= (int64_t)B.size(); ++d) {
      const int64_t b = B[B.size() - d];
      const int64_t vd = d <= (int64_t)V.size() ? V[V.size() - d] : 1;
      const int64_t in = d <= (int64_t)In.size() ? In[In.size() - d] : 1;
      if (b > 1 && vd != b && in != b) exact = false;
    }
  }
  TORCH_CHECK(exact, "torch_semiring: generated rule of ", ctx.node.name(), ": weights of shape ", w.sizes(),
              " on a value of shape ", at::IntArrayRef(V), " do not give one edge per element pair for input ",
              input, " of shape ", at::IntArrayRef(In), "; register a rule with ts.register_rule");
  return ctx.semiring.otimes_edge(v, as_weight_for(v, w));
}

Tensor exact_shape(const RuleContext& ctx, size_t input, const Tensor& v) {
  TORCH_CHECK(elements_of(v) == ctx.input_shape(input), "torch_semiring: generated rule of ", ctx.node.name(),
              " produced shape ", at::IntArrayRef(elements_of(v)), " for input ", input,
              "; register a rule with ts.register_rule");
  return v;
}

Tensor oplus_all(const RuleContext& ctx, const Tensor& v) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < v.dim() - 1; ++d) dims.push_back(d);
  return ctx.semiring.oplus_reduce(v, dims, /*keepdim=*/false);
}

Tensor oplus_sum_to(const RuleContext& ctx, const Tensor& v, at::IntArrayRef sizes) {
  return torch_semiring::oplus_sum_to(ctx.semiring, v, sizes, "the generated rule of " + ctx.node.name());
}
Tensor oplus_sum_to(const RuleContext& ctx, const Tensor& v, c10::SymIntArrayRef sizes) {
  return oplus_sum_to(ctx, v, C10_AS_INTARRAYREF_SLOW(sizes));
}

Tensor value_mm(const RuleContext& ctx, const Tensor& v, const Tensor& w) {
  return ctx.semiring.matmul(v, as_weight_for(v, w));
}

}  // namespace generated_rules
}  // namespace torch_semiring
