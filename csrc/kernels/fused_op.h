// The fused element-wise ops (fused_ops.inc) by name: shared by the CPU loops
// (elementwise.cpp), the CUDA kernels' C API (cuda/api.h: `op` is an int of
// this enum) and their device glue, so it needs no torch header.
#pragma once

namespace torch_semiring::kernels {

enum class Fused {
  AddLogAbs,    // a + log|w| on each of k ≤ 8 components (log, viterbi, kmax)
  AddLogAbsIds, // the same on k scores, k ids passed through: viterbi / kmax path tracking's ⊗ edge (2k components)
  TimesAbs,     // a·|w|, a where a = 0 (abs, max_abs: one component)
  TimesNonzero, // a·[w ≠ 0] (count: one component)
  EntropyOps,   // entropy's ⊗ edge and ⊕
  MaxProdOps,   // max_prod's ⊗ edge and ⊕
  KMaxMerge,    // kmax's ⊕ (k ≤ 8)
  KMaxMergeIds, // the same on (score, id) pairs: kmax path tracking's ⊕ (2k components)
  LogAddExp,    // log's ⊕ (one component)
};

}  // namespace torch_semiring::kernels
