// GCC vector types and the few helpers the CPU kernels share (cpu_gemm.cpp,
// attention_blocks.cpp): V = VecOf<T, Bytes>::type is Bytes/sizeof(T) lanes
// of T; LaneInt<T> is the integer with T's width (comparison masks, bit
// tricks); load/store move a vector to and from unaligned memory. CPU only
// (tile_arithmetic.h holds what CUDA shares).
#pragma once

#include <cstdint>
#include <cstring>

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

}  // namespace torch_semiring::kernels
