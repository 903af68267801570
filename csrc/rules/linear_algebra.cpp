// Hand-written rules for contractions: mm, addmm, bmm, baddbmm, mv, addmv, dot.
// All are one helper — `contract` — on the semiring's matmul:
//   C = A·B   ⇒   v_A = g ⊗ Bᵀ,   v_B = (gᵀ ⊗ A)ᵀ     (⊗ = semiring matmul)
// and scalar factors (alpha, beta) are edge weights of their own:
// lift(αw) = lift(α) ⊗ lift(w) in every semiring we have.
#include <torch/csrc/autograd/generated/Functions.h>

#include "rule.h"
#include "../kernels/lift_cache.h"

namespace torch_semiring {

using at::Tensor;
using namespace torch::autograd::generated;
using torch::autograd::SavedVariable;

namespace {

// Values for A and B of C = A @ B (matrices or batches of them) from the value
// g of C. Saved operands exist only when the other side needs them. The
// operand is a tensor the node saved: when it is a leaf (a parameter, frozen
// or between optimizer steps) the semiring kernels keep what they prepare
// from it for the next call (kernels/lift_cache.h).
Tensor value_of_lhs(const Semiring& sr, const Tensor& g, const Tensor& b) {
  kernels::SavedOperandScope saved;
  return sr.matmul(g, b.transpose(-1, -2));
}
Tensor value_of_rhs(const Semiring& sr, const Tensor& g, const Tensor& a) {
  kernels::SavedOperandScope saved;
  return sr.matmul(g.transpose(-1, -2), a).transpose(-1, -2);
}

Tensor scaled(const Semiring& sr, const Tensor& v, const at::Scalar& factor) {
  if (factor.equal(1)) return v;
  return sr.otimes_edge(v, at::scalar_tensor(factor, v.options()));
}

// out = beta·self + alpha·(A @ B), for addmm / baddbmm (self first, then A, B).
std::vector<Tensor> scaled_contraction(const RuleContext& ctx, const Tensor& g, const at::Scalar& beta,
                                       const at::Scalar& alpha, SavedVariable& a, SavedVariable& b) {
  const auto& sr = ctx.semiring;
  std::vector<Tensor> out(3);
  if (ctx.needs(0)) out[0] = scaled(sr, g, beta);
  if (ctx.needs(1)) out[1] = scaled(sr, value_of_lhs(sr, g, ctx.unpack(b)), alpha);
  if (ctx.needs(2)) out[2] = scaled(sr, value_of_rhs(sr, g, ctx.unpack(a)), alpha);
  return out;
}

std::vector<Tensor> contraction(const RuleContext& ctx, const Tensor& g, SavedVariable& a, SavedVariable& b) {
  std::vector<Tensor> out(2);
  if (ctx.needs(0)) out[0] = value_of_lhs(ctx.semiring, g, ctx.unpack(b));
  if (ctx.needs(1)) out[1] = value_of_rhs(ctx.semiring, g, ctx.unpack(a));
  return out;
}

std::vector<Tensor> mm_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  auto& n = static_cast<MmBackward0&>(ctx.node);
  return contraction(ctx, grads[0], n.self_, n.mat2_);
}
std::vector<Tensor> bmm_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  auto& n = static_cast<BmmBackward0&>(ctx.node);
  return contraction(ctx, grads[0], n.self_, n.mat2_);
}
std::vector<Tensor> addmm_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  auto& n = static_cast<AddmmBackward0&>(ctx.node);
  return scaled_contraction(ctx, grads[0], n.beta, n.alpha, n.mat1_, n.mat2_);
}
std::vector<Tensor> baddbmm_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  auto& n = static_cast<BaddbmmBackward0&>(ctx.node);
  return scaled_contraction(ctx, grads[0], n.beta, n.alpha, n.batch1_, n.batch2_);
}

// Matrix-vector products are matrix products with a unit dim added to g and to
// the vector: mv(A, x) = (A @ x[:, None])[:, 0].
std::vector<Tensor> matrix_vector(const RuleContext& ctx, const Tensor& g, size_t mat_slot,
                                  SavedVariable& mat, SavedVariable& vec, const at::Scalar& alpha) {
  const auto& sr = ctx.semiring;
  std::vector<Tensor> out(mat_slot + 2);
  auto g2 = g.unsqueeze(-1);  // (C, M, 1)
  if (ctx.needs(mat_slot)) out[mat_slot] = scaled(sr, value_of_lhs(sr, g2, ctx.unpack(vec).unsqueeze(-1)), alpha);
  if (ctx.needs(mat_slot + 1))
    out[mat_slot + 1] = scaled(sr, value_of_rhs(sr, g2, ctx.unpack(mat)).squeeze(-1), alpha);
  return out;
}
std::vector<Tensor> mv_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  auto& n = static_cast<MvBackward0&>(ctx.node);
  return matrix_vector(ctx, grads[0], 0, n.self_, n.vec_, 1);
}
std::vector<Tensor> addmv_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  auto& n = static_cast<AddmvBackward0&>(ctx.node);
  auto out = matrix_vector(ctx, grads[0], 1, n.mat_, n.vec_, n.alpha);
  if (ctx.needs(0)) out[0] = scaled(ctx.semiring, grads[0], n.beta);
  return out;
}
// dot(x, y): each x[k] has one edge, weight y[k], to the scalar output.
std::vector<Tensor> dot_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  auto& n = static_cast<DotBackward0&>(ctx.node);
  const auto& sr = ctx.semiring;
  auto g = grads[0].unsqueeze(-1);  // (C, 1)
  std::vector<Tensor> out(2);
  if (ctx.needs(0)) out[0] = sr.otimes_edge(g, ctx.unpack(n.tensor_));
  if (ctx.needs(1)) out[1] = sr.otimes_edge(g, ctx.unpack(n.self_));
  return out;
}

}  // namespace

void register_linear_algebra_rules() {
  register_rule("MmBackward0", mm_rule, "matmul");
  register_rule("BmmBackward0", bmm_rule, "matmul");
  register_rule("AddmmBackward0", addmm_rule, "matmul");
  register_rule("BaddbmmBackward0", baddbmm_rule, "matmul");
  register_rule("MvBackward0", mv_rule, "matmul");
  register_rule("AddmvBackward0", addmv_rule, "matmul");
  register_rule("DotBackward0", dot_rule, "matmul");
}

}  // namespace torch_semiring
