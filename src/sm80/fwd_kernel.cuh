// Portable forward mainloop (mma.sync + cp.async + ldmatrix): one CTA owns a kBlockM tile of queries of one
// head and walks its visible K/V tiles from the last to the first, so the tiles that need masking come first.
#pragma once

#include <cute/tensor.hpp>

#include "common/cute_utils.cuh"
#include "common/fwd_block.cuh"
#include "common/fwd_epilogue.cuh"
#include "common/kernel_params.h"
#include "common/mask_apply.cuh"
#include "common/softmax.cuh"
#include "sm80/fwd_traits.cuh"

namespace flashcute::sm80 {

// kDecode: the decode instantiation, for paged K/V (p.page_table: K and V gathered row by row) and split-KV
// (p.num_splits: a chunk of the keys, its float32 partials left for fwd_combine_kernel). Its own instantiation, so
// that the other mainloop's registers stay as they were (a runtime branch raised its spills: hd128 128x64 212 ->
// 260 B).
template <class T, bool kDecode>
__global__ void __launch_bounds__(T::kThreads, 1) fwd_kernel(__grid_constant__ FwdKernelParams const p) {
  using Element = typename T::Element;
  constexpr int kBlockM = T::kBlockM;
  constexpr int kBlockN = T::kBlockN;
  constexpr int kHeadDim = T::kHeadDim;

  extern __shared__ __align__(128) char smem_raw[];
  auto& smem = *reinterpret_cast<typename T::SharedStorage*>(smem_raw);
  int const tid = threadIdx.x;

  FwdBlock<kBlockM, kBlockN> blk;
  if (!blk.template init<kDecode>(p)) return;
  SeqInfo const& seq = blk.seq;
  Mask const& mask = blk.mask;
  int const m_block = blk.m_block, b = blk.b, h = blk.h, m0 = blk.m0;

  auto tile_q = Shape<Int<kBlockM>, Int<kHeadDim>>{};
  auto tile_kv = Shape<Int<kBlockN>, Int<kHeadDim>>{};
  Element const* q_ptr = blk.template q<Element>(p);
  Element const* k_ptr = blk.template k<Element>(p);
  Element const* v_ptr = blk.template v<Element>(p);
  Element* o_ptr = blk.template out<Element>(p);
  Tensor mQ = make_tensor(make_gmem_ptr(q_ptr), make_shape(seq.seqlen_q, Int<kHeadDim>{}),
                          make_stride(p.q_row_stride, _1{}));  // (Sq, D)
  Tensor mK = make_tensor(make_gmem_ptr(k_ptr), make_shape(seq.seqlen_k, Int<kHeadDim>{}),
                          make_stride(p.k_row_stride, _1{}));  // (Sk, D)
  Tensor mV = make_tensor(make_gmem_ptr(v_ptr), make_shape(seq.seqlen_k, Int<kHeadDim>{}),
                          make_stride(p.v_row_stride, _1{}));  // (Sk, Dv)
  Tensor mO = make_tensor(make_gmem_ptr(o_ptr), make_shape(seq.seqlen_q, Int<kHeadDim>{}),
                          make_stride(p.out_row_stride, _1{}));  // (Sq, Dv)
  Tensor gQ = local_tile(mQ, tile_q, make_coord(m_block, 0));  // (kBlockM, D)
  Tensor gK = local_tile(mK, tile_kv, make_coord(_, 0));       // (kBlockN, D, n)
  Tensor gV = local_tile(mV, tile_kv, make_coord(_, 0));       // (kBlockN, D, n)
  Tensor gO = local_tile(mO, tile_q, make_coord(m_block, 0));  // (kBlockM, D)

  Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename T::SmemLayoutQ{});    // (kBlockM, D)
  Tensor sK = make_tensor(make_smem_ptr(smem.k), typename T::SmemLayoutKV{});   // (kBlockN, D)
  Tensor sV = make_tensor(make_smem_ptr(smem.v), typename T::SmemLayoutKV{});   // (kBlockN, D)
  Tensor sVt = make_tensor(make_smem_ptr(smem.v), typename T::SmemLayoutVt{});  // (D, kBlockN)

  typename T::GmemLoad gmem_load;
  auto load_thr = gmem_load.get_thread_slice(tid);
  Tensor tQgQ = load_thr.partition_S(gQ);  // (CPY, CPY_M, CPY_D)
  Tensor tQsQ = load_thr.partition_D(sQ);
  Tensor tKgK = load_thr.partition_S(gK);  // (CPY, CPY_N, CPY_D, n)
  Tensor tKsK = load_thr.partition_D(sK);
  Tensor tVgV = load_thr.partition_S(gV);
  Tensor tVsV = load_thr.partition_D(sV);
  // Copy predicates: thread 0's coordinates against bounds shifted by this thread's base (copy_base).
  Tensor tQcQ = copy_offsets(gmem_load, tile_q);     // (CPY, CPY_M, CPY_D)
  Tensor tKVcKV = copy_offsets(gmem_load, tile_kv);  // (CPY, CPY_N, CPY_D)
  int load_row, load_col;
  copy_base(load_thr, tile_q, load_row, load_col);
  int const k_cols = p.head_dim - load_col;
  int const v_cols = p.head_dim_v - load_col;
  // K or V tile n, rows bounded as copy_tile_zfill bounds them (paged K/V through the page table). Pages smaller
  // than a tile are gathered row by row; the 64-row (decode) tiles have the registers to put every row's page-table
  // read in flight before its copies.
  constexpr int kGatherGroup = kBlockM == 64 ? 0 : 1;
  auto load_k = [&](int n, int rows) __attribute__((always_inline)) {
    blk.template load_kv<kDecode, Element, kGatherGroup>(p, false, gmem_load, tKgK, tKsK, tKVcKV, n, rows, k_cols,
                                                         load_row, load_col);
  };
  auto load_v = [&](int n, int rows) __attribute__((always_inline)) {
    blk.template load_kv<kDecode, Element, kGatherGroup>(p, true, gmem_load, tVgV, tVsV, tKVcKV, n, rows, v_cols,
                                                         load_row, load_col);
  };

  typename T::TiledMma mma;
  auto mma_thr = mma.get_thread_slice(tid);
  Tensor tSrQ = mma_thr.partition_fragment_A(sQ);  // (MMA, MMA_M, MMA_D)
  Tensor tSrK = mma_thr.partition_fragment_B(sK);  // (MMA, MMA_N, MMA_D)
  Tensor tOrVt = mma_thr.partition_fragment_B(
      make_tensor(make_smem_ptr(smem.v), make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{})));  // (MMA, MMA_D, MMA_N)
  Tensor acc_o = partition_fragment_C(mma, tile_q);  // (MMA, MMA_M, MMA_D)
  clear(acc_o);

  auto smem_load_q = make_tiled_copy_A(typename T::SmemLoadN{}, mma);
  auto smem_load_k = make_tiled_copy_B(typename T::SmemLoadN{}, mma);
  auto smem_load_v = make_tiled_copy_B(typename T::SmemLoadT{}, mma);
  Tensor tSsQ = smem_load_q.get_thread_slice(tid).partition_S(sQ);
  Tensor tSsK = smem_load_k.get_thread_slice(tid).partition_S(sK);
  Tensor tOsVt = smem_load_v.get_thread_slice(tid).partition_S(sVt);

  constexpr int kRows = 2 * decltype(size<1>(acc_o))::value;
  OnlineSoftmax<kRows, T::kSoftmaxChains> softmax;

  // General tiles (masked or softcapped) first, then the plain ones: common/fwd_block.cuh.
  blk.plan_tiles(p);
  int const num_general = blk.num_general, num_tiles = blk.num_tiles;
  auto tile_of = [&](int i) { return blk.tile_of(i); };

  // Prologue: Q and the first tile's K.
  if (num_tiles > 0) {
    copy_tile_zfill(gmem_load, tQgQ, tQsQ, tQcQ, seq.seqlen_q - m0 - load_row, k_cols);
    int const n = tile_of(0);
    load_k(n, seq.seqlen_k - n * kBlockN - load_row);
    cp_async_fence();
  }

  // Three bodies of one step: plain, masked, and softcapped (softcap then mask). ptxas predicated an optional
  // softcap inside the masked body rather than branching around it: with its own body the masked loop went from
  // ~1330 to ~1040 SASS instructions per tile (hd96), for the causal band and window edges.
  constexpr int kPlain = 0, kMasked = 1, kSoftcapped = 2;
  auto step = [&](int i, auto kind) __attribute__((always_inline)) {
    constexpr int kKind = decltype(kind)::value;
    constexpr bool kGeneral = kKind != kPlain;
    int const n = tile_of(i);
    int const n0 = n * kBlockN;
    Tensor acc_s = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kBlockN>>{});  // (MMA, MMA_M, MMA_N)
    clear(acc_s);
    // K (and Q) have landed, and every warp is done with the previous P.V, so V's buffer may be refilled.
    // Only the last tile can be partial, and it is never a plain one.
    cp_async_wait<0>();
    __syncthreads();
    int const v_rows = kGeneral ? seq.seqlen_k - n0 - load_row : kBlockN;
    load_v(n, v_rows);
    cp_async_fence();

    gemm_ss<T::kStreamB>(acc_s, tSrQ, tSrK, tSsQ, tSsK, mma, smem_load_q, smem_load_k);
    if constexpr (kKind == kSoftcapped) apply_softcap(acc_s, p.softcap_prescale);
    if constexpr (kGeneral) apply_mask<false, kDecode>(acc_s, mma, Shape<Int<kBlockM>, Int<kBlockN>>{}, mask, m0, n0,
                                                     blk.group);

    // V has landed, and every warp is done reading K: prefetch the next K (under the softmax and P.V, or under
    // P.V only, see FwdTraits::kLateKPrefetch). A partial last tile is never plain, so it is the first general
    // tile, loaded by the prologue: prefetched tiles are whole and need no row bound.
    auto prefetch_k = [&]() __attribute__((always_inline)) {
      cp_async_wait<0>();
      __syncthreads();
      if (i + 1 < num_tiles) {
        load_k(tile_of(i + 1), kBlockN);
        cp_async_fence();
      }
    };
    if constexpr (!T::kLateKPrefetch) prefetch_k();
    softmax.update(acc_s, acc_o, p.scale_log2);
    Tensor rP = convert_to<Element>(acc_s);
    Tensor tOrP = make_tensor(rP.data(), acc_as_a_operand(rP.layout()));  // (MMA, MMA_M, MMA_N / 2)
    if constexpr (T::kLateKPrefetch) prefetch_k();
    gemm_rs<T::kStreamB>(acc_o, tOrP, tOrVt, tOsVt, mma, smem_load_v);
  };

  if (p.softcap_prescale != 0.f) {
    for (int i = 0; i < num_tiles; ++i) step(i, Int<kSoftcapped>{});  // no plain tiles with softcap
  } else {
    for (int i = 0; i < num_general; ++i) step(i, Int<kMasked>{});
    for (int i = num_general; i < num_tiles; ++i) step(i, Int<kPlain>{});
  }

  float lse[kRows];
  bool const split = kDecode && p.num_splits > 1;
  softmax.finalize(acc_o, p.scale_log2, lse, split ? -INFINITY : sink_log2(p, h));  // split: the sink joins later
  if (kDecode && split) {
    int64_t const row0 = partial_row0(p, seq, b, h, blk.split);
    store_o_partial(p, mma, tile_q, acc_o, p.o_partial + row0 * p.head_dim_v, m0, seq.seqlen_q);
    store_lse_rows(p.lse_partial + row0, mma_thr, tile_q, m0, seq.seqlen_q, lse);
    return;
  }

  // Epilogue: O goes through shared memory (Q's buffer, which no warp reads any more: the last barrier above
  // followed the last Q.K) so global stores are 16-byte vectors along rows.
  Tensor rO = convert_to<Element>(acc_o);
  Tensor sO = make_tensor(make_smem_ptr(smem.q), typename T::SmemLayoutQ{});  // (kBlockM, D)
  auto smem_store_o = make_tiled_copy_C(typename T::SmemStoreC{}, mma);
  auto store_thr = smem_store_o.get_thread_slice(tid);
  cute::copy(smem_store_o, store_thr.retile_S(rO), store_thr.partition_D(sO));
  __syncthreads();

  store_tile(typename T::GmemStore{}, sO, gO, tile_q, seq.seqlen_q - m0, p.head_dim_v);

  store_lse(p, mma_thr, tile_q, seq, b, h, m0, lse);
}

}  // namespace flashcute::sm80
