// softmax, _safe_softmax and log_softmax: per row, a Jacobian that is a
// diagonal plus a rank-1 part,
//     J[i, j] = δ_ij · diag_j + (1 − δ_ij) · a_i · b_j
//     softmax:      diag = y(1 − y),  a = y,  b = −y
//     log_softmax:  diag = 1 − p,     a = 1,  b = −p      (p = exp(y))
// so the value of input j is, without materialising J,
//     v_j = (g_j ⊗ lift(diag_j)) ⊕ (lift(b_j) ⊗ ⊕_{i≠j} g_i ⊗ lift(a_i)),
// using lift(a·b) = lift(a) ⊗ lift(b) and the semiring's "all but me" ⊕.
#include <torch/csrc/autograd/generated/Functions.h>

#include "rule.h"

namespace torch_semiring {

using at::Tensor;
using namespace torch::autograd::generated;

namespace {

Tensor diagonal_plus_rank1(const Semiring& sr, const Tensor& g, const Tensor& diag, const Tensor& a,
                           const Tensor& b, int64_t dim) {
  auto through_a = a.defined() ? sr.otimes_edge(g, a) : g;
  auto off_diagonal = sr.otimes_edge(sr.exclusive_oplus(through_a, dim), b);
  return sr.oplus(sr.otimes_edge(g, diag), off_diagonal);
}

template <class N>
std::vector<Tensor> softmax_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  if (!ctx.needs(0)) return {};
  auto& n = static_cast<N&>(ctx.node);
  auto y = ctx.unpack(n.result_);
  return {diagonal_plus_rank1(ctx.semiring, grads[0], y * (1 - y), y, -y, n.dim)};
}

std::vector<Tensor> log_softmax_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  if (!ctx.needs(0)) return {};
  auto& n = static_cast<LogSoftmaxBackward0&>(ctx.node);
  auto p = ctx.unpack(n.result_).exp();
  return {diagonal_plus_rank1(ctx.semiring, grads[0], 1 - p, Tensor(), -p, n.dim)};
}

}  // namespace

void register_softmax_rules() {
  register_rule("SoftmaxBackward0", softmax_rule<SoftmaxBackward0>, "softmax");
  register_rule("SafeSoftmaxBackward0", softmax_rule<SafeSoftmaxBackward0>, "softmax");
  register_rule("LogSoftmaxBackward0", log_softmax_rule, "softmax");
}

}  // namespace torch_semiring
