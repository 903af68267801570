// Fused scaled-dot-product attention on CPU
// (_scaled_dot_product_flash_attention_for_cpu): one node, so one edge per
// (output element, input element) weighted by the TRUE derivative of the
// fused op — the paths inside it (scores, softmax, the value product) are
// summed in the reals, as its own backward does, not enumerated. The node has
// three next edges (query, key, value); its mask is not differentiable.
//
// Per batch·head, with P = exp(q kᵀ·scale + mask − logsumexp) (the saved
// logsumexp, as the stock backward recomputes it: a fully masked row has
// P = 0 and out = 0, so no edges), out = P v, and the softmax-weighted value
// differences (exactly the stock backward's dS for a one-hot grad at (t, d))
//     W[t,d,s] = P[t,s] · Δ[t,d,s],   Δ[t,d,s] = v[s,d] − out[t,d]:
//   ∂out[t,d]/∂v[s,d] = P[t,s]
//   ∂out[t,d]/∂k[s,e] = scale · q[t,e] · W[t,d,s]
//   ∂out[t,d]/∂q[t,e] = scale · J_t[d,e],   J_t = W_t K  (W_t: D×S, K: S×E)
// so, with g the values arriving at out,
//   v:  ⊕_t g[t,d] ⊗ lift(P[t,s])                      one semiring matmul
//   k:  ⊕_t X[t,s] ⊗ lift(scale·q[t,e]),  X = Y ⊗ lift(P),
//       Y[t,s] = ⊕_d g[t,d] ⊗ lift(Δ[t,d,s])           row products (below)
//   q:  ⊕_d g[t,d] ⊗ lift(scale·J_t[d,e])              row products
// J is formed as W (T·D × S) times K, one ordinary GEMM per block of query
// rows — not as Σ_s P v k − out·(P k): that factorisation turns exact zeros of
// the stock derivative (tied values: v[s,d] = out[t,d]) into rounding noise,
// i.e. edges that do not exist. For the same reason K enters with its first
// key subtracted (K − 1·k_0ᵀ): Σ_s W[t,d,s] = out − out·Σ_s P = 0, so J is
// unchanged mathematically, and a key coordinate e that every key shares
// (k[s,e] = k[0,e]: a derivative that is exactly 0) gives J[·,e] = 0 exactly
// instead of the GEMM's rounding of c·Σ_s W (which made count/log see an edge). Grouped-query heads: every key/value head
// serves `group` query heads; their query rows are stacked along the
// contraction of the k and v products, so those ⊕ over the group for free.
//
// Exactness: every weight is formed as the stock backward forms it (P from
// the saved logsumexp, Δ as v − out, W = P·Δ, J by a GEMM), so the values
// agree with ⊕_o g_o ⊗ lift(J[o, e]) up to rounding, and an edge is missing
// exactly where the stock derivative is 0 — except where a product
// underflows to 0 in one order of multiplication and not the other
// (lift(W)·lift(q) here vs fl(W·q) there).
//
// "Row products" out[r,n] = ⊕_k g[r,k] ⊗ lift(w[r,k,n]) (a vector–matrix
// product per query row, no factorisation for a general semiring). Two routes:
//   - kernels::attention_value_blocks (CPU, float/double, the built-in
//     semirings and the viterbi / max_abs / kmax path versions): one pass per block of query rows forms Δ on the fly for Y,
//     writes W for the GEMM and applies ⊗ lift(P); a second pass runs Q's row
//     products over the block's J; in linear space with an exp-shift, see
//     kernels/attention_blocks.cpp;
//   - value_blocks_by_parts (any device or semiring: product, max_prod /
//     min_plus provenance, Python, reduced precision): the same blocks from ATen pieces, the row
//     products by kernels::attention_row_products where the semiring has a
//     loop, else by the semiring's matmul with M = 1 batched over the rows.
//     On a device a block is every head and query row at once (a few dozen
//     launches per node instead of ~1 250 and 66 host reads for a 4 × 512
//     decoder's per-head, cache-sized blocks: 3–5× faster on an H100).
//
// Cost per batch·head (T queries, S keys, D = E head dim): the GEMM for J,
// T·D·S·E multiply-adds — the dominant term (the stock backward does
// ~4·T·S·D; at D = 32, 64 tokens and 12 heads it is ~50 M multiply-adds per
// node, ~1.3 ms on one core here); Y: T·S·D and Q: T·D·E semiring terms of a
// few vector instructions each (entropy: + a log per term); the k and v
// products T·S·E and T·S·D semiring terms (the semiring's matmul); causal
// attention only visits keys s ≤ t (blocks of query rows cut at the block's
// last key), about half. Δ, W and J live one block of query rows at a time
// (W ~2^16 elements).
#include <ATen/OpMathType.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/generated/Functions.h>

#include "kernels/attention_blocks.h"
#include "kernels/elementwise.h"
#include "rules/attention.h"
#include "rule.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace torch_semiring {

using at::Tensor;
using namespace torch::autograd::generated;

namespace {

// out[r, n] = ⊕_k g[r, k] ⊗ lift(w[r, k, n]) for g (C, R, K), w (R, K, N).
Tensor row_products(const Semiring& sr, const Tensor& g, const Tensor& w) {
  auto parts = product_parts(sr);
  if (!parts.empty()) {  // a product semiring: each part takes its own fastest route
    auto values = split_product_value(sr, g);
    std::vector<Tensor> out;
    for (size_t i = 0; i < parts.size(); ++i) out.push_back(row_products(*parts[i], values[i], w));
    return at::cat(out, 0);
  }
  auto fast = kernels::attention_row_products(sr, g, w);
  if (fast.defined()) return fast;
  return sr.matmul(g.unsqueeze(-2), w).squeeze(-2);
}

// Elements of W per block of query rows: small enough for the level-2 cache.
// TORCH_SEMIRING_ATTENTION_BLOCK overrides it (tests use tiny blocks to cover
// the blocked and causal-cut paths with problems small enough for the reference).
// Off the CPU the bound is memory, not cache (device_block_elements).
int64_t block_elements() {
  if (const char* forced = std::getenv("TORCH_SEMIRING_ATTENTION_BLOCK")) return std::max<int64_t>(1, std::atoll(forced));
  return int64_t(1) << 16;
}

// Elements of P (query rows × keys, summed over heads) per chunk of heads the
// rule takes at a time: bounds its peak memory. TORCH_SEMIRING_ATTENTION_CHUNK
// overrides it (tests use one head per chunk). by_device_blocks: the rule takes
// the device's route (device_blocks below).
int64_t chunk_elements(bool by_device_blocks) {
  if (const char* forced = std::getenv("TORCH_SEMIRING_ATTENTION_CHUNK")) return std::max<int64_t>(1, std::atoll(forced));
  return by_device_blocks ? int64_t(1) << 24   // 64 MiB: on a device each chunk costs launches, not cache misses
                          : int64_t(1) << 17;  // 512 KiB of float32 P (one head at 512 tokens, all of them at 64)
}

// On a device the by-parts blocks take every head and query row at once, up
// to this many elements of Δ (and of W, J): each block is a dozen kernel
// launches and, for the max semirings' products, a host read (one head and a
// cache-sized block of rows at a time cost 1 250 launches and 66 host reads
// per node of a 4 × 512 decoder on an H100).
// TORCH_SEMIRING_ATTENTION_DEVICE_BLOCKS=1 takes the device's route on the
// CPU (by parts, in this layout): how the tests run it without a GPU.
int64_t device_block_elements() {
  if (const char* forced = std::getenv("TORCH_SEMIRING_ATTENTION_BLOCK")) return std::max<int64_t>(1, std::atoll(forced));
  return int64_t(1) << 24;  // 64 MiB of float32 (each of Δ, W and J)
}

bool device_blocks(const Tensor& t) {
  if (!t.device().is_cpu()) return true;
  const char* forced = std::getenv("TORCH_SEMIRING_ATTENTION_DEVICE_BLOCKS");
  return forced && std::string(forced) == "1";
}

// The operands of Y and Q, per key/value head b, j with its R = group·T query
// rows (row i·T + t: query t of the group's i-th head), in the values' dtype.
struct ValueBlockOperands {
  Tensor g;    // (C, B, Hkv, R, D) values at out
  Tensor v;    // (B, Hkv, S, D)
  Tensor out;  // (B, Hkv, R, D)
  Tensor P;    // (B, Hkv, R, S)
  Tensor k;    // (B, Hkv, S, E), the scale folded in
  int64_t T;
  bool causal;
};

// X = Y ⊗ lift(P) (C, B, Hkv, R, S) and Q (C, B, Hkv, R, E) from ATen pieces,
// block by block (any device, any semiring): Δ, W = P·Δ, J = W K, and the row
// products. A block is a run of heads (the B·Hkv pairs flattened) times a run
// of query rows: on the CPU one head and a cache-sized run of rows, on a device
// as many heads and rows as device_block_elements allows. A causal block
// stops at its last key (Y beyond stays the zero; P = 0 there anyway).
void value_blocks_by_parts(const Semiring& sr, const ValueBlockOperands& x, bool need_x, bool need_q, Tensor& X,
                           Tensor& Q) {
  const int64_t C = x.g.size(0), B = x.g.size(1), Hkv = x.g.size(2), R = x.g.size(3), D = x.g.size(4);
  const int64_t S = x.v.size(2), E = x.k.size(3), T = x.T, group = R / T, H = B * Hkv;
  auto g = x.g.reshape({C, H, group, T, D});
  auto out = x.out.reshape({H, group, T, D});
  auto P = x.P.reshape({H, group, T, S});
  auto vT = x.v.transpose(-1, -2).reshape({H, D, S}).contiguous();
  auto k = x.k.reshape({H, S, E});
  Tensor Y;
  if (need_x) Y = sr.zero({H, group, T, S}, x.g.options());
  if (need_q) Q = at::empty({C, H, group, T, E}, x.g.options());
  const int64_t per_row = std::max<int64_t>(group * D * S, 1);
  int64_t heads = 1, block = std::max<int64_t>(1, block_elements() / per_row);
  if (device_blocks(x.g)) {
    const int64_t budget = device_block_elements();
    heads = std::clamp<int64_t>(budget / (per_row * T), 1, H);
    block = heads > 1 ? T : std::max<int64_t>(1, budget / per_row);
  }
  for (int64_t h0 = 0; h0 < H; h0 += heads) {
    const int64_t hc = std::min(heads, H - h0);
    for (int64_t t0 = 0; t0 < T; t0 += block) {
      const int64_t tc = std::min(block, T - t0), rows = hc * group * tc;
      const int64_t keys = x.causal ? std::min(S, t0 + tc) : S;  // P = 0 beyond
      auto delta = (vT.narrow(0, h0, hc).narrow(2, 0, keys).view({hc, 1, 1, D, keys}) -
                    out.narrow(0, h0, hc).narrow(2, t0, tc).unsqueeze(-1))
                       .reshape({rows, D, keys}).contiguous();  // Δ
      auto g_rows = g.narrow(1, h0, hc).narrow(3, t0, tc).reshape({C, rows, D});
      if (need_x)
        Y.narrow(1, h0, hc).narrow(3, t0, tc).narrow(4, 0, keys)
            .copy_(row_products(sr, g_rows, delta).reshape({C, hc, group, tc, keys}));
      if (need_q) {
        auto W = delta * P.narrow(0, h0, hc).narrow(2, t0, tc).narrow(3, 0, keys).reshape({rows, 1, keys});
        auto J = at::matmul(W.reshape({hc, group * tc * D, keys}), k.narrow(0, h0, hc).narrow(1, 0, keys))
                     .reshape({rows, D, E});
        Q.narrow(1, h0, hc).narrow(3, t0, tc).copy_(row_products(sr, g_rows, J).reshape({C, hc, group, tc, E}));
      }
    }
  }
  if (need_x) X = sr.otimes_edge(Y.reshape({C, B, Hkv, R, S}), x.P);
  if (need_q) Q = Q.reshape({C, B, Hkv, R, E});
}

// What the rule reads off a fused attention node: the saved fields of the CPU
// flash node and of CUDA's flash, memory-efficient and cuDNN nodes differ only
// in names and in the logsumexp's padding (efficient: (B, H, T rounded up to
// 32); cuDNN: (B, H, T, 1)), so one adapter per node feeds one rule.
struct SavedAttention {
  Tensor q, k, v, out;  // (B, H or Hkv, ·, ·)
  Tensor lse;           // natural-log logsumexp of the scaled, masked scores, (B, H, T) after trimming
  Tensor mask;          // additive float or bool (true = keep), broadcastable to (B, H, T, S); may be undefined
  bool causal = false;
  std::optional<double> scale;
  double dropout_p = 0.0;
};

std::vector<Tensor> sdpa_rule(const RuleContext& ctx, const std::vector<Tensor>& grads, SavedAttention saved);

// The fields every fused attention node saves under the same names; lse and
// mask (names that differ per node) given.
template <class N>
SavedAttention saved_of(const RuleContext& ctx, N& n, const Tensor& lse, const Tensor& mask) {
  return {ctx.unpack(n.query_), ctx.unpack(n.key_), ctx.unpack(n.value_), ctx.unpack(n.output_),
          lse, mask, n.is_causal, n.scale, n.dropout_p};
}

// A node with cumulative sequence lengths ran on a nested (variable-length) batch.
template <class N>
void check_dense(const RuleContext& ctx, N& n) {
  auto dense = [&](const Tensor& cum_seq) { return !cum_seq.defined() || cum_seq.numel() == 0; };
  TORCH_CHECK_NOT_IMPLEMENTED(dense(ctx.unpack(n.cum_seq_q_)) && dense(ctx.unpack(n.cum_seq_k_)),
                              "torch_semiring: ", ctx.node.name(), " ran on nested (variable-length) sequences, "
                              "which the attention rule does not support; pad the batch to dense tensors");
}

std::vector<Tensor> sdpa_cpu_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  auto& n = static_cast<ScaledDotProductFlashAttentionForCpuBackward0&>(ctx.node);
  return sdpa_rule(ctx, grads, saved_of(ctx, n, ctx.unpack(n.logsumexp_), ctx.unpack(n.attn_mask_)));
}

// CUDA's fused nodes (compiled here against the CPU wheel's Functions.h; on the
// CPU they are exercised through stand-in nodes, attention_node_standin —
// on an H100 the flash and cuDNN nodes agreed with the CPU node in every
// semiring, tests/test_cuda_device.py; the memory-efficient one is not yet checked there).
std::vector<Tensor> sdpa_cuda_flash_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  auto& n = static_cast<ScaledDotProductFlashAttentionBackward0&>(ctx.node);
  check_dense(ctx, n);
  return sdpa_rule(ctx, grads, saved_of(ctx, n, ctx.unpack(n.logsumexp_), Tensor()));
}
std::vector<Tensor> sdpa_cuda_efficient_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  auto& n = static_cast<ScaledDotProductEfficientAttentionBackward0&>(ctx.node);
  return sdpa_rule(ctx, grads, saved_of(ctx, n, ctx.unpack(n.log_sumexp_), ctx.unpack(n.attn_bias_)));
}
std::vector<Tensor> sdpa_cuda_cudnn_rule(const RuleContext& ctx, const std::vector<Tensor>& grads) {
  auto& n = static_cast<ScaledDotProductCudnnAttentionBackward0&>(ctx.node);
  check_dense(ctx, n);
  return sdpa_rule(ctx, grads, saved_of(ctx, n, ctx.unpack(n.logsumexp_), ctx.unpack(n.attn_bias_)));
}

std::vector<Tensor> sdpa_rule(const RuleContext& ctx, const std::vector<Tensor>& grads, SavedAttention saved) {
  TORCH_CHECK(saved.dropout_p == 0.0, "torch_semiring: ", ctx.node.name(), " ran with dropout_p=", saved.dropout_p,
              "; its dropout mask cannot be recomputed. Use model.eval() (dropout off) or "
              "attn_implementation='eager'.");
  for (size_t j = 1; j < grads.size(); ++j)
    TORCH_CHECK(!grads[j].defined(), "torch_semiring: values arriving at output ", j, " (logsumexp or RNG state) of ",
                ctx.node.name(), " are not supported");
  for (size_t e = 3; e < ctx.needed.size(); ++e)
    TORCH_CHECK_NOT_IMPLEMENTED(!ctx.needs(e), "torch_semiring: ", ctx.node.name(), ": values w.r.t. the attention "
                                "bias (input ", e, ") are not supported; make the mask a constant (requires_grad=False)");
  std::vector<Tensor> result(std::max<size_t>(ctx.needed.size(), 3));
  const auto& sr = ctx.semiring;
  const Tensor& g_in = grads[0];
  if (!g_in.defined()) return result;  // nothing arrives: every input gets the zero
  const auto &q = saved.q, &k = saved.k, &v = saved.v, &out = saved.out, &mask = saved.mask;
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "torch_semiring: ", ctx.node.name(),
              " expects (batch, heads, tokens, head dim) tensors, got query ", q.sizes(), ", key ", k.sizes(),
              ", value ", v.sizes());
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), E = q.size(3);
  const int64_t Hkv = k.size(1), S = k.size(2), D = v.size(3);
  TORCH_CHECK(Hkv > 0 && H % Hkv == 0, "torch_semiring: ", ctx.node.name(), ": ", H,
              " query heads cannot be grouped over ", Hkv, " key/value heads");
  const int64_t group = H / Hkv, R = group * T, C = g_in.size(0);
  const double scale = saved.scale.value_or(1.0 / std::sqrt(double(E)));
  // (B, H, T): CUDA's memory-efficient kernel pads T to a multiple of 32, cuDNN adds a trailing 1.
  auto lse = saved.lse.reshape({B, H, -1}).narrow(2, 0, T);

  // Weights in the values' dtype (the semiring arithmetic runs in it), computed
  // in at least float32 (the stock kernel's accumulation type for bf16/fp16).
  const auto vtype = g_in.scalar_type();
  const auto wtype = at::promote_types(at::toOpMathType(q.scalar_type()), vtype);
  auto as_weight = [&](const Tensor& t) { return t.to(wtype); };
  // Query rows of a key/value head's group side by side, every (batch, key/value
  // head) pair one entry of a leading dim: (B·Hkv, 1, R, ·) — (b, j) is entry b·Hkv + j.
  const int64_t BH = B * Hkv;
  auto rows = [&](const Tensor& t) { return t.reshape({BH, 1, R, t.size(-1)}); };
  auto qr = rows(as_weight(q));
  auto kh = as_weight(k).reshape({BH, 1, S, E}), vh = v.to(vtype).reshape({BH, 1, S, D});
  auto outr = rows(out.to(vtype));
  auto lser = lse.reshape({BH, 1, R});
  auto g = g_in.reshape({C, BH, 1, R, D});
  // The mask stays a broadcast view (B, Hkv, group, T, S); a chunk's rows are made per chunk.
  Tensor mask5;
  if (mask.defined()) mask5 = mask.expand({B, H, T, S}).view({B, Hkv, group, T, S});
  Tensor future;
  if (saved.causal) future = at::ones({T, S}, q.options().dtype(at::kBool)).triu(1).repeat({group, 1});

  // A few heads at a time: P and the per-head blocks (R·S elements a head,
  // C-fold for the values) of one chunk are all that is alive, instead of
  // every head's at once — at 512 tokens 12 heads' P alone are 12 MiB.
  const int64_t heads = std::max<int64_t>(1, chunk_elements(device_blocks(g_in)) / std::max<int64_t>(R * S, 1));

  // Results by the same entries: q (C, B, H, T, E) = (C, B·Hkv, R, E); k, v (C, B·Hkv, S, ·).
  // One chunk of every head: a contiguous result is kept as it is, not copied.
  Tensor q_value, k_value, v_value;
  auto place = [&](Tensor& value, const Tensor& chunk_result, int64_t h0, int64_t n, int64_t rows, int64_t cols) {
    if (n == BH && chunk_result.is_contiguous()) {
      value = chunk_result.view({C, BH, rows, cols});
      return;
    }
    if (!value.defined()) value = at::empty({C, BH, rows, cols}, g_in.options());
    value.narrow(1, h0, n).copy_(chunk_result);
  };
  for (int64_t h0 = 0; h0 < BH; h0 += heads) {
    const int64_t n = std::min(heads, BH - h0);
    auto part = [&](const Tensor& t, int64_t dim = 0) { return t.narrow(dim, h0, n); };
    // P (n, 1, R, S), as the stock backward recomputes it.
    // P = exp(scores·scale − lse): without a mask the scale rides in the one
    // fused pass (kernels::exp_scaled_rows_); a mask is applied to the scaled scores.
    auto scores = at::matmul(part(qr), part(kh).transpose(-1, -2));
    const bool masked = mask5.defined() || future.defined();
    if (masked) scores.mul_(scale);
    const double ninf = -std::numeric_limits<double>::infinity();
    if (mask5.defined()) {
      std::vector<Tensor> entries;
      for (int64_t e = h0; e < h0 + n; ++e) entries.push_back(mask5[e / Hkv][e % Hkv]);
      auto m = at::stack(entries).reshape({n, 1, R, S});
      scores = m.scalar_type() == at::kBool ? scores.masked_fill_(m.logical_not(), ninf) : scores.add_(m.to(wtype));
    }
    if (future.defined()) scores.masked_fill_(future, ninf);
    auto shift = as_weight(part(lser)).contiguous();
    if (!kernels::exp_scaled_rows_(scores, masked ? 1.0 : scale, shift)) {
      if (!masked) scores.mul_(scale);
      scores.sub_(shift.unsqueeze(-1)).exp_();
    }
    auto P = scores.to(vtype);
    auto gc = part(g, 1);

    if (ctx.needs(2))  // v: ⊕ over the group's query rows of g ⊗ lift(P)
      place(v_value, sr.matmul_nonnegative(gc.transpose(-1, -2), P).transpose(-1, -2).squeeze(2), h0, n, S, D);
    if (!ctx.needs(0) && !ctx.needs(1)) continue;

    // The q edge's J = W K uses the keys minus the first key (see the header: Σ_s W = 0).
    auto k_centred = (part(kh) - part(kh).narrow(-2, 0, 1)).mul_(scale);
    ValueBlockOperands x{gc, part(vh), part(outr), P, k_centred.to(vtype), T, saved.causal};
    Tensor X, Q;
    if (device_blocks(g_in) || !kernels::attention_value_blocks(sr, x.g, x.v, x.out, x.P, x.k, T, x.causal,
                                                                 ctx.needs(1), ctx.needs(0), block_elements(), X, Q))
      value_blocks_by_parts(sr, x, ctx.needs(1), ctx.needs(0), X, Q);
    if (ctx.needs(0)) place(q_value, Q.squeeze(2), h0, n, R, E);
    if (ctx.needs(1))  // k: ⊕ over the group's query rows of X ⊗ lift(scale·q)
      place(k_value, sr.matmul(X.transpose(-1, -2), (part(qr) * scale).to(vtype)).squeeze(2), h0, n, S, E);
  }
  if (ctx.needs(0)) result[0] = q_value.reshape({C, B, H, T, E});
  if (ctx.needs(1)) result[1] = k_value.reshape({C, B, Hkv, S, E});
  if (ctx.needs(2)) result[2] = v_value.reshape({C, B, Hkv, S, D});
  return result;
}

// Fused attention backward nodes of CUDA builds: named, with the way out.
std::vector<Tensor> cuda_attention_unsupported(const RuleContext& ctx, const std::vector<Tensor>&) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "torch_semiring: ", ctx.node.name(), " (a CUDA fused attention kernel) "
                              "has no semiring rule (it serves nested, variable-length batches). Pad the batch to dense "
                              "tensors, or load the model with attn_implementation='eager'.");
}

}  // namespace

Tensor attention_node_standin(const std::string& kind, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& lse, const std::optional<Tensor>& bias, bool causal,
                              std::optional<double> scale, double dropout_p) {
  using torch::autograd::SavedVariable;
  auto fill = [&](auto node) {
    node->query_ = SavedVariable(q, false);
    node->key_ = SavedVariable(k, false);
    node->value_ = SavedVariable(v, false);
    node->output_ = SavedVariable(out, false);
    node->is_causal = causal;
    node->scale = scale;
    node->dropout_p = dropout_p;
    node->set_next_edges(torch::autograd::collect_next_edges(q, k, v));
    return node;
  };
  NodePtr node;
  if (kind == "flash") {
    TORCH_CHECK(!bias, "torch_semiring: CUDA's flash attention takes no mask");
    auto n = fill(make_node<ScaledDotProductFlashAttentionBackward0>());
    n->logsumexp_ = SavedVariable(lse, false);
    node = n;
  } else if (kind == "efficient") {
    auto n = fill(make_node<ScaledDotProductEfficientAttentionBackward0>());
    n->log_sumexp_ = SavedVariable(lse, false);
    n->attn_bias_ = SavedVariable(bias.value_or(Tensor()), false);
    node = n;
  } else if (kind == "cudnn") {
    auto n = fill(make_node<ScaledDotProductCudnnAttentionBackward0>());
    n->logsumexp_ = SavedVariable(lse, false);
    n->attn_bias_ = SavedVariable(bias.value_or(Tensor()), false);
    node = n;
  } else {
    TORCH_CHECK(false, "torch_semiring: attention_node_standin: kind must be 'flash', 'efficient' or 'cudnn', got '",
                kind, "'");
  }
  auto result = out.detach().clone();
  torch::autograd::set_history(result, node);
  return result;
}

void register_attention_rules() {
  register_rule("ScaledDotProductFlashAttentionForCpuBackward0", sdpa_cpu_rule, "attention");
  register_rule("ScaledDotProductFlashAttentionBackward0", sdpa_cuda_flash_rule, "attention");
  register_rule("ScaledDotProductEfficientAttentionBackward0", sdpa_cuda_efficient_rule, "attention");
  register_rule("ScaledDotProductCudnnAttentionBackward0", sdpa_cuda_cudnn_rule, "attention");
  // The lower-level ops (B, T, H, E layout, cu_seqlens), reached by nested tensors.
  for (const char* name : {"FlashAttentionBackward0", "EfficientAttentionBackward0"})
    register_rule(name, cuda_attention_unsupported, "attention (unsupported)");
}

}  // namespace torch_semiring
