// Fused element-wise operations on semiring values: one pass over memory, no
// temporaries, for the multi-component semirings whose ⊗ by an edge and ⊕
// would otherwise be chains of 5–12 ATen operations per node (entropy's
// (ℓ, h) pairs, max_prod's (M, m), kmax's lists, the log-space lift), and the
// lifts of the sum-type semirings (|w|, [w ≠ 0]: 2–3 passes into one).
//
// The arithmetic of each op is in fused_ops.inc; elementwise.cpp runs it over
// the broadcast of the operands (at::TensorIterator) with AVX-512, AVX2 or
// baseline code chosen at run time (kernel_isa(), TORCH_SEMIRING_KERNEL_ISA).
// fused_edge / fused_pair on CUDA tensors (a build with the CUDA kernels) run
// the same arithmetic as one CUDA launch (device_gemm.h fused_elementwise,
// cuda/elementwise_block.h); so do CPU float32 tensors under
// TORCH_SEMIRING_KERNEL_BACKEND=emulate, through the host block emulator.
// Each entry point returns an UNDEFINED tensor when it does not apply —
// other devices, dtypes other than float32/float64 (one dtype for all
// operands), or a graph-building call (create_graph: grad mode on and an
// operand requiring grad, which needs differentiable ATen ops) — so the
// semiring keeps its ATen expression as the general path. Cost: one read of
// each operand and one write of the result.
#pragma once

#include <ATen/ATen.h>

#include "kernels/fused_op.h"

namespace torch_semiring::kernels {

// a ⊗ lift(w): a (C, *S) value, w a plain tensor, broadcast as in ATen.
at::Tensor fused_edge(Fused op, const at::Tensor& a, const at::Tensor& w);
// a ⊕ b: two (C, *S) values, broadcast.
at::Tensor fused_pair(Fused op, const at::Tensor& a, const at::Tensor& b);

// kmax's ⊕ over element dims: the k best scores of the k-lists of all the
// reduced elements, descending. a: (k, *S) scores, or with ids (kmax path
// tracking) (2k, *S) = k scores then the k ids that travel with them; dims:
// the reduced dims of a (1-based: dim 0 holds the components), any strides.
// Returns (C, *kept), kept = S without dims. Every list must be descending
// (as every kmax value is; the kmax GEMM relies on it too). A candidate
// enters a list only by beating its last score strictly, visited in
// row-major order of the reduced elements, then by entry: equal scores keep
// the earlier one (as ⊕ keeps its left operand); a list with fewer than k
// finite scores is padded with (−∞, id −1). Cost: O(kept · reduced · k),
// no temporaries: per reduced element its k entries are read, those that
// enter (a prefix: one compare each) are inserted with ≤ k moves, the rest
// are only checked for NaN. Undefined where it does not apply (as fused_edge), and
// where any score is NaN (the generic selection decides what NaN means).
at::Tensor kmax_reduce(const at::Tensor& a, at::IntArrayRef dims, int64_t k, bool with_ids);

// Rows of doubles (the per-row work of norm_rows): out[i] = e^{a[i] − shift}
// and out[i] = shift + log a[i], vectorised (vmath: ≤ 2 ulp, the special
// values of exp and log). in_float: exp and log in float lanes (≤ 2 ulp of
// float; exp's argument rounded to float) — for rows whose results are kept
// in float precision; ~2.5× faster than the double lanes on AVX-512.
void exp_shifted(const double* a, double shift, double* out, int64_t n, bool in_float = false);
void log_shifted(const double* a, double shift, double* out, int64_t n, bool in_float = false);

// Softmax weights from scores, in place: x (*rows, n) := e^{x·scale − shift[row]}
// for shift (*rows) — the fused attention rule's P from its scores and the saved
// logsumexp, one pass instead of ATen's mul_, sub_ and exp_ (at 128 tokens and
// 12 heads: ~300 µs a node, ~200 of them exp_). The product and the difference
// are each rounded (as ATen's mul_ and sub_), exp by vmath (≤ 2 ulp, the
// subnormals, −∞ → 0). false, x untouched, where it does not apply (as
// fused_edge; also non-contiguous x or shift, or a shift not one per row).
bool exp_scaled_rows_(const at::Tensor& x, double scale, const at::Tensor& shift);

// t := |t| in place; false only where it checked that no entry is NaN (CPU
// float/double, contiguous: one pass, where abs_ and a sum took two — on a
// MiniLM-128 GELU node ~90 µs); a device tensor is not read back (true).
bool abs_in_place_may_hold_nan(const at::Tensor& t);

// The row passes of the log and entropy products (exp_shift_gemm.cpp), T
// float or double, over `rows` rows of n contiguous entries, exp and log by
// vmath (≤ 2 ulp, their special values); one pass each where ATen took 2–3
// (a MiniLM-128 entropy backward: ~250 ATen passes). A per-column factor c of
// row r is c[(r / per)·n + i] (one row of factors for each `per` rows).
//   exp_shift_rows: p = e^{a − shift} and, where h is given, ph = p∘h; the
//     shift of row r is shift[r] if shift_rows == 0, else per column
//     (per = shift_rows: a transposed operand, whose rows' shifts run along
//     memory). false where some p∘h is NaN or ±∞ (the rows are written).
//   log_add_shifts: where d is given, d := d / z where z > 0, else 0 (the
//     entropy's h = (A − B)/Z); then z := (s[r] + t_column) + log z (per = t_rows).
//   divide_columns_and_log: q := q / m_column where m_column > 0, else 0
//     (per = m_rows); where ql is given, ql := q·log(q as it was) where the
//     new q > 0, else 0.
template <class T>
bool exp_shift_rows(const T* a, const T* h, const T* shift, int64_t shift_rows, T* p, T* ph, int64_t rows, int64_t n);
template <class T>
void log_add_shifts(T* z, T* d, const T* s, const T* t, int64_t t_rows, int64_t rows, int64_t n);
template <class T>
void divide_columns_and_log(T* q, T* ql, const T* m, int64_t m_rows, int64_t rows, int64_t n);

// Path tracking's id bookkeeping (provenance.h) on a value v (2E, *S) — E
// scores, then E ids, exact integers (the engine checks they fit the dtype,
// so every order of the arithmetic gives the same ids). One pass writing a
// new contiguous value, scores copied; undefined where it does not apply
// (as fused_edge). Cost: O(E·|S|), in place of 4–6 ATen passes and a cat.
// tag_ids: ids := ids·n + e where ids >= 0 ("arrived as contribution e of n").
at::Tensor tag_ids(const at::Tensor& v, int64_t E, int64_t n, int64_t e);
// origin_ids: ids := (first + o)·E + entry for element o of S (row-major).
at::Tensor origin_ids(const at::Tensor& v, int64_t E, int64_t first);
// The value (2C, *B, M, N) of a selecting product or row kernel that
// reported winners: values (C, *B, M, N) and winner (int32, same shape,
// contiguous; w = k·E + entry, −1 for no path) → scores = values, id =
// ids[entry, *b, m, k] (−1 for none). ids: (E, *B, M, K), any strides
// (broadcast too). One pass, in place of cast, clamp, gather, where and cat;
// undefined where it does not apply, or for a winner outside [−1, K·E).
at::Tensor winners_with_ids(const at::Tensor& values, const at::Tensor& winner, const at::Tensor& ids, int64_t E);

}  // namespace torch_semiring::kernels
