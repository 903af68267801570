// Fused scaled-dot-product attention on CPU
// (_scaled_dot_product_flash_attention_for_cpu): one node, so one edge per
// (output element, input element) weighted by the TRUE derivative of the
// fused op — the paths inside it (scores, softmax, the value product) are
// summed in the reals, as its own backward does, not enumerated.
// With P = softmax(q kᵀ·scale + mask) (recomputed), out = P v:
//   ∂out[t,d]/∂v[s,d]    = P[t,s]
//   ∂out[t,d]/∂k[s,e]    = scale · q[t,e] · P[t,s] · (v[s,d] − out[t,d])
//   ∂out[t,d]/∂q[t,e]    = scale · (Σ_s P[t,s] v[s,d] k[s,e] − out[t,d] · (P k)[t,e])
//   ∂out[t,d]/∂mask[t,s] = P[t,s] · (v[s,d] − out[t,d])
// The k and mask weights factor through lift(a·b) = lift(a) ⊗ lift(b); the q
// weights form a D×E block per query row, contracted with the semiring matmul.
#include <torch/csrc/autograd/generated/Functions.h>

#include "rule.h"

namespace torch_semiring {

using at::Tensor;
using namespace torch::autograd::generated;

namespace {

// X[t,s] = ⊕_d g[t,d] ⊗ lift(v[s,d] − out[t,d]), a block of query rows at a time.
Tensor through_value_difference(const Semiring& sr, const Tensor& g, const Tensor& v, const Tensor& out) {
  const int64_t T = out.size(-2), S = v.size(-2), D = v.size(-1);
  const int64_t batch = out.numel() / std::max<int64_t>(T * D, 1);
  const int64_t chunk = std::max<int64_t>(1, (int64_t(1) << 22) / std::max<int64_t>(batch * S * D * g.size(0), 1));
  std::vector<Tensor> parts;
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t n = std::min(chunk, T - t0);
    auto diff = v.unsqueeze(-3) - out.narrow(-2, t0, n).unsqueeze(-2);      // (…, n, S, D)
    auto prod = sr.otimes_edge(g.narrow(-2, t0, n).unsqueeze(-2), diff);     // (C, …, n, S, D)
    parts.push_back(sr.oplus_reduce(prod, {prod.dim() - 2}, false));          // (C, …, n, S)
  }
  return at::cat(parts, -2);
}

// (C, …, H, S, E) with H = heads·group → (C, …, heads, S, E), ⊕ over the group.
Tensor fold_groups(const Semiring& sr, const Tensor& value, int64_t group) {
  if (group == 1) return value;
  auto shape = value.sizes().vec();
  const int64_t heads = shape[shape.size() - 3] / group;
  shape[shape.size() - 3] = group;
  shape.insert(shape.end() - 3, heads);
  auto grouped = value.reshape(shape);
  return sr.oplus_reduce(grouped, {grouped.dim() - 4}, false);
}

std::vector<Tensor> sdpa_cpu_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  auto& n = static_cast<ScaledDotProductFlashAttentionForCpuBackward0&>(ctx.node);
  TORCH_CHECK(n.dropout_p == 0.0, "torch_semiring: ", ctx.node.name(), " ran with dropout_p=", n.dropout_p,
              "; its dropout mask cannot be recomputed. Use model.eval() (dropout off) or "
              "attn_implementation='eager'.");
  TORCH_CHECK(grads.size() < 2 || !grads[1].defined(), "torch_semiring: values arriving at the logsumexp output of ",
              ctx.node.name(), " are not supported");
  const auto& sr = ctx.semiring;
  const Tensor& g = grads[0];
  auto q = ctx.unpack(n.query_), k = ctx.unpack(n.key_), v = ctx.unpack(n.value_);
  auto out = ctx.unpack(n.output_);
  auto mask = ctx.unpack(n.attn_mask_);
  // Grouped-query attention: every key/value head serves `group` query heads.
  // Work with the heads repeated; the values of a key/value element are then
  // ⊕-folded over its group (its edges to all those heads' outputs).
  TORCH_CHECK(q.dim() >= 3 && q.size(-3) % k.size(-3) == 0, "torch_semiring: ", ctx.node.name(), ": ",
              q.size(-3), " query heads cannot be grouped over ", k.size(-3), " key/value heads");
  const int64_t group = q.size(-3) / k.size(-3);
  if (group > 1) {
    k = k.repeat_interleave(group, -3);
    v = v.repeat_interleave(group, -3);
  }
  const double scale = n.scale.value_or(1.0 / std::sqrt(double(q.size(-1))));
  auto scores = at::matmul(q, k.transpose(-1, -2)) * scale;
  if (n.is_causal) {
    auto causal = at::ones({q.size(-2), k.size(-2)}, q.options().dtype(at::kBool)).tril();
    scores = scores.masked_fill(causal.logical_not(), -std::numeric_limits<double>::infinity());
  }
  if (mask.defined()) scores = mask.scalar_type() == at::kBool
                                   ? scores.masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity())
                                   : scores + mask;
  auto P = at::softmax(scores, -1);
  const auto scale_t = at::scalar_tensor(scale, q.options());
  std::vector<Tensor> result(std::max<size_t>(ctx.needed.size(), 3));
  if (ctx.needs(2)) result[2] = fold_groups(sr, sr.matmul(g.transpose(-1, -2), P).transpose(-1, -2), group);
  Tensor X;
  if (ctx.needs(1) || ctx.needs(3)) X = through_value_difference(sr, g, v, out);
  if (ctx.needs(1)) {
    auto Y = sr.otimes_edge(sr.otimes_edge(X, P), scale_t);
    result[1] = fold_groups(sr, sr.matmul(Y.transpose(-1, -2), q), group);
  }
  if (ctx.needs(3)) result[3] = sr.otimes_edge(X, P);
  if (ctx.needs(0)) {
    auto mixed = at::einsum("...ts,...sd,...se->...tde", {P, v, k});
    auto J = (mixed - out.unsqueeze(-1) * at::matmul(P, k).unsqueeze(-2)) * scale;  // (…, T, D, E)
    result[0] = sr.matmul(g.unsqueeze(-2), J).squeeze(-2);
  }
  return result;
}

// Fused attention backward nodes of CUDA builds: named, with the way out.
std::vector<Tensor> cuda_attention_unsupported(const RuleContext& ctx, const std::vector<Tensor>&) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "torch_semiring: ", ctx.node.name(), " (a CUDA fused attention kernel) "
                              "has no semiring rule yet. Load the model with attn_implementation='eager', or "
                              "run it on CPU where scaled_dot_product_attention has a rule.");
}

}  // namespace

void register_attention_rules() {
  register_rule("ScaledDotProductFlashAttentionForCpuBackward0", sdpa_cpu_rule, "attention");
  for (const char* name : {"ScaledDotProductFlashAttentionBackward0", "ScaledDotProductEfficientAttentionBackward0",
                           "ScaledDotProductCudnnAttentionBackward0", "FlashAttentionBackward0",
                           "EfficientAttentionBackward0"})
    register_rule(name, cuda_attention_unsupported, "attention (unsupported)");
}

}  // namespace torch_semiring
