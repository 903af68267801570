// Block logic of the fused element-wise ops on a device: the semirings' ⊗ by
// an edge and ⊕ of fused_ops.inc (entropy's (ℓ, h), max_prod's (M, m), kmax's
// lists, the log-space and magnitude lifts), one launch per node where the
// generic ATen expression takes 3–12 (kernels/elementwise.h). The arithmetic is
// the CPU loops' own (fused_ops.inc, instantiated here with V = T); only the
// walk over the elements is this file's.
//
// Operands: a value a (C, *S) and either a second value b (C, *S) (⊕) or the
// weights w (*S) (⊗ edge), each with any element strides (0 for broadcast
// dims), S given as at most kFusedMaxDims dims (the glue merges the dims it
// can); out is (C, *S) contiguous. One thread per element of S: it unravels
// its index into each operand's offset, reads the C components, runs the op,
// writes C components. fp32 or fp64 (T). Cost: one read of each operand and
// one write of the result, as on the CPU.
// Executed per thread on the GPU (elementwise.cu) and on the host by the
// emulation (emulate_host.cpp, and the extension's emulated backend); see
// block_exec.h.
#pragma once

#include <type_traits>

#include "kernels/cuda/block_exec.h"
#include "kernels/fused_op.h"

namespace torch_semiring {
namespace cuda_kernels {

namespace fused_arithmetic {
using kernels::Fused;
// fused_ops.inc's vector_log / vector_log_normal / vector_exp, one lane: the
// device's (or host's) own logf / log and expf / exp.
namespace vmath {
template <class T, class V>
TS_TILE_FN V vector_log(V x) {
  if constexpr (sizeof(T) == sizeof(float)) return ::logf(x);
  else return ::log(x);
}
template <class T, class V>
TS_TILE_FN V vector_log_normal(V x) {
  return vector_log<T, V>(x);
}
template <class T, class V>
TS_TILE_FN V vector_exp(V x) {
  if constexpr (sizeof(T) == sizeof(float)) return ::expf(x);
  else return ::exp(x);
}
}  // namespace vmath
#define TS_FUSED_FN TS_TILE_FN
#include "kernels/fused_ops.inc"
#undef TS_FUSED_FN
}  // namespace fused_arithmetic

constexpr int kFusedMaxDims = 6;

template <class T>
struct FusedParams {
  int64_t n;  // elements of S
  int ndim;
  int64_t size[kFusedMaxDims];  // S, row-major
  const T* a;
  int64_t a_c, a_s[kFusedMaxDims];  // component stride, dim strides
  const T* b;                       // the second value (⊕) or the weights (⊗ edge; b_c unused)
  int64_t b_c, b_s[kFusedMaxDims];
  T* out;  // (C, n), contiguous
};

template <class Op, bool Pair, class T, int Threads = 256>
struct FusedBlock : PerElementBlock<FusedBlock<Op, Pair, T, Threads>, FusedParams<T>, Threads> {
  TS_TILE_FN static void element(const FusedParams<T>& p, int64_t e) {
    int64_t rest = e, oa = 0, ob = 0;
    for (int d = p.ndim - 1; d >= 0; --d) {
      const int64_t i = rest % p.size[d];
      rest /= p.size[d];
      oa += i * p.a_s[d];
      ob += i * p.b_s[d];
    }
    constexpr int C = Op::kC;
    T in[Pair ? 2 * C : C], out[C];
    for (int c = 0; c < C; ++c) in[c] = p.a[oa + c * p.a_c];
    if constexpr (Pair) {
      for (int c = 0; c < C; ++c) in[C + c] = p.b[ob + c * p.b_c];
      Op::template pair<T, T>(in, in + C, out);
    } else {
      Op::template edge<T, T>(in, p.b[ob], out);
    }
    for (int c = 0; c < C; ++c) p.out[c * p.n + e] = out[c];
  }
};

}  // namespace cuda_kernels
}  // namespace torch_semiring
