// How the block code of the CUDA kernels is executed: once per thread on the
// GPU, or every thread in turn on the host (the emulation the tests run).
//
// A kernel's block logic (the *_block.h headers) is a TS_TILE_FN template
//   template <class Exec> static void run(const Params&, Smem&, Exec&)
// written as phases separated by barriers:
//   ex.each([&](int tid, Regs& r) { ... });   // what thread `tid` does
//   ex.sync();                                // __syncthreads()
// State a thread keeps across phases lives in `Regs` (registers on the GPU,
// one Regs per thread on the host); `Smem` is the block's shared memory.
// Block-uniform values (loop bounds over k tiles, …) are plain locals of run().
//
// On the GPU, DeviceThread::each runs the phase for threadIdx.x only; on the
// host, HostBlock::each runs it for tid = 0 … threads−1 and sync() is a no-op
// (a phase is finished for all threads before the next starts, which is what
// the barrier guarantees on the GPU). The emulation therefore executes the
// same loads, tile loops, ⊕/⊗ and stores; what it cannot show is a data race
// inside a phase, or anything about speed.
#pragma once

#include "kernels/tile_arithmetic.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace torch_semiring {
namespace cuda_kernels {

using kernels::argmax_better;
using kernels::argmax_update;

struct Dim3 {
  int64_t x, y, z;
};

#if defined(__CUDACC__)
template <class Regs>
struct DeviceThread {
  Regs regs;
  template <class F>
  __device__ __forceinline__ void each(F&& f) {
    f(int(threadIdx.x), regs);
  }
  __device__ __forceinline__ void sync() { __syncthreads(); }
  __device__ __forceinline__ Dim3 block() const { return {blockIdx.x, blockIdx.y, blockIdx.z}; }
};
#endif

template <class Regs>
struct HostBlock {
  Regs* regs;
  int threads;
  Dim3 idx;
  template <class F>
  void each(F&& f) {
    for (int t = 0; t < threads; ++t) f(t, regs[t]);
  }
  void sync() {}
  Dim3 block() const { return idx; }
};

// bf16 as its raw bits (the upper half of an fp32), so that host code and the
// emulation need no CUDA header; bit-compatible with __nv_bfloat16.
struct Bf16 {
  uint16_t bits;
};
TS_TILE_FN float to_float(float v) { return v; }
TS_TILE_FN float to_float(Bf16 v) {
  uint32_t u = uint32_t(v.bits) << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

TS_TILE_FN float inf_f() { return std::numeric_limits<float>::infinity(); }
TS_TILE_FN float nan_f() { return std::numeric_limits<float>::quiet_NaN(); }
TS_TILE_FN float exp_f(float x) { return ::expf(x); }
TS_TILE_FN float log_f(float x) { return ::logf(x); }
TS_TILE_FN bool is_nan(float x) { return x != x; }

// max into *addr, NaN propagating (a NaN stored stays; a NaN value is stored).
TS_TILE_FN void atomic_max_float(float* addr, float v) {
#if defined(__CUDA_ARCH__)
  int* ai = reinterpret_cast<int*>(addr);
  int old = *ai;
  while (true) {
    const float cur = __int_as_float(old);
    if (is_nan(cur) || !(is_nan(v) || v > cur)) return;
    const int seen = atomicCAS(ai, old, __float_as_int(v));
    if (seen == old) return;
    old = seen;
  }
#else
  const float cur = *addr;
  if (!is_nan(cur) && (is_nan(v) || v > cur)) *addr = v;
#endif
}

TS_TILE_FN void atomic_add_i64(int64_t* addr, int64_t v) {
#if defined(__CUDA_ARCH__)
  atomicAdd(reinterpret_cast<unsigned long long*>(addr), static_cast<unsigned long long>(v));
#else
  *addr += v;
#endif
}

TS_TILE_FN int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A block whose threads each take one element e < p.n of a flat range, with no
// shared memory and no barrier (element-wise kernels): Body::element(p, e)
// does the work. Body derives from it (CRTP); the grid is ceil(n / Threads).
template <class Body, class P, int Threads>
struct PerElementBlock {
  static constexpr int kThreads = Threads;
  using Params = P;
  struct Smem {
    int unused;
  };
  struct Regs {
    int unused;
  };
  TS_TILE_FN static Dim3 grid(const Params& p) { return {ceil_div(p.n, Threads), 1, 1}; }
  template <class Exec>
  TS_TILE_FN static void run(const Params& p, Smem&, Exec& ex) {
    const int64_t base = ex.block().x * Threads;
    ex.each([&](int tid, Regs&) {
      const int64_t e = base + tid;
      if (e < p.n) Body::element(p, e);
    });
  }
};

}  // namespace cuda_kernels
}  // namespace torch_semiring
