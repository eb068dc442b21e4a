// Compile-time description of one portable backward kernel: three warp-tiled MMAs (S/dP, dK/dV, dQ), the
// shared-memory layouts with their transposed views, and the copies, for a (dtype, head dim, tile) instantiation.
// Tiles per arch profile are chosen in src/instantiations/kernels.py, whose bwd_smem_bytes() mirrors kSmemBytes.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>

#include "sm80/bwd_launch.h"
#include "sm80/fwd_traits.cuh"  // Sm80MmaAtom, Sm80TileBase

namespace flashcute::sm80 {

using namespace cute;

// Warps along M for an M x N product on `warps` warps. ldmatrix.x4 feeds 16 rows of A and 16 rows of B per warp,
// so every warp must own whole 16 x 16 slabs; among the splits that allow it, the one that loads the fewest rows
// per k-step (M / wm + N / wn, i.e. the squarest warp tile) wins, ties going to more warps along M.
constexpr int bwd_warps_along_m(int m, int n, int warps) {
  int best = 0, best_cost = 1 << 30;
  for (int wm = 1; wm <= warps; wm *= 2) {
    if (warps % wm) continue;
    int const wn = warps / wm;
    if (m % (16 * wm) || n % (16 * wn)) continue;
    int const cost = m / wm + n / wn;
    if (cost <= best_cost) best = wm, best_cost = cost;
  }
  return best;
}

// Shared-memory classes of the arch profiles (99 KB parts, 163 KB parts, 227 KB parts), see DESIGN.md section 4.
constexpr int bwd_smem_class(int bytes) { return bytes <= 101376 ? 0 : bytes <= 166912 ? 1 : bytes <= 232448 ? 2 : 3; }

// Bytes of one Q stage: Q (kBlockM x D, 16-bit) and its rows' lse_log2 and D (float32).
constexpr int bwd_smem_q_stage(int head_dim, int block_m) { return 2 * block_m * head_dim + 8 * block_m; }

// Bytes of everything with one Q stage: that stage, dO (kBlockM x D), K, V (kBlockN x D), P, dS (kBlockM x kBlockN);
// with V in registers, P and dS take V's bytes once V is read (the epilogue's dV still needs V's).
constexpr int bwd_smem_single(int head_dim, int block_m, int block_n, bool v_in_regs) {
  int const v = block_n * head_dim, pds = 2 * block_m * block_n;
  return bwd_smem_q_stage(head_dim, block_m) +
         2 * (block_m * head_dim + block_n * head_dim + (v_in_regs ? (v > pds ? v : pds) : v + pds));
}

// Q gets a second stage (its load then overlaps a whole iteration) only when that keeps the tile in the same
// profile class; otherwise the tile was sized for a smaller part and the stage would push it out.
constexpr bool bwd_double_buffer_q(int head_dim, int block_m, int block_n, bool v_in_regs) {
  int const single = bwd_smem_single(head_dim, block_m, block_n, v_in_regs);
  return bwd_smem_class(single + bwd_smem_q_stage(head_dim, block_m)) == bwd_smem_class(single);
}

// dO gets a second stage too where that, beside Q's second stage, still keeps the tile in its class: the next step's Q
// and dO then both load at a step's start, and no barrier mid-step waits to refill dO.
constexpr bool bwd_double_buffer_do(int head_dim, int block_m, int block_n, bool v_in_regs) {
  int const single = bwd_smem_single(head_dim, block_m, block_n, v_in_regs);
  return bwd_double_buffer_q(head_dim, block_m, block_n, v_in_regs) &&
         bwd_smem_class(single + bwd_smem_q_stage(head_dim, block_m) + 2 * block_m * head_dim) ==
             bwd_smem_class(single);
}

template <class Element, int M, int N, int kWarps>
struct BwdMma {
  static constexpr int kWarpsM = bwd_warps_along_m(M, N, kWarps);
  static_assert(kWarpsM > 0, "no warp split of this product gives every warp whole 16x16 slabs");
  using type = TiledMMA<Sm80MmaAtom<Element>, Layout<Shape<Int<kWarpsM>, Int<kWarps / kWarpsM>, _1>>,
                        Tile<Int<16 * kWarpsM>, Int<16 * (kWarps / kWarpsM)>, _16>>;
};

// kVInRegs_: V stays in registers for the whole key tile (the B operand of dP = dO V^T, FA2's Is_V_in_regs): the dP
// product reads only dO from shared memory, and P and dS take V's bytes. kernels.py's BWD_V_IN_REGS names the tiles
// (64 rows on 8 warps: each thread holds 128 values of V besides its dK and dV accumulators).
template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_, bool kVInRegs_>
struct BwdTraits : Sm80TileBase<Element_, kHeadDim_, kWarps_ * 32> {
  using Element = Element_;
  using Base = Sm80TileBase<Element_, kHeadDim_, kWarps_ * 32>;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDim;  // V and dO are padded to Q's head dim
  static constexpr int kBlockM = kBlockM_;  // query rows per inner step
  static constexpr int kBlockN = kBlockN_;  // keys owned by one CTA
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static_assert(kHeadDim % 32 == 0 && kBlockM % 16 == 0 && kBlockN % 16 == 0);
  static_assert(128 % kBlockM == 0 && 128 % kBlockN == 0,
                "src/api/workspace.h rounds rows to 128");
  static_assert(kBlockM % (kThreads / Base::kGmemThreadsPerRow) == 0 &&
                    kBlockN % (kThreads / Base::kGmemThreadsPerRow) == 0,
                "tile rows must be a whole number of gmem copy passes");
  static constexpr bool kVInRegs = kVInRegs_;
  static constexpr bool kDoubleBufferQ = bwd_double_buffer_q(kHeadDim, kBlockM, kBlockN, kVInRegs);
  // Deterministic mode: the hd256 tiles' CTAs of a query tile add their dQ in turns (common/bwd_dq_order.cuh); the
  // others give each CTA of a column a dQ slot (src/api/workspace.h). Turns ran 0.97-1.16x slots at hd256 but
  // 0.87-1.22x at hd192, mostly slower there (bench/RESULTS.md, twenty-third session, run 1).
  // src/arch/registry.h's orders_dq_by_turns agrees.
  static constexpr bool kDqTurns = kHeadDim == 256;
  static_assert(!kDqTurns || kWarps * kDqTurnRows <= kBlockM, "one turn word per warp of a query tile");
  static constexpr int kQStages = kDoubleBufferQ ? 2 : 1;
  static constexpr bool kDoubleBufferDo = bwd_double_buffer_do(kHeadDim, kBlockM, kBlockN, kVInRegs);
  static constexpr int kDoStages = kDoubleBufferDo ? 2 : 1;

  // dQ = dS K is produced in column chunks (whole 64-column swizzle atoms of K) when a whole (kBlockM, D)
  // accumulator would cost more than 32 registers per thread on top of the live dK/dV accumulators; hd256 takes
  // four chunks of 64. Measured ptxas spills (sm_90a, nvcc 13.0) on tiles since dropped: hd256 64x64 w8 188 B with
  // two chunks, 48 B with four; 32x32 w4 60 -> 32 B (eight chunks of 32 left 8-28 B); two chunks at hd128 64x128
  // raised its spills from 52 to 72 B.
  static constexpr int kDqChunks = kHeadDim == 256                                                   ? 4
                                   : kBlockM * kHeadDim / kThreads > 32 && (kHeadDim / 2) % 64 == 0 ? 2
                                                                                                    : 1;
  static constexpr int kDqCols = kHeadDim / kDqChunks;

  // The float32 dQ accumulator holds each (kBlockM, kDqCols) tile of a (batch, head) in the dQ MMA's fragment
  // order: pair j (elements 2j, 2j+1) of thread t at 2 * (j * kThreads + t) + {0, 1}. A warp's atomic add then
  // covers 256 contiguous bytes (2 L2 requests of 4 sectors) where the row-major tile took 8 one-sector requests;
  // ncu (hd128, 8k) showed 4x FA2's L2 reduction requests and MIO-throttle stalls at those adds. The tiles follow
  // one another in (query tile, chunk) order, so a (batch, head) keeps its seqlen_q_rounded x kHeadDim floats.
  CUTE_HOST_DEVICE static constexpr int dq_frag_offset(int i, int thread) {
    return 2 * ((i / 2) * kThreads + thread) + i % 2;
  }

  using TiledMmaSdP = typename BwdMma<Element, kBlockM, kBlockN, kWarps>::type;   // S = Q K^T, dP = dO V^T
  using TiledMmaKV = typename BwdMma<Element, kBlockN, kHeadDim, kWarps>::type;   // dV = P^T dO, dK = dS^T Q
  using TiledMmaQ = typename BwdMma<Element, kBlockM, kDqCols, kWarps>::type;     // dQ = dS K, one chunk

  using SmemLayoutQ = decltype(tile_to_shape(typename Base::SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(typename Base::SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  // Q and dO as the (D, kBlockM) B operand of dK / dV, K as the (D, kBlockN) B operand of dQ: same bytes, read
  // with ldmatrix.trans through transposed coordinates.
  using SmemLayoutQt =
      decltype(composition(SmemLayoutQ{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockM>>{}, GenRowMajor{})));
  using SmemLayoutKt =
      decltype(composition(SmemLayoutKV{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));

  // P and dS rows are kBlockN long: their own swizzle width.
  static constexpr int kPdSCols = kBlockN % 64 == 0 ? 64 : kBlockN % 32 == 0 ? 32 : 16;
  using SmemAtomPdS = decltype(composition(Swizzle<kPdSCols == 64 ? 3 : kPdSCols == 32 ? 2 : 1, 3, 3>{},
                                           Layout<Shape<_8, Int<kPdSCols>>, Stride<Int<kPdSCols>, _1>>{}));
  using SmemLayoutPdS = decltype(tile_to_shape(SmemAtomPdS{}, Shape<Int<kBlockM>, Int<kBlockN>>{}));
  // P^T and dS^T as the (kBlockN, kBlockM) A operand of dV / dK.
  using SmemLayoutPdSt =
      decltype(composition(SmemLayoutPdS{}, make_layout(Shape<Int<kBlockN>, Int<kBlockM>>{}, GenRowMajor{})));

  static constexpr int kQElems = cosize_v<SmemLayoutQ>;
  static constexpr int kKVElems = cosize_v<SmemLayoutKV>;
  static constexpr int kPdSElems = cosize_v<SmemLayoutPdS>;
  static_assert(kKVElems % 64 == 0 && kPdSElems % 64 == 0, "every tile starts on a 128-byte boundary");
  // V's bytes, then P's and dS's; with kVInRegs P and dS start where V does, written only once V is in registers.
  static constexpr int kVPdSElems = kVInRegs ? (kKVElems > 2 * kPdSElems ? kKVElems : 2 * kPdSElems)
                                             : kKVElems + 2 * kPdSElems;
  struct SharedStorage {
    alignas(128) Element q[kQStages * kQElems];
    alignas(128) Element dout[kDoStages * kQElems];
    alignas(128) Element k[kKVElems];  // reused for dK in the epilogue
    alignas(128) Element v_p_ds[kVPdSElems];  // V's part reused for dV in the epilogue
    // Per Q stage: lse_log2 then D of its kBlockM rows, fetched by cp.async with Q and read in the elementwise
    // step, so neither a global load latency nor registers held across the S/dP products are paid for them.
    alignas(128) float rows[kQStages * 2 * kBlockM];
    CUTE_DEVICE Element* v() { return v_p_ds; }
    CUTE_DEVICE Element* p() { return v_p_ds + (kVInRegs ? 0 : kKVElems); }
    CUTE_DEVICE Element* ds() { return p() + kPdSElems; }
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes == bwd_smem_single(kHeadDim, kBlockM, kBlockN, kVInRegs) +
                                  (kQStages - 1) * bwd_smem_q_stage(kHeadDim, kBlockM) +
                                  (kDoStages - 1) * kQElems * int(sizeof(Element)),
                "must match bwd_smem_bytes() in src/instantiations/kernels.py, which dispatch reads");
};

}  // namespace flashcute::sm80
