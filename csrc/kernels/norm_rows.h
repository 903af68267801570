// Per-row kernels for the off-diagonal part of centred normalisation
// Jacobians (layer norm; batch norm with batch statistics).
//
// With x̂ the normalised row (N elements) and c_i the scale of output i,
//     J[i, j] = c_i (δ_ij − (1 + x̂_i x̂_j) / N),
// so off the diagonal the weight factors into lift(−c_i/N) ⊗ lift(1 + x̂_i x̂_j)
// and the semiring value of input j is
//     out_j = ⊕_{i≠j} a_i ⊗ lift(1 + x_i x_j),     a_i = g_i ⊗ lift(−c_i/N).
// Each function below computes that, per row, for one family of semirings,
// without the N×N block:
//
//   sum_rows        Σ_{i≠j} w_i |1 + x_i x_j|  (or Σ w_i [1 + x_i x_j ≠ 0])  abs, count
//   logsumexp_rows  log Σ_{i≠j} e^{a_i} |1 + x_i x_j|                          log
//   entropy_rows    the (log Z, R/Z) pair of the expectation semiring           entropy
//   max_rows        max_{i≠j} w_i |1 + x_i x_j|  (or, log_space, of a_i + log|·|)  max_abs, viterbi
//   signed_max_rows (max, min)_{i≠j} of M_i y_ij and m_i y_ij, y = 1 + x_i x_j  max_prod
//   topk_rows       the k largest of a_ic + log|1 + x_i x_j| over i ≠ j, c ≤ k  kmax
//
// Cost per row (x sorted once by an LSD radix sort, O(N)):
//   sums, rows of ≤ 1 024 float32 / 512 float64 elements: a direct pair pass, O(N²/L) vector steps
//           (L lanes) — each pair's |y| (or [y ≠ 0]) computed once for both
//           orders, in the graph's precision (float rows: 16 lanes on AVX-512),
//           a sum of non-negative terms, 4 rows i at a time over the same
//           vectors of j (norm_rows.cpp, PairPass); up to ~1 000 float32
//           elements it is cheaper than the sorted sums (abs, µs a row:
//           N = 384 ~6, N = 768 20.1 vs 29.7 sorted; norm_rows.cpp's table,
//           benchmarks/norm_rows.py gives every semiring and length).
//   count, float rows (float32 graphs), any length: O(N) — the row's total but
//           w_j (a prefix plus a suffix), since 1 + x_i x_j (rounded once from
//           the exact product) is 0 only where x_i·x_j = −1, which two floats
//           reach only as ±powers of two: those j are summed term by term
//           (count_by_totals; N = 384: 1.6 µs a row against 6.9 for the pair
//           pass, N = 768: 3.2 against 22.4 / 26.5 sorted).
//   sums, longer rows: O(N log N) — |1 + x_i t| changes sign once in the sorted x (at
//           x = −1/t), so each side is Σw + t·Σw·x over a range of the sorted
//           row, read from a disjoint sparse table (range sums with no
//           subtraction, so no cancellation against the excluded i = j or an
//           outlier). Terms with |1 + x_i t| < δ (x_i within a relative δ of
//           −1/t, where Σw + t·Σw·x would cancel) are summed directly.
//   entropy: Z and Σ w h |y| as the sums above, plus Σ_{i≠j} w_i φ(y_ij),
//           φ(y) = |y| log|y|, which separates in no way over the whole row: the
//           direct pair pass (φ_ij = φ_ji: N(N−1)/2 logarithms), O(N²/L), never
//           storing the block — on rows of ≤ 1 024 float32 / 512 float64
//           elements one pass for all three sums (N = 768: 142 vs 169 µs a row
//           with the sorted sums beside it). It is bound by vector throughput
//           (the row stays in L1: no cache blocking pays; blocking 2–4 rows
//           measured no gain), so its cost is the log: float rows (float32
//           graphs) take log|y| from a 16-entry table by one permute (AVX-512 /
//           AVX2: ~15 vector operations, 7–8 of them multiply-adds, instead of ~26).
//           Rows of 224 floats (80 float64) or more split it, at any length: the near pairs
//           (|x_i x_j| ≤ 3/4, where φ(1 + t) is a polynomial in t to the
//           precision's accuracy) by moments of the weights, O(N·K), only the
//           far ones by the pair pass (22 % of the pairs on the real MiniLM's
//           rows; N = 384 float: ~29 vs ~52 µs a row; N = 2048 float, beyond
//           the pair pass's cut-off: 409 vs 940 µs with the sorted sums). See
//           entropy_sums_split in norm_rows.cpp.
//   max (max_abs, viterbi; values only) and max_prod, rows of ≤ 896 / 768
//           float32 or 384 float64 elements: the direct pair pass with maxima (max_prod: maxima and
//           minima of M_i y and m_i y over the edges) instead of sums, O(N²/L)
//           (N = 384: 12.5 vs 17.8 µs a row for max_abs, 14.6 vs 17.3 for
//           viterbi, 24.2 vs 32.1 for max_prod; float32, AVX-512). max_abs's
//           and viterbi's rows of 64 or more take its terms only from the i
//           that can reach a maximum (PrunedMaxPass: queries grouped by |x|,
//           each group's outputs bounded below by a few picked terms, an i
//           skipped where w_i(1 + |x_i|·max_group|x|) is below that bound):
//           the same values, bit for bit; 4.5 % of the terms on MiniLM-64's
//           layer norms, their rule ~25 % faster (the rest of a row's cost is
//           its exp / log / conversions). It takes max_abs's and viterbi's
//           values at any length, the cut-off only choosing what a row takes
//           when it declines: it counts every group's survivors before taking
//           a term and declines past a budget (the pair pass's N²/2 terms, or
//           past the cut-off about the envelope's cost, 600·N float / 300·N
//           float64 terms) — equal weights leave the |x| ≈ 0 group all N
//           candidates. N = 1024 / 2048 / 4096 float32, spread weights: 16 /
//           38 / 70 µs a row against 45 / 89 / 164 by the envelope; a declined
//           row costs the envelope + 6–15 %.
//           max_prod's rows of 64 or more likewise take their terms only from
//           the owners that can reach a group's maxima or minima
//           (PrunedSignedPass: queries in 8 groups by their signed x, each
//           owner's four products at the group's two ends bounding its terms
//           there, since a rounded term is monotone in t; the outputs bounded
//           by the second best end value of the owners with an edge at every
//           query): bit for bit the pair pass's values, 4 % of the terms on
//           MiniLM's layer norms. N = 384 / 1024 / 4096 float32: 6–8 / 18 / 90
//           µs a row against 24 by the pair pass and 41 / 104 / 395 by the
//           envelopes; it declines past the same budget (equal weights on rows
//           of nearly all small |x|), costing the pair pass or the envelope
//           + ~8 %.
//   max, longer rows (declined by the pruned passes) or with winners (path tracking):
//           O(N log N) — the upper envelope of the 2N lines ±w_i(1 + x_i t)
//           (max_prod: M_i(1 + x_i t), m_i(1 + x_i t)), evaluated at the sorted
//           queries; where a query's best line is its own (i = j, excluded), its
//           maximum over the others is taken directly (O(N), for at most the
//           owners on the envelope). Before that, lines that are nowhere above
//           a lower bound of every answer are dropped; when few are left (values
//           spread over orders of magnitude, as in log space) each query takes
//           the best of them directly.
//   top-k values (and winners, for paths), k ≤ 8, rows below 2^21 elements (the tags i·k + c
//           exact in float lanes; 4–7× faster than the merge below at N = 1024–16384, equal weights
//           included: N = 4096, 0.8–1.1 ms a row against 2.8–7.4): queries in
//           vector lanes (sorted by |x|) keep their k best (and the winners' tags) in registers while
//           the candidates go by largest bound first, a candidate that no lane
//           takes skipped by one compare, and a vector done once the bound
//           α_0 + α_0·|x_i|·max|t| of every later candidate (suffix maxima) is
//           at or below each lane's k-th best: O(N·S/L) steps for S candidates
//           visited (N worst) plus 2k per insertion (N = 384: ~23 µs a row,
//           was 52.5 visiting every candidate, 125 by the merge below;
//           float32, AVX-512; MiniLM's rows: a few dozen candidates a vector).
//   top-k otherwise (k > 8, longer rows): the same bound for the k-th best answer, per block of 32 sorted
//           queries (the bounds: two vector passes over the Nk candidates,
//           O(Nk/L) steps a block plus O(k²) per insertion into the kept lows),
//           then each query merges the surviving candidates in vectors of L
//           lanes, a vector that has no lane above the current k-th best
//           skipped whole: O(N·S/L) steps plus O(k) per insertion, for S
//           survivors (O(N²k) worst).
// Log-space inputs are shifted by the row maximum into linear space (float64
// inside, whatever the input dtype); an output whose surviving mass does not
// dominate what underflow may have dropped is recomputed exactly in log space
// (O(N) for that output). On float32 rows the shift's exponentials (where the
// direct pass follows, which runs in float and drops weights below 2^-100
// anyway) and the results' logarithms are taken in float lanes (≤ 2 ulp of
// float, exp's argument rounded to float: outputs within ~4 float ulps of the
// float64 lanes' on MiniLM): on MiniLM-64's norms 10–25 % of viterbi's, log's
// and kmax's row cost.
//
// Every function takes CPU tensors of shape (R, N) (float32 or float64, one
// dtype for all; x finite) and returns results of that shape and dtype (each
// row is read into float64, checked and computed there, and written back); it
// returns UNDEFINED tensors when it does not apply (non-CPU tensors, other or
// mixed dtypes, NaN inputs, +∞ log values, x not finite) — the caller then
// takes the generic path.
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace torch_semiring::kernels {

// w ≥ 0 (linear space). nonzero: count semiring, lift(y) = [y ≠ 0] instead of |y|.
at::Tensor sum_rows(const at::Tensor& w, const at::Tensor& x, bool nonzero);
// a: log values (−∞ = no path).
at::Tensor logsumexp_rows(const at::Tensor& a, const at::Tensor& x);
// (ℓ, h): the entropy semiring's log Z and R/Z per element (h = 0 where ℓ = −∞).
std::tuple<at::Tensor, at::Tensor> entropy_rows(const at::Tensor& l, const at::Tensor& h, const at::Tensor& x);
// w ≥ 0 (linear) or, with log_space, log values: the best path through the row.
// argmax (optional): which i won for each j, int32 (R, N), −1 where no path
// (ties: the first found) — what path tracking needs.
at::Tensor max_rows(const at::Tensor& w, const at::Tensor& x, bool log_space, at::Tensor* argmax = nullptr);
// M ≥ m signed path products (M = −∞: no path): (max, min) over i ≠ j.
std::tuple<at::Tensor, at::Tensor> signed_max_rows(const at::Tensor& M, const at::Tensor& m, const at::Tensor& x);
// a: (k, R, N) descending log scores per element (−∞ padded); returns (k, R, N).
// argmax (optional): for each output entry, i·k + the entry of a it came from,
// int32 (k, R, N), −1 where none.
at::Tensor topk_rows(const at::Tensor& a, const at::Tensor& x, at::Tensor* argmax = nullptr);

// Rows so far (for tests and benchmarks): max_abs's / viterbi's rows the pruned
// pass took, the rows it declined for its budget, kmax's rows by vector lanes,
// max_prod's rows by its pruned pass and those it declined.
struct NormRowStats {
  int64_t pruned_max, declined_max, topk_lanes, pruned_signed, declined_signed;
};
NormRowStats norm_row_stats();

}  // namespace torch_semiring::kernels
