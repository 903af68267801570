// Dedicated CPU loops for the fused-attention rule (rules/attention.cpp).
//
// The rule needs, per query row r (of a key/value head), two semiring
// vector–matrix products with weights that have no factorisation for a
// general semiring:
//     Y[r, s] = ⊕_d g[r, d] ⊗ lift(Δ[r, d, s]),   Δ[r, d, s] = v[s, d] − out[r, d]
//     Q[r, e] = ⊕_d g[r, d] ⊗ lift(J_r[d, e]),    J_r = W_r K,  W_r[d, s] = P[r, s]·Δ[r, d, s]
// and the key values X = Y ⊗ lift(P). The semiring's matmul with M = 1
// computes them, but lifts every weight (a log per term in the log-space
// semirings) and pays a GEMM's packing for one row. The loops here keep the
// arithmetic in linear space (see the .cpp).
//
// Both entry points decline — an undefined tensor / false — where they do not
// apply: a semiring without a loop here (Python, product, kmax with k > 8,
// the max_prod and min_plus provenance versions), a dtype other than float/double, a non-CPU tensor, a graph-building
// call, non-finite weights or values outside what the loops are exact on. The
// caller then takes the semiring's generic products, so these never return a
// number the generic path would not.
#pragma once

#include <ATen/ATen.h>

namespace torch_semiring {

class Semiring;

namespace kernels {

// The row products alone: g (C, R, K) value, w (R, K, N) plain →
// (C, R, N), out[r, n] = ⊕_k g[r, k] ⊗ lift(w[r, k, n]).
at::Tensor attention_row_products(const Semiring& sr, const at::Tensor& g, const at::Tensor& w);

// X = Y ⊗ lift(P) and Q for all heads in one pass: g (C, B, Hkv, R, D) value
// with R = group·T query rows per key/value head (row i·T + t: query t of the
// group's i-th head); v (B, Hkv, S, D); out (B, Hkv, R, D); P (B, Hkv, R, S);
// k (B, Hkv, S, E), the scale folded in. `causal`: query t only has keys
// s ≤ t (blocks of rows stop at their last key). Δ is formed on the fly, W
// emitted by the same pass for one GEMM per block of rows (W of about
// `block_elements` elements), J lives one block at a time. Fills
// X (C, B, Hkv, R, S) when need_x and Q (C, B, Hkv, R, E) when need_q;
// returns false where it does not apply.
bool attention_value_blocks(const Semiring& sr, const at::Tensor& g, const at::Tensor& v, const at::Tensor& out,
                            const at::Tensor& P, const at::Tensor& k, int64_t T, bool causal, bool need_x,
                            bool need_q, int64_t block_elements, at::Tensor& X, at::Tensor& Q);

}  // namespace kernels
}  // namespace torch_semiring
