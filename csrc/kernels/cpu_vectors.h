// GCC vector types and the few helpers the CPU kernels share (cpu_gemm.cpp,
// attention_blocks.cpp, norm_rows.cpp): V = VecOf<T, Bytes>::type is Bytes/sizeof(T) lanes
// of T; LaneInt<T> is the integer with T's width (comparison masks, bit
// tricks); load/store move a vector to and from unaligned memory; any_greater
// and lanes_where turn a lane-wise compare into a bool or a bit mask, and
// append_lanes a bit mask into the indices of its set bits. CPU only
// (tile_arithmetic.h holds what CUDA shares).
//
// A rule for the always-inline kernel templates (TS_TILE_FN) that use these
// types: GCC lowers their generic vector code before it is inlined into the
// function whose target (AVX-512, AVX2) it runs under, so a mask made of two
// compares joined by & or | comes out lane by lane (an extract, a compare and
// an insert per lane: max_abs's GEMM rows and the attention rows' scans lost
// 30-45 % to it). Write one compare per mask or select (accumulate with &=,
// nest selects), or take bit masks with lanes_where and combine the integers.
#pragma once

#include <cstdint>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernels/tile_arithmetic.h"  // TS_TILE_FN

namespace torch_semiring::kernels {

template <class T, int Bytes>
struct VecOf {
  typedef T type __attribute__((vector_size(Bytes)));
};

template <class T>
struct LaneIntOf;
template <>
struct LaneIntOf<float> {
  using type = int32_t;
};
template <>
struct LaneIntOf<double> {
  using type = int64_t;
};
template <class T>
using LaneInt = typename LaneIntOf<T>::type;

template <class V, class T>
TS_TILE_FN V load(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
template <class V, class T>
TS_TILE_FN void store(T* p, V v) {
  std::memcpy(p, &v, sizeof(V));
}

// x > y ? x : y lane by lane (y where either is NaN, and where they are equal)
// in one vmaxps / vmaxpd, which computes exactly that: GCC compiles the
// vector-extension select to a compare and a blend (two operations on a
// hot loop's ~30, e.g. the entropy terms' log at max(|w|, FLT_MIN)).
template <class V>
TS_TILE_FN V larger_lanes(V x, V y) {
#if defined(__x86_64__)
  constexpr bool f32 = sizeof(x[0]) == 4;
  if constexpr (sizeof(V) == 64) {
    V r;
    if constexpr (f32) asm("vmaxps %[y], %[x], %[r]" : [r] "=v"(r) : [x] "v"(x), [y] "v"(y));
    else asm("vmaxpd %[y], %[x], %[r]" : [r] "=v"(r) : [x] "v"(x), [y] "v"(y));
    return r;
  } else if constexpr (sizeof(V) == 32) {
    V r;
    if constexpr (f32) asm("vmaxps %[y], %[x], %[r]" : [r] "=x"(r) : [x] "x"(x), [y] "x"(y));
    else asm("vmaxpd %[y], %[x], %[r]" : [r] "=x"(r) : [x] "x"(x), [y] "x"(y));
    return r;
  }
#endif
  return x > y ? x : y;
}

// Whether some lane of x is > y (NaN: no).
template <class V>
TS_TILE_FN bool any_greater(V x, V y) {
  constexpr bool f32 = sizeof(x[0]) == 4;
#if defined(__x86_64__)
  if constexpr (sizeof(V) == 64) {
    unsigned short k;
    if constexpr (f32) asm("vcmpps $30, %[y], %[x], %[k]" : [k] "=Yk"(k) : [x] "v"(x), [y] "v"(y));  // GT_OQ
    else asm("vcmppd $30, %[y], %[x], %[k]" : [k] "=Yk"(k) : [x] "v"(x), [y] "v"(y));
    return k != 0;
  } else if constexpr (sizeof(V) == 32) {
    const auto m = x > y;
    int bits;
    if constexpr (f32) asm("vmovmskps %[m], %[b]" : [b] "=r"(bits) : [m] "x"(m));
    else asm("vmovmskpd %[m], %[b]" : [b] "=r"(bits) : [m] "x"(m));
    return bits != 0;
  } else if constexpr (sizeof(V) == 16) {  // SSE2, the baseline ISA
    if constexpr (f32) return _mm_movemask_ps(_mm_cmpgt_ps((__m128)x, (__m128)y)) != 0;
    else return _mm_movemask_pd(_mm_cmpgt_pd((__m128d)x, (__m128d)y)) != 0;
  }
#endif
  constexpr int L = sizeof(V) / sizeof(x[0]);
  const auto m = x > y;
  bool any = false;
  for (int l = 0; l < L; ++l) any |= m[l] != 0;
  return any;
}

// Bit l set where lane l of x compares true with lane l of y (NaN: not set), up to 16 lanes:
// Cmp is kGreater, kAtLeast, kLess or kEqual, the AVX-512 predicates GT_OQ / GE_OQ / LT_OQ / EQ_OQ (one vcmpp
// into a mask register there; other ISAs: the vector compare, then its lanes gathered into bits).
constexpr int kGreater = 30, kAtLeast = 29, kLess = 17, kEqual = 0;
template <int Cmp, class V>
TS_TILE_FN uint32_t lanes_where(V x, V y) {
  static_assert(Cmp == kGreater || Cmp == kAtLeast || Cmp == kLess || Cmp == kEqual);
  constexpr int L = sizeof(V) / sizeof(x[0]);
#if defined(__x86_64__)
  if constexpr (sizeof(V) == 64 && L == 16) {
    unsigned short k;
    asm("vcmpps %[c], %[y], %[x], %[k]" : [k] "=Yk"(k) : [x] "v"(x), [y] "v"(y), [c] "i"(Cmp));
    return k;
  } else if constexpr (sizeof(V) == 64) {
    unsigned char k;
    asm("vcmppd %[c], %[y], %[x], %[k]" : [k] "=Yk"(k) : [x] "v"(x), [y] "v"(y), [c] "i"(Cmp));
    return k;
  }
  if constexpr (sizeof(V) == 32) {  // AVX2: the VEX compare takes the same predicates, then one movemask
    V m;
    uint32_t bits;
    if constexpr (L == 8)
      asm("vcmpps %[c], %[y], %[x], %[m]\n\tvmovmskps %[m], %[b]"
          : [b] "=r"(bits), [m] "=&x"(m) : [x] "x"(x), [y] "x"(y), [c] "i"(Cmp));
    else
      asm("vcmppd %[c], %[y], %[x], %[m]\n\tvmovmskpd %[m], %[b]"
          : [b] "=r"(bits), [m] "=&x"(m) : [x] "x"(x), [y] "x"(y), [c] "i"(Cmp));
    return bits;
  }
#endif
  // (no lambda here: one would be emitted out of line for the baseline ISA and take a wider vector
  // than that ISA passes — a crash from an AVX2 caller)
  uint32_t bits = 0;
  if constexpr (Cmp == kGreater) {
    const auto m = x > y;
    for (int l = 0; l < L; ++l) bits |= uint32_t(m[l] != 0) << l;
  } else if constexpr (Cmp == kLess) {
    const auto m = x < y;
    for (int l = 0; l < L; ++l) bits |= uint32_t(m[l] != 0) << l;
  } else if constexpr (Cmp == kEqual) {
    const auto m = x == y;
    for (int l = 0; l < L; ++l) bits |= uint32_t(m[l] != 0) << l;
  } else {
    const auto m = x >= y;
    for (int l = 0; l < L; ++l) bits |= uint32_t(m[l] != 0) << l;
  }
  return bits;
}

// For each byte value h, the positions of its set bits in increasing order, one per byte
// (AVX2's append_lanes: 2 KiB, a few lines of it hot).
struct SetBitPositions {
  uint64_t of[256];
  constexpr SetBitPositions() : of{} {
    for (int h = 0; h < 256; ++h) {
      int n = 0;
      for (int l = 0; l < 8; ++l)
        if (h >> l & 1) of[h] |= uint64_t(l) << (8 * n++);
    }
  }
};
inline constexpr SetBitPositions kSetBitPositions{};

// Writes base + l for each set bit l of h (at most 16) to out, in increasing l;
// returns how many. AVX-512: one compress and a store of all 16 lanes (out
// needs room for 16), no branch per bit. AVX2: per byte of h, its bits'
// positions from a table, widened to 8 lanes and stored whole (room for 16).
template <class V>
TS_TILE_FN int append_lanes(int32_t* out, uint32_t h, int32_t base) {
#if defined(__x86_64__)
  if constexpr (sizeof(V) == 64) {  // (asm: an intrinsic would not inline into this untargeted template)
    using I16 = VecOf<int32_t, 64>::type;
    const I16 ids = I16{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15} + base;
    const unsigned short k = static_cast<unsigned short>(h);
    I16 packed;  // compressed in a register, then one plain store (a compressing store to memory is microcoded)
    asm("vpcompressd %[ids], %[packed]%{%[k]%}%{z%}" : [packed] "=v"(packed) : [ids] "v"(ids), [k] "Yk"(k));
    std::memcpy(out, &packed, sizeof(packed));
    return __builtin_popcount(h);
  } else if constexpr (sizeof(V) == 32) {
    using I8 = VecOf<int32_t, 32>::type;
    int n = 0;
    for (int half = 0; half < 2; ++half) {  // (a second byte only in a caller's 16-bit mask)
      const uint32_t byte = (h >> (8 * half)) & 0xffu;
      if (half == 1 && byte == 0) break;
      I8 ids;
      asm("vpmovzxbd %[p], %[ids]" : [ids] "=x"(ids) : [p] "m"(kSetBitPositions.of[byte]));
      ids += base + 8 * half;
      std::memcpy(out + n, &ids, sizeof(ids));
      n += __builtin_popcount(byte);
    }
    return n;
  }
#endif
  int n = 0;
  for (; h; h &= h - 1) out[n++] = base + __builtin_ctz(h);
  return n;
}

}  // namespace torch_semiring::kernels
