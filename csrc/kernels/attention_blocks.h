// A dedicated CPU loop for the row products of the fused-attention rule
// (rules/attention.cpp): for a value g (C, R, K) and plain weights w (R, K, N)
//     out[r, n] = ⊕_k g[r, k] ⊗ lift(w[r, k, n])          → (C, R, N),
// i.e. one semiring vector–matrix product per row r (per query: its value
// differences Δ or its block J of the query derivative). The semiring's matmul
// with M = 1 computes the same, but lifts every weight (a log per term in the
// log-space semirings) and pays a GEMM's packing for one row.
//
// Returns an UNDEFINED tensor when it does not apply — a semiring without a
// loop here (provenance, Python, kmax with k > 8), a dtype other than
// float/double, a non-CPU tensor, a graph-building call, non-finite weights or
// values outside what the loop is exact on — and the caller then takes the
// semiring's matmul. So it never returns a number the generic path would not.
#pragma once

#include <ATen/ATen.h>

namespace torch_semiring {

class Semiring;

namespace kernels {

at::Tensor attention_row_products(const Semiring& sr, const at::Tensor& g, const at::Tensor& w);

}  // namespace kernels
}  // namespace torch_semiring
