// Compile-time description of one Hopper forward kernel: consumer warpgroups with wgmma tiles (one per 64 query
// rows), a producer warpgroup that fills the K/V stages, GMMA shared-memory layouts for Q, K and V, the TMA and
// cp.async copies, and the register split between the roles.
#pragma once

#include <cute/tensor.hpp>

#include "common/cute_utils.cuh"
#include "common/tile_scheduler.cuh"
#include "sm90/fwd_launch.h"
#include "sm90/pipeline.cuh"
#include "sm90/tma.cuh"
#include "sm90/wgmma.cuh"

namespace flashcute::sm90 {

using namespace cute;

// kHeadDimV: V's and O's head dim where it differs from Q's and K's (DeepSeek's 192 / 128; the default, declared
// in fwd_launch.h, is kHeadDim); both take the same gmem copies, so both must be whole chunks of them.
template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_, int kHeadDimV_>
struct FwdTraits : GmemCopies<Element_, kHeadDim_, 128> {  // one warpgroup's copies: K/V, and each consumer's Q and O
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kWarps = kWarps_;  // consumer warps (the config's name counts these)
  static constexpr int kConsumerThreads = kWarps * 32;
  static constexpr int kProducerThreads = 128;
  static constexpr int kThreads = kConsumerThreads + kProducerThreads;  // consumers first, the producer last
  // Two K/V stages: three (hd64-128) measured no faster (bench/RESULTS.md, eighth session, run 4). The 64-row
  // tile (decode: one CTA per SM whose loads, not its MMAs, set the pace) takes three where they fit.
  static constexpr int kStages =
      kBlockM == 64 && ((64 + 3 * kBlockN) * kHeadDim + 3 * kBlockN * kHeadDimV) * 2 + 1024 <= 227 * 1024 ? 3 : 2;
  static_assert(kBlockM % 64 == 0 && kConsumerThreads == 128 * (kBlockM / 64), "one warpgroup per 64 query rows");
  // setmaxnreg budgets (65536 registers per SM, one CTA): the producer only computes addresses. Key tiles wider
  // than 128 (tuning candidates) hold larger S accumulators: their consumers take 240 and the producer 24, FA3's
  // split (ptxas: hd128 n176 then spills 32 B, against 44 B at 232).
  // Three consumer warpgroups (192 query rows, FA3's and FA4's hd64 tile) share what is left after 24: 160 each.
  // One consumer warpgroup (64 rows, decode) leaves registers for a producer that gathers paged rows unrolled.
  static constexpr int kProducerRegs = kBlockM == 64 ? 96 : kBlockM == 192 || kBlockN > 128 ? 24 : 40;
  // Paged rows gathered this many at a time (copy_rows_zfill; 0: a whole tile).
  static constexpr int kGatherGroup = kBlockM == 64 ? 0 : 4;
  static constexpr int kConsumerRegs = kBlockM == 192 ? 160 : kBlockN > 128 ? 240 : 232;
  // setmaxnreg moves registers within what the CTA was launched with (the kernel's count, which ptxas sets from
  // the launch bounds: 65536 / threads, a multiple of 8, at most 255): asking more than that hangs the consumers'
  // increase forever. 384 threads launch with 168 each, so 32 + 240 (65536 in all) deadlocks where 24 + 240 fits.
  static constexpr int kLaunchRegs = (65536 / kThreads < 255 ? 65536 / kThreads : 255) / 8 * 8;
  static_assert(kProducerRegs * kProducerThreads + kConsumerRegs * kConsumerThreads <= kLaunchRegs * kThreads,
                "setmaxnreg budgets exceed the registers the CTA launches with");
  // The consumer warpgroups take turns issuing their MMAs at head dims up to 128 only, as FA3 does: beyond, one
  // warpgroup's softmax is short beside its own MMAs, and the turn barriers only delay issue.
  static constexpr bool kTakeTurns = kHeadDim <= 128;
  // Persistent grid: producer thread 0 hands the consumers the next tile decoded (FwdTile) rather than its index,
  // which each consumer decoded twice per block (for the next Q, and at the loop top): on an H100 1.02-1.10x at 1k-2k
  // (hd64 causal 1.08-1.10x, hd128 causal 1.05-1.06x), 0.98-1.03x from 4k, hd256 non-causal 8k-16k at 0.98-0.99x
  // (bench/RESULTS.md, 2026-12-07 twelfth session). The 192-row tile (three warpgroups of 160 registers) keeps the
  // index: the tile there ran 0.97-0.98x from 4k.
  static constexpr bool kHandOverTile = kBlockM == 128;
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256 && kHeadDim % 32 == 0 && kHeadDim <= 256);
  static_assert(kHeadDimV <= kHeadDim && kHeadDimV % GmemCopies<Element_, kHeadDim_, 128>::kRowChunk == 0);

  // Rows of 128 bytes (64 elements) take the 128-byte swizzle; head dims that are odd multiples of 32 the 64-byte
  // one. The same atom serves Q and K (K-major operands) and, read transposed, V (the MN-major B of P.V).
  using SmemAtom = GmmaAtomK<Element, kHeadDim>;
  using SmemAtomV = GmmaAtomK<Element, kHeadDimV>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutO = decltype(tile_to_shape(SmemAtomV{}, Shape<Int<kBlockM>, Int<kHeadDimV>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutV = decltype(tile_to_shape(SmemAtomV{}, Shape<Int<kBlockN>, Int<kHeadDimV>, Int<kStages>>{}));
  using SmemLayoutVt = decltype(composition(
      SmemLayoutV{}, make_ordered_layout(Shape<Int<kHeadDimV>, Int<kBlockN>, Int<kStages>>{}, Step<_2, _1, _3>{})));

  // S = Q K^T from shared memory; O += P V with P in registers (the S accumulators, converted).
  using AtomLayout = Layout<Shape<Int<kBlockM / 64>, _1, _1>>;
  using TiledMmaS = decltype(make_tiled_mma(
      gmma_ss<Element, kBlockN, kHeadDim>(), AtomLayout{}));
  using TiledMmaO = decltype(make_tiled_mma(gmma_rs<Element, kHeadDimV, kBlockN, GMMA::Major::MN>(), AtomLayout{}));

  // TMA (fixed-length batches): K and V as (seqlen, head_dim, heads, batch) tensors, one K/V stage per copy; rows
  // past the sequence and columns past the head dim arrive as zeros.
  using TmaKV = RowsTma<Element, decltype(take<0, 2>(SmemLayoutKV{})), kBlockN, kHeadDim>;
  using TmaV = RowsTma<Element, decltype(take<0, 2>(SmemLayoutV{})), kBlockN, kHeadDimV>;
  static constexpr uint32_t kTmaBytes = kBlockN * kHeadDim * sizeof(Element);
  static constexpr uint32_t kTmaBytesV = kBlockN * kHeadDimV * sizeof(Element);
  // Paged K/V with pages shorter than a key tile (page_size a multiple of kPageRows dividing kBlockN): one copy of
  // kPageRows rows per lane of the producer's first warp, into those rows of the stage.
  static constexpr int kPageRows = 16;
  using SmemLayoutKVRows = decltype(composition(take<0, 2>(SmemLayoutKV{}),
                                                make_layout(Shape<Int<kPageRows>, Int<kHeadDim>>{},
                                                            make_stride(_1{}, Int<kBlockN>{}))));
  using SmemLayoutVRows = decltype(composition(take<0, 2>(SmemLayoutV{}),
                                               make_layout(Shape<Int<kPageRows>, Int<kHeadDimV>>{},
                                                           make_stride(_1{}, Int<kBlockN>{}))));
  using TmaKVRows = RowsTma<Element, SmemLayoutKVRows, kPageRows, kHeadDim>;
  using TmaVRows = RowsTma<Element, SmemLayoutVRows, kPageRows, kHeadDimV>;
  static_assert(kBlockN % kPageRows == 0 && kBlockN / kPageRows <= 32);

  // The epilogue stages each warpgroup's O rows (16-bit, in Q's layout) in a buffer of their own where it fits
  // beside Q and the K/V stages, so that the next tile's Q can load under the epilogue of this one (persistent
  // grid); elsewhere in the warpgroup's own rows of Q, the next Q loading after the epilogue.
  static constexpr int kTileBytes = ((kBlockM + kStages * kBlockN) * kHeadDim + kStages * kBlockN * kHeadDimV) * 2 +
                                    1024;
  static constexpr bool kOwnO = kTileBytes + kBlockM * kHeadDimV * 2 <= 227 * 1024;

  struct SharedStorage {
    // GMMA descriptors assume each operand starts on a swizzle-pattern boundary (1024 B covers every swizzle).
    alignas(1024) Element q[cosize_v<SmemLayoutQ>];  // all three reused for O (float32) by split-KV's epilogue
    alignas(1024) Element k[cosize_v<SmemLayoutKV>];
    alignas(1024) Element v[cosize_v<SmemLayoutV>];
    alignas(1024) Element o[kOwnO ? cosize_v<SmemLayoutO> : 1];
    TileRing<kStages> k_ring;
    TileRing<kStages> v_ring;
    TileRing<2> tile_ring;  // persistent grid: the next tile, from the producer to the consumers
    FwdTile next_tile[2];   // decoded (kHandOverTile), or its index in the first int (fwd_kernel's Handed)
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes == kTileBytes + (kOwnO ? kBlockM * kHeadDimV * 2 : 0),
                "must match smem_bytes() in src/instantiations/generate.py, which dispatch reads");
};

}  // namespace flashcute::sm90
