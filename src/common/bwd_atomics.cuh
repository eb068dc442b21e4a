// Float32 atomic additions of the backward: dQ into its workspace tiles, and GQA's dK/dV into their accumulators.
#pragma once

#include <cute/tensor.hpp>

namespace flashcute {

using namespace cute;

// dst[0] += a, dst[1] += b: one 8-byte vector reduction on sm_90+, two scalar ones before.
CUTE_DEVICE void atomic_add_pair(float* dst, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(dst), make_float2(a, b));
#else
  atomicAdd(dst, a);
  atomicAdd(dst + 1, b);
#endif
}

// g += acc for a float32 accumulator fragment and its gmem partition (same layout), with atomics. Elements 2i,
// 2i+1 of an SM80 or SM90 accumulator are neighbouring columns, so they go as one pair.
template <class G, class Acc>
CUTE_DEVICE void atomic_add_fragment(G& g, Acc const& acc) {
  static_assert(decltype(size(acc))::value % 2 == 0);
  static_assert(decltype(stride<0, 0>(g.layout()))::value == 1);
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += 2) atomic_add_pair(&g(i), acc(i), acc(i + 1));
}

// Adds a float32 dQ fragment into its tile of the accumulator, laid out in fragment order (T::dq_frag_offset).
// `thread` is threadIdx.x by default; a caller in a loop may pass it read afresh (opaque_thread_index) so that the
// compiler keeps one base address per tile instead of hoisting one per pair out of the loop.
template <class T, class Acc>
CUTE_DEVICE void atomic_add_dq_tile(float* tile, Acc const& acc, int thread = threadIdx.x) {
  static_assert(decltype(size(acc))::value % 2 == 0);
  float* const base = tile + T::dq_frag_offset(0, thread);
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += 2)
    atomic_add_pair(base + T::dq_frag_offset(i, 0), acc(i), acc(i + 1));
}

// threadIdx.x, read where it is used: the compiler cannot hoist a volatile read out of a loop.
CUTE_DEVICE int opaque_thread_index() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}

}  // namespace flashcute
