// Compile-time description of one Hopper backward kernel: how its warpgroups share a key tile, the five wgmma
// products with their operand majors, GMMA shared-memory layouts (a ring of Q/dO stages) and the copies.
// Tiles are chosen in src/instantiations/kernels.py, whose generate.py smem_bytes() mirrors kSmemBytes.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>

#include "common/cute_utils.cuh"
#include "sm90/bwd_launch.h"
#include "sm90/tma.cuh"
#include "sm90/wgmma.cuh"

namespace flashcute::sm90 {

using namespace cute;

// kHeadDimV: V's, dO's and dV's head dim where it differs from Q's and K's (DeepSeek's 192 / 128; the default,
// declared in bwd_launch.h, is kHeadDim).
// kStages_: the Q/dO stages where not the tile's own (0; a kernel with a dQ buffer beside the tile may take fewer).
template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_, int kHeadDimV_, int kStages_>
struct BwdTraits : GmemCopies<Element_, kHeadDim_, kWarps_ * 32> {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr int kBlockM = kBlockM_;  // query rows per step
  static constexpr int kBlockN = kBlockN_;  // keys owned by one CTA
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kWarpgroups = kThreads / 128;
  // Warpgroups either take 64 keys each (kBlockN = 64 * warpgroups), or, for head dims whose dK and dV would not
  // fit one warpgroup's registers, all take the same 64 keys and split the head dim (kSplitHeadDim).
  static constexpr bool kSplitHeadDim = kBlockN == 64 && kWarpgroups > 1;
  // Or (kSwapKV, FA3's and FA4's tile above hd128) each warpgroup takes 48 keys: S = Q K^T with the queries as the
  // wgmma rows (48 cannot be), and dK^T = Q^T dS, dV^T = dO^T P with the head dim as the rows; P and dS both go
  // through shared memory.
  static constexpr bool kSwapKV = kBlockN == 48 * kWarpgroups;
  static_assert(kBlockN == 64 * kWarpgroups || kSplitHeadDim || kSwapKV);
  static constexpr bool kPtInSmem = kSplitHeadDim || kSwapKV;
  static constexpr int kKeyGroups = kSplitHeadDim ? 1 : kWarpgroups;
  static constexpr int kDimGroups = kSplitHeadDim ? kWarpgroups : 1;
  // Q/dO stages. The loads of step i + kStages - 1 are issued right after step i's shared-memory barrier, which
  // every warp passes only once done with step i - 1, whose stage they refill: no CTA barrier at a step's start.
  // Three stages give those loads more than a step to land; hd192 and hd256 have room for two.
  static constexpr int kStages = kStages_ ? kStages_ : kPtInSmem ? 2 : 3;
  template <int kStagesWith>
  using WithStages = BwdTraits<Element_, kHeadDim_, kBlockM_, kBlockN_, kWarps_, kHeadDimV_, kStagesWith>;
  // dS^T (and P^T) alternate between two buffers, so a warpgroup may store step i's while the other still reads
  // step i - 1's.
  // kSwapKV takes FA3's and FA4's hd192 stages instead: one dO stage and one dS / P stage, which leave room beside
  // the tile for the dQ writer's float32 buffer (bwd_ws_kernel). Each step then passes one more barrier, once every
  // warpgroup's dV and dQ are done: after it dO of the next step loads, and the dS stage (which every warpgroup's
  // dQ reads) may be stored again; P is read by its own warpgroup's dV alone.
  static constexpr bool kOneDoStage = kSwapKV;
  static constexpr int kDoStages = kOneDoStage ? 1 : kStages;
  static constexpr int kDsStages = kSwapKV ? 1 : 2;
  // Deterministic mode orders the CTAs' dQ additions by turns (common/bwd_dq_order.cuh) in every tile, in a kernel
  // of its own (bwd_kernel's kTurns): the turn code cost the default mode 0.4-2.3% at hd192 and hd256 and 3-4% at
  // hd64 (bench/RESULTS.md, fourteenth session), and a dQ slot per CTA, the other scheme, sends the additions to
  // memory once the slots outgrow L2 (2026-12-06, second session). Where a float32 dQ buffer fits beside the tile
  // (hd64 with two stages, hd128, hd192), the TMA kernel hands dQ to a writer thread that alone waits on the turns
  // (bwd_ws_kernel).
  // src/arch/registry.h's orders_dq_by_turns agrees.
  static constexpr bool kDqTurns = true;
  static_assert(kBlockM == 64 || (kBlockM == 128 && !kPtInSmem),
                "dQ = dS K: one or two wgmma row blocks, their columns split over the warpgroups");
  static_assert(kHeadDim % (16 * kWarpgroups) == 0 && kHeadDim <= 256);
  static_assert(kHeadDimV <= kHeadDim && kHeadDimV % (16 * kWarpgroups) == 0 &&
                kHeadDimV % GmemCopies<Element_, kHeadDim_, kWarps_ * 32>::kRowChunk == 0);

  // Products, every one with 64 rows per wgmma:
  //   S^T = K Q^T, dP^T = V dO^T   (keys x queries; A and B K-major in shared memory)
  //   dV += P^T dO, dK += dS^T Q   (keys x head dim; dO and Q read MN-major)
  //   dQ = dS K                    (queries x head dim, split by columns over the warpgroups; dS and K read MN-major)
  // Computing S^T rather than S leaves P^T and dS^T in the registers that dV and dK take as their A operand, so only
  // dS goes through shared memory. With kSplitHeadDim each warpgroup computes S^T and dP^T for its share of the
  // queries, and dV / dK for its share of the head dim: P^T and dS^T go through shared memory for both.
  // kSwapKV: S = Q K^T, dP = dO V^T (queries x keys), the warpgroups side by side along the keys.
  using TiledMmaSdP = std::conditional_t<
      kSwapKV,
      decltype(make_tiled_mma(gmma_ss<Element, kBlockN / kWarpgroups, kHeadDim>(),
                              Layout<Shape<_1, Int<kWarpgroups>, _1>>{})),
      decltype(make_tiled_mma(gmma_ss<Element, kBlockM / kDimGroups, kHeadDim>(),
                              Layout<Shape<Int<kKeyGroups>, Int<kDimGroups>, _1>>{}))>;
  // The S / dP tile: keys x queries, or (kSwapKV) queries x keys.
  using TileS = std::conditional_t<kSwapKV, Shape<Int<kBlockM>, Int<kBlockN>>, Shape<Int<kBlockN>, Int<kBlockM>>>;
  // dK (kHeadDim columns) and dV (kHeadDimV).
  // kSwapKV: dK^T, dV^T (head dim x keys), Q^T / dO^T and dS / P read MN-major, the warpgroups along the keys; the
  // head dim is the wgmma rows, so one op serves both widths.
  using TiledMmaGradSwap = decltype(make_tiled_mma(
      gmma_ss<Element, kBlockN / kWarpgroups, kBlockM, GMMA::Major::MN, GMMA::Major::MN>(),
      Layout<Shape<_1, Int<kWarpgroups>, _1>>{}));
  template <int kCols>
  using TiledMmaGradUnswapped = decltype(make_tiled_mma(
      std::conditional_t<kSplitHeadDim,
                         decltype(gmma_ss<Element, kCols / kDimGroups, kBlockM, GMMA::Major::K, GMMA::Major::MN>()),
                         decltype(gmma_rs<Element, kCols / kDimGroups, kBlockM, GMMA::Major::MN>())>{},
      Layout<Shape<Int<kKeyGroups>, Int<kDimGroups>, _1>>{}));
  template <int kCols>
  using TiledMmaGrad = std::conditional_t<kSwapKV, TiledMmaGradSwap, TiledMmaGradUnswapped<kCols>>;
  // The dK / dV tiles as their accumulators hold them: keys x head dim, or (kSwapKV) head dim x keys.
  template <int kCols>
  using TileGrad = std::conditional_t<kSwapKV, Shape<Int<kCols>, Int<kBlockN>>, Shape<Int<kBlockN>, Int<kCols>>>;
  using TiledMmaKV = TiledMmaGrad<kHeadDim>;
  using TiledMmaV = TiledMmaGrad<kHeadDimV>;
  // dQ in column chunks of kDqCols, each split over the warpgroups. One chunk serves up to hd192; hd256 takes four
  // (32 columns, 16 registers per thread each). ptxas on sm_90a, nvcc 13.0: hd256 with two chunks spilled 12 B.
  static constexpr int kDqChunks = kHeadDim == 256 ? 4 : 1;
  static constexpr int kDqCols = kHeadDim / kDqChunks;
  static constexpr int kDqColsPerWarpgroup = kDqCols / kWarpgroups;
  // dS is read K-major where it is stored queries x keys (kSwapKV), else MN-major (dS^T stored).
  using TiledMmaQ = decltype(make_tiled_mma(
      gmma_ss<Element, kDqColsPerWarpgroup, kBlockN, kSwapKV ? GMMA::Major::K : GMMA::Major::MN, GMMA::Major::MN>(),
      Layout<Shape<_1, Int<kWarpgroups>, _1>>{}));

  // The float32 dQ accumulator holds each (kBlockM, kDqCols) chunk in the dQ product's fragment order, as the
  // portable family does (src/sm80/bwd_traits.cuh): pair j of thread t at 2 * (j * kThreads + t) + {0, 1}, so one
  // warp's atomic covers 256 contiguous bytes.
  CUTE_HOST_DEVICE static constexpr int dq_frag_offset(int i, int thread) {
    return 2 * ((i / 2) * kThreads + thread) + i % 2;
  }

  // Q and dO rows are read K-major by S^T / dP^T and, transposed, MN-major by dK / dV in column slices of
  // kHeadDim / kDimGroups. K is read K-major by S^T and, transposed, MN-major by dQ in column slices of
  // kDqColsPerWarpgroup. Each swizzle width must divide its slices.
  // (kSwapKV: the dQ conversion stores its chunks' kDqColsPerWarpgroup columns into Q's layout too.)
  using SmemAtomQ = GmmaAtomK<Element, kSwapKV ? kDqColsPerWarpgroup : kHeadDim / kDimGroups>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtomQ{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutQs = decltype(tile_to_shape(SmemAtomQ{},
                                              Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutQst = decltype(composition(
      SmemLayoutQs{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockM>, Int<kStages>>{}, Step<_2, _1, _3>{})));
  // dO as Q, at V's head dim.
  using SmemLayoutdOs = decltype(tile_to_shape(GmmaAtomK<Element, kHeadDimV / kDimGroups>{},
                                               Shape<Int<kBlockM>, Int<kHeadDimV>, Int<kDoStages>>{}));
  using SmemLayoutdOst = decltype(composition(
      SmemLayoutdOs{}, make_ordered_layout(Shape<Int<kHeadDimV>, Int<kBlockM>, Int<kDoStages>>{}, Step<_2, _1, _3>{})));
  using SmemLayoutKV =
      decltype(tile_to_shape(GmmaAtomK<Element, kDqColsPerWarpgroup>{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  // V is read K-major by dP^T only (and holds dV in the epilogue).
  using SmemLayoutV = std::conditional_t<
      kHeadDimV == kHeadDim, SmemLayoutKV,
      decltype(tile_to_shape(GmmaAtomK<Element, kHeadDimV>{}, Shape<Int<kBlockN>, Int<kHeadDimV>>{}))>;
  using SmemLayoutKt = decltype(composition(
      SmemLayoutKV{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, Step<_2, _1>{})));
  // dS^T (and P^T) are stored as the registers hold them (keys x queries, queries contiguous): read K-major by
  // dK (dV), and dS^T, transposed, MN-major by dQ.
  // A stage mode last, as for Q: the stage then only offsets each descriptor (a runtime base would rebuild them).
  // kSwapKV: dS and P are stored queries x keys (keys contiguous, swizzled within a warpgroup's 48), read K-major
  // by dQ and, transposed, MN-major by dK^T (dV^T).
  using SmemLayoutdStUnswapped = decltype(tile_to_shape(GmmaAtomK<Element, kBlockM>{},
                                                        Shape<Int<kBlockN>, Int<kBlockM>, Int<kDsStages>>{}));
  using SmemLayoutdSSwapped = decltype(tile_to_shape(GmmaAtomK<Element, kBlockN / kWarpgroups>{},
                                                     Shape<Int<kBlockM>, Int<kBlockN>, Int<kDsStages>>{}));
  using SmemLayoutdSt = std::conditional_t<
      kSwapKV,
      decltype(composition(SmemLayoutdSSwapped{},
                           make_ordered_layout(Shape<Int<kBlockN>, Int<kBlockM>, Int<kDsStages>>{},
                                               Step<_2, _1, _3>{}))),
      SmemLayoutdStUnswapped>;
  using SmemLayoutdS = std::conditional_t<
      kSwapKV, SmemLayoutdSSwapped,
      decltype(composition(SmemLayoutdStUnswapped{},
                           make_ordered_layout(Shape<Int<kBlockM>, Int<kBlockN>, Int<kDsStages>>{},
                                               Step<_2, _1, _3>{})))>;
  // The layout the registers store (S^T's, or kSwapKV S's orientation).
  using SmemLayoutPdSStored = std::conditional_t<kSwapKV, SmemLayoutdS, SmemLayoutdSt>;
  // Register -> shared stores of accumulator pairs (dK, dV, dQ in its conversion; dS^T and P^T in the cp.async
  // kernels).
  using SmemStoreC = Copy_Atom<SharedStore32, Element>;
  // dS^T and P^T in the TMA kernels, every step: stmatrix, four 8 x 8 matrices (16 B of a row per lane) per
  // instruction. With 32-bit stores each of a thread's 16 (hd128) took its own swizzled address, about six
  // instructions apiece.
  using SmemStoreS = Copy_Atom<SM90_U32x4_STSM_N, Element>;

  // TMA (fixed-length batches, BwdParams): Q and dO one query tile into a stage, with its rows' lse_log2 and D by
  // bulk copies, and K and V the CTA's key tile; rows past the sequence and columns past the head dim arrive as zeros.
  using TmaQ = RowsTma<Element, decltype(take<0, 2>(SmemLayoutQs{})), kBlockM, kHeadDim>;
  using TmaDO = RowsTma<Element, decltype(take<0, 2>(SmemLayoutdOs{})), kBlockM, kHeadDimV>;
  using TmaK = RowsTma<Element, SmemLayoutKV, kBlockN, kHeadDim>;
  using TmaV = RowsTma<Element, SmemLayoutV, kBlockN, kHeadDimV>;
  static constexpr uint32_t kDoTmaBytes = kBlockM * kHeadDimV * sizeof(Element);
  static constexpr uint32_t kStageTmaBytes =
      kBlockM * kHeadDim * sizeof(Element) + (kOneDoStage ? 0 : kDoTmaBytes) + 2 * kBlockM * 4;
  static constexpr uint32_t kKeyTileTmaBytes = kBlockN * (kHeadDim + kHeadDimV) * sizeof(Element);

  static constexpr int kQElems = kBlockM * kHeadDim;
  struct SharedStorage {
    // GMMA descriptors assume each operand starts on a swizzle-pattern boundary (1024 B covers every swizzle).
    alignas(1024) Element q[cosize_v<SmemLayoutQs>];
    alignas(1024) Element dout[cosize_v<SmemLayoutdOs>];
    alignas(1024) Element k[cosize_v<SmemLayoutKV>];  // reused for dK in the epilogue
    alignas(1024) Element v[cosize_v<SmemLayoutV>];   // reused for dV in the epilogue
    // dS^T (every stage), then (kSplitHeadDim) P^T (every stage); kSwapKV: dS, then P, queries x keys.
    alignas(1024) Element ds[(kPtInSmem ? 2 : 1) * cosize_v<SmemLayoutdSt>];
    // Per Q stage: lse_log2 then D of its kBlockM rows (as in the portable family).
    alignas(1024) float rows[kStages * 2 * kBlockM];
    // Per Q stage: complete once every thread's cp.async copies into it have landed (one arrival per thread), or
    // with TMA once its bytes have (one arrival, thread 0's).
    uint64_t full[kStages];
    uint64_t key_tile_full;  // TMA: K and V of the CTA's key tile have landed
    uint64_t do_full;        // kOneDoStage: dO has landed (as full[] does for Q)
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static constexpr int kTileElements = kBlockM * (kStages * kHeadDim + kDoStages * kHeadDimV) +
                                       kBlockN * (kHeadDim + kHeadDimV) +
                                       kDsStages * (kPtInSmem ? 2 : 1) * kBlockN * kBlockM;
  static_assert(kSmemBytes == kTileElements * 2 + ((kStages * (2 * kBlockM * 4 + 8) + 16 + 1023) / 1024) * 1024,
                "must match smem_bytes() in src/instantiations/generate.py, which dispatch reads");
};

}  // namespace flashcute::sm90
