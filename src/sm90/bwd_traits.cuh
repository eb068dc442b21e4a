// Compile-time description of one Hopper backward kernel: one warpgroup per 64 keys of the CTA's key tile, the
// five wgmma products with their operand majors, GMMA shared-memory layouts (two Q/dO stages) and the copies.
// Tiles are chosen in src/instantiations/kernels.py, whose generate.py smem_bytes() mirrors kSmemBytes.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>

#include "common/cute_utils.cuh"
#include "sm90/bwd_launch.h"

namespace flashcute::sm90 {

using namespace cute;

// The K-major GMMA atom whose swizzle width (64, 32 or 16 elements of 16 bits) divides `cols`.
template <class Element, int kCols>
using GmmaAtomK = std::conditional_t<
    kCols % 64 == 0, decltype(GMMA::Layout_K_SW128_Atom<Element>{}),
    std::conditional_t<kCols % 32 == 0, decltype(GMMA::Layout_K_SW64_Atom<Element>{}),
                       decltype(GMMA::Layout_K_SW32_Atom<Element>{})>>;

template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_>
struct BwdTraits : GmemCopies<Element_, kHeadDim_, kWarps_ * 32> {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // query rows per step
  static constexpr int kBlockN = kBlockN_;  // keys owned by one CTA
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kWarpgroups = kThreads / 128;
  static constexpr int kStages = 2;  // Q/dO of step i + 1 load while step i is computed
  static_assert(kBlockN == 64 * kWarpgroups, "one warpgroup per 64 keys");
    static_assert(kHeadDim % (16 * kWarpgroups) == 0 && kHeadDim <= 256);

  // Products, every one with 64 rows per warpgroup:
  //   S^T = K Q^T, dP^T = V dO^T   (keys x queries; A and B K-major in shared memory)
  //   dV += P^T dO, dK += dS^T Q   (keys x head dim; P^T, dS^T from registers, dO and Q read MN-major)
  //   dQ = dS K                    (queries x head dim, split by columns over the warpgroups; dS and K read MN-major)
  // Computing S^T rather than S leaves P^T and dS^T in the registers that dV and dK take as their A operand, so only
  // dS goes through shared memory.
  using AtomLayoutKeys = Layout<Shape<Int<kWarpgroups>, _1, _1>>;
  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockM>, Int<kHeadDim>>>(), AtomLayoutKeys{}));
  using TiledMmaKV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kBlockM>>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      AtomLayoutKeys{}));
  static constexpr int kDqColsPerWarpgroup = kHeadDim / kWarpgroups;
  using TiledMmaQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kDqColsPerWarpgroup>, Int<kBlockN>>,
                           GMMA::Major::MN, GMMA::Major::MN>(),
      Layout<Shape<_1, Int<kWarpgroups>, _1>>{}));
  static_assert(kBlockM == 64, "dQ = dS K: one wgmma row block, its columns split over the warpgroups");
  // What the dQ conversion kernel (src/sm80/bwd_postprocess.cuh) reads: dQ comes in one chunk of all columns.
  static constexpr int kDqChunks = 1;
  static constexpr int kDqCols = kHeadDim;

  // The float32 dQ accumulator holds each (kBlockM, D) tile in the dQ product's fragment order, as the portable
  // family does (src/sm80/bwd_traits.cuh): pair j of thread t at 2 * (j * kThreads + t) + {0, 1}, so one warp's
  // atomic covers 256 contiguous bytes.
  CUTE_HOST_DEVICE static constexpr int dq_frag_offset(int i, int thread) {
    return 2 * ((i / 2) * kThreads + thread) + i % 2;
  }

  // Q and dO rows are read K-major by S^T / dP^T and, transposed, MN-major by dK / dV. K is read K-major by S^T
  // and, transposed, MN-major by dQ in column slices of kDqColsPerWarpgroup, so its swizzle width must divide those.
  using SmemLayoutQ = decltype(tile_to_shape(GmmaAtomK<Element, kHeadDim>{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutQs = decltype(tile_to_shape(GmmaAtomK<Element, kHeadDim>{},
                                              Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutQst = decltype(composition(
      SmemLayoutQs{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockM>, Int<kStages>>{}, Step<_2, _1, _3>{})));
  using SmemLayoutKV = decltype(tile_to_shape(GmmaAtomK<Element, kDqColsPerWarpgroup>{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutKt = decltype(composition(
      SmemLayoutKV{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, Step<_2, _1>{})));
  // dS^T is stored as the registers hold it (keys x queries, queries contiguous) and read as dS, MN-major.
  using SmemLayoutdSt = decltype(tile_to_shape(GmmaAtomK<Element, kBlockM>{}, Shape<Int<kBlockN>, Int<kBlockM>>{}));
  using SmemLayoutdS = decltype(composition(
      SmemLayoutdSt{}, make_ordered_layout(Shape<Int<kBlockM>, Int<kBlockN>>{}, Step<_2, _1>{})));
  // Register -> shared stores of accumulator pairs (dS^T, dK, dV, dQ in its conversion).
  using SmemStoreC = Copy_Atom<UniversalCopy<uint32_t>, Element>;

  static constexpr int kQElems = kBlockM * kHeadDim;
  struct SharedStorage {
    // GMMA descriptors assume each operand starts on a swizzle-pattern boundary (1024 B covers every swizzle).
    alignas(1024) Element q[cosize_v<SmemLayoutQs>];
    alignas(1024) Element dout[cosize_v<SmemLayoutQs>];
    alignas(1024) Element k[cosize_v<SmemLayoutKV>];  // reused for dK in the epilogue
    alignas(1024) Element v[cosize_v<SmemLayoutKV>];  // reused for dV in the epilogue
    alignas(1024) Element ds[cosize_v<SmemLayoutdSt>];
    // Per Q stage: lse_log2 then D of its kBlockM rows (as in the portable family).
    alignas(1024) float rows[kStages * 2 * kBlockM];
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes == (2 * kStages * kBlockM * kHeadDim + 2 * kBlockN * kHeadDim + kBlockN * kBlockM) * 2 +
                                  ((kStages * 2 * kBlockM * 4 + 1023) / 1024) * 1024,
                "must match smem_bytes() in src/instantiations/generate.py, which dispatch reads");
};

}  // namespace flashcute::sm90
