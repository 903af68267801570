// Fast CPU semiring matrix products, called by the semirings' matmul overrides.
//
// Every function takes a semiring value g of shape (C, *batch, M, K) and a
// plain tensor w of local derivatives (*batch, K, N) (batch dims broadcast as
// in at::matmul; any strides) and returns the value (C, *batch, M, N) with
// out[m, n] = ⊕_k g[m, k] ⊗ lift(w[k, n]).
//
// A function returns an UNDEFINED tensor when it does not apply — a dtype
// other than float/double, a non-CPU tensor, a graph-building call (grad mode
// on and an input requiring grad), inputs outside the range the
// kernel is exact on (NaN, infinities where the generic arithmetic would
// produce NaN), empty dims — and the caller then takes the generic path. So a
// kernel never returns a number the generic path would not. The range checks
// cost no pass of their own: g is checked while it is packed (max kernels) or
// through its row maxima (log/entropy), w once per preparation.
//
// What a kernel prepares from w (its lift, packed for the micro-kernel, or
// the exp-shift factors) is kept in the lift cache (lift_cache.h) when the
// call runs inside a SavedOperandScope and w is a leaf weight: a product with
// a frozen weight then costs the GEMM and a pass over g and the output only.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <string>
#include <tuple>

// The kernels' element-wise helper loops (packing, the exp-shift passes) are
// compiled -O3 (`#pragma GCC optimize` around them) and cloned per ISA with
// the clone picked at load time, so that they vectorise without a build flag.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TS_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TS_CPU_CLONES
#endif

namespace torch_semiring {
namespace kernels {

using at::Tensor;

// viterbi: max_k g + log|w|.
Tensor max_plus_matmul(const Tensor& g, const Tensor& w);
// max_abs: max_k g · |w|.
Tensor max_times_matmul(const Tensor& g, const Tensor& w);
// The same products together with which k won, for path extraction:
// (values (1, *batch, M, N), argmax int32 (*batch, M, N)); ties go to the
// smallest k, −1 where no term beats the semiring zero (no path).
// `semiring` is "viterbi" or "max_abs". Raises (instead of falling back) when
// the inputs are outside what the kernel supports.
std::tuple<Tensor, Tensor> max_matmul_argmax(const std::string& semiring, const Tensor& g, const Tensor& w);
// max_prod: (max_k max(M·w, m·w), min_k min(M·w, m·w)) over edges w != 0 and
// non-empty g (M != −∞); nothing → (−∞, +∞). Declines pairs with M < m (no
// semiring value has one).
Tensor max_prod_matmul(const Tensor& g, const Tensor& w);
// kmax(k), k <= 8: the k best of the k·K candidate scores g[j, m, k'] + log|w[k', n]|,
// descending (−∞ padded). Larger k → undefined (generic path).
Tensor kmax_matmul(const Tensor& g, const Tensor& w, int64_t k);
// max_prod and kmax with argmax, for path extraction: (values as the plain
// kernel's, winners int32 of the same shape (C, *batch, M, N)), a winner
// written k·C + e: entry e of g[…, m, k] (C = 2 for max_prod, k for kmax).
// max_prod: winners[0] names the term that won M, winners[1] the one that
// won m; on a negative edge M comes from k's m·w (e = 1) and m from its M·w
// (e = 0). Ties → the smallest k. kmax: the k winners are distinct
// candidates; at equal scores a candidate of a smaller k' (and of one list,
// the earlier entry) is kept, and equal scores within the list are ordered
// by that index k'·k + e. −1 where there is no path (M = −∞,
// m = +∞, a −∞ score — also when a product overflowed to it). Unlike
// max_matmul_argmax these decline (undefined tensors) wherever the plain
// kernels do, and for K·C beyond int32.
std::tuple<Tensor, Tensor> max_prod_matmul_argmax(const Tensor& g, const Tensor& w);
std::tuple<Tensor, Tensor> kmax_matmul_argmax(const Tensor& g, const Tensor& w, int64_t k);
// log: logsumexp_k g + log|w|, by exp-shifted GEMMs (exp_shift_gemm.cpp).
Tensor log_matmul(const Tensor& g, const Tensor& w);
// entropy: the (ℓ, h) pair product, by exp-shifted GEMMs (exp_shift_gemm.cpp).
Tensor entropy_matmul(const Tensor& g, const Tensor& w);

// Counters of the log/entropy stages so far in this process: (products that
// needed the 64-wide blocks, entries recomputed exactly).
std::pair<int64_t, int64_t> exp_shift_stats();

// Which instruction set the SIMD kernels run with on this machine:
// "avx512", "avx2" or "portable". Set TORCH_SEMIRING_KERNEL_ISA to one of
// these (or a lower one) to force it — tests use it to cover every path.
std::string kernel_isa();

// How many products the kernels have computed in this process (every entry
// point that did not decline counts one): lets tests check that a code path,
// e.g. the engine's matmul rules, really reaches the kernels.
int64_t kernel_calls();
void count_kernel_call();

// Shared by the kernel entry points: g and w broadcast to a common batch shape
// (views, no copies) and the output shape. Returns false when the shapes do
// not fit a semiring matmul (the caller falls back, which raises the error).
struct BatchedOperands {
  Tensor g;  // (C, *batch, M, K)
  Tensor w;  // (*batch, K, N)
  std::vector<int64_t> out_shape;  // (C, *batch, M, N)
};
bool broadcast_operands(const Tensor& g, const Tensor& w, BatchedOperands& out);
// CPU float32/float64 operands of one dtype, and not a graph-building call
// (the kernels are not differentiable: create_graph takes the ATen path).
bool kernel_dtype(const Tensor& g, const Tensor& w);
// min and max of a tensor in one pass; NaN anywhere makes both NaN (one pass
// and two host reads: the kernels themselves check ranges while packing; this
// is for callers that must decide before calling an entry point that raises,
// such as max_matmul_argmax).
std::pair<double, double> range_of(const Tensor& t);

}  // namespace kernels
}  // namespace torch_semiring
