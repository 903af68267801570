// Hand-written rules for contractions: mm, addmm, bmm, baddbmm, mv, addmv, dot,
// _grouped_mm.
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

// torch._grouped_mm(A, B, offs): one matrix product per group, the groups cut
// by the cumulative end offsets `offs` (G,) along one dim (transformers' MoE
// experts kernel). Each group is a plain contraction of its slices, so its
// values are the semiring matmul of those slices — no dense block-diagonal
// matrix is ever formed. Elements no group covers (past offs[G-1]; an empty
// group's expert matrix) have no edge: the semiring zero.
//   A (M, K),    B (G, K, N): groups of rows of A / of the output (M, N)
//   A (G, M, K), B (K, N):    groups of columns of B / of the output (M, N)
//   A (M, K),    B (K, N):    groups of the contraction dim K; output (G, M, N)
//   A (G, M, K), B (G, K, N): no offs, a batched product (bmm)
// Cost: that of the G slice products, O(M·K·N) semiring work in all; the G
// offsets are read to the host once per call (group sizes are data, as in
// the op's own CPU kernel).
std::vector<Tensor> grouped_mm_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  auto& n = static_cast<GroupedMmBackward0&>(ctx.node);
  const auto& sr = ctx.semiring;
  const Tensor& g = grads[0];
  std::vector<Tensor> out(2);
  const bool need_a = ctx.needs(0), need_b = ctx.needs(1);
  if (!g.defined() || !(need_a || need_b)) return out;
  const Tensor a = ctx.unpack(n.self_), b = ctx.unpack(n.mat2_);
  const Tensor offs = ctx.unpack(n.offs_);
  if (!offs.defined()) {  // 3-D x 3-D: a batched product
    TORCH_CHECK(a.dim() == 3 && b.dim() == 3, "torch_semiring: GroupedMmBackward0 without offsets expects 3-D "
                "operands, got ", a.sizes(), " and ", b.sizes());
    return contraction(ctx, g, n.self_, n.mat2_);
  }
  const auto ends = offs.to(at::kCPU, at::kLong).contiguous();
  const int64_t* end = ends.const_data_ptr<int64_t>();
  const int64_t G = ends.numel();
  const auto opts = g.options();
  const bool a2 = a.dim() == 2, b2 = b.dim() == 2;
  TORCH_CHECK(a2 || b2, "torch_semiring: GroupedMmBackward0 with offsets expects a 2-D operand, got ", a.sizes(),
              " and ", b.sizes());
  // The extent cut by offs: rows of A (2-D x 3-D), columns of B (3-D x 2-D), K (2-D x 2-D).
  const int64_t extent = a2 && !b2 ? a.size(0) : (!a2 && b2 ? b.size(1) : a.size(1));
  std::vector<Tensor> a_parts, b_parts;
  int64_t start = 0;
  auto covered = [&](int64_t e) { return std::min(std::max(e, start), extent); };
  for (int64_t i = 0; i < G; ++i) {
    const int64_t stop = covered(end[i]);
    if (a2 && !b2) {  // rows [start, stop) of A and of g use B[i]
      const Tensor gi = g.slice(1, start, stop), bi = b[i];
      if (need_a && stop > start) a_parts.push_back(value_of_lhs(sr, gi, bi));
      if (need_b) b_parts.push_back(stop > start ? value_of_rhs(sr, gi, a.slice(0, start, stop))
                                                 : sr.zero(bi.sizes(), opts));
    } else if (!a2 && b2) {  // columns [start, stop) of B and of g use A[i]
      const Tensor gi = g.slice(2, start, stop), ai = a[i];
      if (need_a) a_parts.push_back(stop > start ? value_of_lhs(sr, gi, b.slice(1, start, stop))
                                                 : sr.zero(ai.sizes(), opts));
      if (need_b && stop > start) b_parts.push_back(value_of_rhs(sr, gi, ai));
    } else {  // contraction indices [start, stop): out[i] = A[:, ks] @ B[ks, :]
      const Tensor gi = g.select(1, i);
      if (stop == start) continue;  // an empty group: out[i] has no edge (start stays)
      if (need_a) a_parts.push_back(value_of_lhs(sr, gi, b.slice(0, start, stop)));
      if (need_b) b_parts.push_back(value_of_rhs(sr, gi, a.slice(1, start, stop)));
    }
    start = stop;
  }
  // What no group covers: the semiring zero.
  auto rest = [&](std::vector<int64_t> shape, int64_t dim) {
    shape[dim] = extent - start;
    return sr.zero(shape, opts);
  };
  // Element dims (after the component dim) along which the parts join.
  const int64_t a_dim = a2 ? (b2 ? 2 : 1) : 1, b_dim = b2 ? (a2 ? 1 : 2) : 1;
  if (need_a) {
    if (a2) a_parts.push_back(rest(a.sizes().vec(), a_dim - 1));
    out[0] = a2 ? at::cat(a_parts, a_dim) : at::stack(a_parts, a_dim);
  }
  if (need_b) {
    if (b2) b_parts.push_back(rest(b.sizes().vec(), b_dim - 1));
    out[1] = b2 ? at::cat(b_parts, b_dim) : at::stack(b_parts, b_dim);
  }
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
  register_rule("GroupedMmBackward0", grouped_mm_rule, "matmul");
}

}  // namespace torch_semiring
