// Compile-time description of one portable forward kernel: the MMA, shared-memory layouts and copies for a
// (dtype, head dim, tile) instantiation. Tiles per arch profile are chosen in src/instantiations/kernels.py.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>

#include "common/cute_utils.cuh"
#include "sm80/fwd_launch.h"

namespace flashcute::sm80 {

using namespace cute;

template <class Element>
using Sm80MmaAtom = std::conditional_t<std::is_same_v<Element, cutlass::half_t>,
                                       MMA_Atom<SM80_16x8x16_F32F16F16F32_TN>,
                                       MMA_Atom<SM80_16x8x16_F32BF16BF16F32_TN>>;

// Shared pieces of the forward and backward tiles: a 16-byte-vector swizzle for rows of 64 (or 32) elements,
// which makes both cp.async stores and ldmatrix reads bank-conflict free.
template <class Element, int kHeadDim, int kThreads>
struct Sm80TileBase : GmemCopies<Element, kHeadDim, kThreads> {
  static constexpr int kBlockKSmem = GmemCopies<Element, kHeadDim, kThreads>::kRowChunk;
  static constexpr int kSwizzleBits = kBlockKSmem == 64 ? 3 : 2;
  using SmemAtom = decltype(composition(Swizzle<kSwizzleBits, 3, 3>{},
                                        Layout<Shape<_8, Int<kBlockKSmem>>, Stride<Int<kBlockKSmem>, _1>>{}));
  using SmemLoadN = Copy_Atom<SM75_U32x4_LDSM_N, Element>;
  using SmemLoadT = Copy_Atom<SM75_U16x8_LDSM_T, Element>;
  using SmemStoreC = Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<32>, Element>;
};

template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_>
struct FwdTraits : Sm80TileBase<Element_, kHeadDim_, kWarps_ * 32> {
  using Element = Element_;
  using Base = Sm80TileBase<Element_, kHeadDim_, kWarps_ * 32>;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static_assert(kBlockM % (16 * kWarps) == 0, "each warp owns whole 16-row MMA slabs of the Q tile");
  static_assert(kBlockN % 16 == 0 && kHeadDim % 32 == 0);

  // Where the barrier before the next K prefetch goes: after the softmax (late) or before it. ptxas spills less
  // with it late, and slows down the large head dims, which do not spill either way (sm_90a, H200, bf16):
  //   late:  spills hd64 100 -> 0 B, hd96 176 -> 0, hd128 128x32 44 -> 0, 128x64 216 -> 168; speed at hd64 and
  //          hd128 unchanged within run-to-run noise (bench/RESULTS.md, runs G and H);
  //   early: hd256 128x64 w8 0.97-1.18x FA2 where late gave 0.85-1.01x (runs H and G).
  static constexpr bool kLateKPrefetch = kHeadDim_ <= 128;

  // How far ahead the B operands of both GEMMs are loaded (common/cute_utils.cuh), by measured ptxas spills (nvcc
  // 13.0, bf16 and fp16): hd128 128x32 spills 4 B on sm_80 with a k-slice ahead and nothing on sm_80, sm_90a or
  // sm_120 with one copy ahead; hd128 128x64 spills either way (168 -> 200 B on sm_90a, 208 B on sm_80 with a copy
  // ahead), and the other head dims are spill-free with a slice ahead only (a copy ahead: hd256 128x64 w8 36 B).
  static constexpr Prefetch kStreamB = kHeadDim_ == 128 && kBlockN_ == 32 ? Prefetch::kCopy : Prefetch::kSlice;

  // A row's max and sum in this many interleaved chains (common/softmax.cuh). hd64 (32 columns a row per thread)
  // takes four: under FLASHCUTE_ARCH=80 on an H100 1.03-1.04x one chain (thirteenth session), 0.99-1.03x in the
  // fourteenth's A/B (bench/RESULTS.md, 2026-12-07); hd128 measured 0.96-0.99x and keeps one, as do the Hopper
  // tiles (hd64: 0.97-1.03x with four chains for max and sum, 0.99-1.03x for the max alone).
  static constexpr int kSoftmaxChains = kHeadDim_ == 64 ? 4 : 1;

  // Warps split the query rows, so softmax row reductions never leave a warp.
  using TiledMma = TiledMMA<Sm80MmaAtom<Element>, Layout<Shape<Int<kWarps>, _1, _1>>, Tile<Int<16 * kWarps>, _16, _16>>;

  using SmemLayoutQ = decltype(tile_to_shape(typename Base::SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(typename Base::SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  // V read as Vt (head_dim x block_n) for the P.V product: the same bytes, transposed coordinates.
  using SmemLayoutVt =
      decltype(composition(SmemLayoutKV{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));

  struct SharedStorage {
    alignas(128) Element q[cosize_v<SmemLayoutQ>];  // reused for O in the epilogue
    alignas(128) Element k[cosize_v<SmemLayoutKV>];
    alignas(128) Element v[cosize_v<SmemLayoutKV>];
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes == (kBlockM + 2 * kBlockN) * kHeadDim * 2,
                "must match smem_bytes() in src/instantiations/generate.py, which dispatch reads");
};

}  // namespace flashcute::sm80
