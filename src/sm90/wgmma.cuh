// Warpgroup GEMMs on Hopper: acc (+)= A * B over every k-slice with wgmma, A from shared memory (descriptors) or
// registers, B from shared memory. issue() starts one commit group and returns at once; wait<N>() returns when at
// most N of this warpgroup's groups are still running.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

namespace flashcute::sm90 {

using namespace cute;

// The K-major GMMA shared-memory atom whose swizzle width (64, 32 or 16 elements of 16 bits) divides kCols, the
// operand's columns (or the column slice one MMA reads).
template <class Element, int kCols>
using GmmaAtomK = std::conditional_t<
    kCols % 64 == 0, decltype(GMMA::Layout_K_SW128_Atom<Element>{}),
    std::conditional_t<kCols % 32 == 0, decltype(GMMA::Layout_K_SW64_Atom<Element>{}),
                       decltype(GMMA::Layout_K_SW32_Atom<Element>{})>>;

// The wgmma op for a 64 x kN x kK warpgroup product (A and B majors as given), float accumulators. CuTe's selectors
// fall back to a narrower instruction (64 x 16 for 80 columns) when kN is no multiple of 32 up to 96, or of 64
// beyond, unless CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED is defined (CMakeLists.txt defines it for every kernel):
// five 64 x 16 wgmmas in place of one 64 x 80 ran the 80-row hd128 backward at 0.66-0.79x the 64-row tile
// (bench/RESULTS.md, 2026-12-06 sixth and seventh sessions). The static_assert makes a narrower instruction a
// build error, not a slow kernel.
template <class Op, int kN>
constexpr Op full_width_gmma() {
  static_assert(size<1>(typename MMA_Traits<Op>::Shape_MNK{}) == kN,
                "wgmma narrower than the tile's columns: define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED");
  return Op{};
}
template <class Element, int kN, int kK, GMMA::Major kMajorA = GMMA::Major::K, GMMA::Major kMajorB = GMMA::Major::K>
constexpr auto gmma_ss() {
  using Op =
      decltype(GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kN>, Int<kK>>, kMajorA, kMajorB>());
  return full_width_gmma<Op, kN>();
}
// A from registers (K-major by construction).
template <class Element, int kN, int kK, GMMA::Major kMajorB = GMMA::Major::K>
constexpr auto gmma_rs() {
  using Op = decltype(GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kN>, Int<kK>>, GMMA::Major::K,
                                           kMajorB>());
  return full_width_gmma<Op, kN>();
}

// kZeroInit: the first k-slice overwrites acc instead of adding to it (no clear needed). kRegA: A holds register
// values (P), not shared-memory descriptors. Until the matching wait, neither acc nor a register A may be touched.
template <bool kZeroInit, bool kRegA, class TiledMma, class TA, class TB, class Acc>
CUTE_DEVICE void warpgroup_issue(TiledMma& mma, TA const& a, TB const& b, Acc& acc) {
  // The fences keep the compiler from moving register reads or writes of the operands across the async MMAs.
  if constexpr (kRegA) warpgroup_fence_operand(const_cast<TA&>(a));
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  mma.accumulate_ = kZeroInit ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(a); ++k) {
    cute::gemm(mma, a(_, _, k), b(_, _, k), acc);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
}

// After the wait, the fence keeps the compiler from reading the operands before it.
template <int kInFlight, class... Operands>
CUTE_DEVICE void warpgroup_wait_for(Operands&... ops) {
  warpgroup_wait<kInFlight>();
  (warpgroup_fence_operand(ops), ...);
}

}  // namespace flashcute::sm90
