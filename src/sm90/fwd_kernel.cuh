// Hopper forward, warp-specialised: one CTA owns a kBlockM tile of queries of one head. A producer warpgroup copies the
// visible K/V tiles into a ring of shared-memory stages (TMA for fixed-length batches and most paged caches, cp.async
// for varlen, expanded views and other pages; zeros past the sequence and the head dim either way) and signals each
// stage through an mbarrier; one consumer warpgroup per 64 query rows computes. The consumers overlap their own softmax
// with their P.V MMA (S_{i} = Q K_i^T and O += P_{i-1} V_{i-1} are issued back to back, the softmax of S_i runs while
// P_{i-1} V_{i-1} is in flight) and, at head dims up to 128, take turns issuing MMAs (named barriers), so one
// warpgroup's softmax runs under the other's MMAs. Masking, softmax, tile order, the scheduler and the lse store are
// shared with the portable family (src/common/).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>

#include "common/cute_utils.cuh"
#include "common/fwd_block.cuh"
#include "common/fwd_epilogue.cuh"
#include "common/kernel_params.h"
#include "common/mask_apply.cuh"
#include "common/softmax.cuh"
#include "sm90/fwd_traits.cuh"
#include "sm90/pipeline.cuh"
#include "sm90/wgmma.cuh"

namespace flashcute::sm90 {

// Named barriers of the forward kernel (0 is __syncthreads).
enum FwdBarrier : int {
  kConsumersBarrier = 1,  // every consumer thread
  kTurnBarrier0 = 2,      // kTurnBarrier0 + w: consumer warpgroup w may issue its MMAs (2-4)
  kProducersBarrier = 5,  // every producer thread (paged K/V by TMA: a partial tile's cp.asyncs have landed)
};

// What the kernel takes: the family-neutral params and the TMA copies of K and V, which run_fwd builds on the host
// (src/sm90/fwd_launch.cuh) where use_tma says they serve: fixed-length batches, and paged K/V whose pages hold
// whole key tiles (tma_k, tma_v) or tile them in copies of kPageRows rows (tma_k_rows, tma_v_rows). Varlen batches
// and other pages load with cp.async.
template <class T>
struct FwdParams {
  FwdKernelParams p;
  typename T::TmaKV tma_k, tma_v;
  bool use_tma;
  typename T::TmaKVRows tma_k_rows, tma_v_rows;
};

// Paged K/V by TMA (the decode instantiation), from the (page_size, D, heads, pages) view, so that rows past a page
// arrive as zeros. Pages of at least a key tile (run_fwd makes sure none straddles two): key tile n of sequence b
// is the rows [n * kBlockN - slot * page_size, + kBlockN) of page page_table[b][slot], slot = n * kBlockN /
// page_size, one copy each for K and V from producer thread 0. Shorter pages: lane c of the producer's first warp
// copies the tile's rows [c * kPageRows, + kPageRows), which lie in one page, and thread 0 expects the whole tile's
// bytes. Each issuing lane reads its next page entry before waiting for this tile's stage. Rows past seqlen_k inside
// a page would arrive as whatever the cache holds there: the tile holding the last key, when partial (at most one,
// and general, so the first visited), is gathered with cp.async by every producer thread instead, zeros past the
// sequence, and signalled by one arrival once every copy has landed.
template <class T>
CUTE_DEVICE void fwd_load_pages(FwdParams<T> const& params, FwdBlock<T::kBlockM, T::kBlockN> const& blk,
                                typename T::SharedStorage& smem, int ptid) {
  using Element = typename T::Element;
  constexpr int kBlockN = T::kBlockN;
  constexpr int kHeadDim = T::kHeadDim;
  constexpr int kPageRows = T::kPageRows;
  FwdKernelParams const& p = params.p;
  auto tile_kv = Shape<Int<kBlockN>, Int<kHeadDim>>{};
  auto tile_rows = Shape<Int<kPageRows>, Int<kHeadDim>>{};
  auto view = [&](int d) { return make_shape(p.page_size, d, p.nheads_kv, p.num_pages); };
  Tensor sK = make_tensor(make_smem_ptr(smem.k), typename T::SmemLayoutKV{});  // (kBlockN, D, stage)
  Tensor sV = make_tensor(make_smem_ptr(smem.v), typename T::SmemLayoutKV{});
  bool const rows_mode = p.page_size < kBlockN;
  int const* const table = p.page_table + blk.b * p.page_table_batch_stride;
  int const row_off = rows_mode ? ptid * kPageRows : 0;  // this lane's first row in a tile
  bool const issuer = ptid < (rows_mode ? kBlockN / kPageRows : 1);
  auto slot_of = [&](int n) {
    unsigned const j = unsigned(n * kBlockN + row_off);
    return int((__umulhi(j, p.page_magic) + j) >> p.page_shift);
  };
  auto page_of = [&](int slot) { return min(max(table[slot], 0), p.num_pages - 1); };
  int const full_tiles = blk.seq.seqlen_k / kBlockN;  // tiles n < full_tiles hold kBlockN keys

  typename T::GmemLoad gmem_load;  // the partial tile's cp.asyncs
  auto load_thr = gmem_load.get_thread_slice(ptid);
  Tensor tKgK = load_thr.partition_S(local_tile(make_tensor(make_gmem_ptr(static_cast<Element const*>(p.k)),
                                                            tile_kv, make_stride(p.k_row_stride, _1{})),
                                                tile_kv, make_coord(_, 0)));  // rows' layout only (copy_rows_zfill)
  Tensor tKsK_cp = load_thr.partition_D(sK);                                     // (CPY, CPY_N, CPY_D, stage)
  Tensor tVsV_cp = load_thr.partition_D(sV);
  Tensor tKVcKV = copy_offsets(gmem_load, tile_kv);
  int load_row, load_col;
  copy_base(load_thr, tile_kv, load_row, load_col);

  // Tile i (stage, its first row in the page) of K or V from page `page`: one copy of the tile, or of this lane's
  // kPageRows rows (rows_mode); thread 0 expects the tile's bytes.
  int page;
  auto load_tile = [&](auto& ring, auto const& tma, auto const& tma_rows, auto& sX, int d, int i, int stage, int row) {
    auto copy_rows = [&](auto const& copy_op, auto tile, int t, auto&& dst) {
      Tensor g = local_tile(copy_op.get_tma_tensor(view(d))(_, _, blk.h_kv, page), tile, make_coord(t, 0));
      auto thr = copy_op.get_slice(_0{});
      copy(copy_op.with(ring.producer_barrier(i)), group_modes<0, 3>(thr.partition_S(g)),
           group_modes<0, 3>(thr.partition_D(dst)));
    };
    ring.producer_acquire(i);
    if (ptid == 0) ring.producer_expect(i, T::kTmaBytes);
    if (rows_mode) {
      copy_rows(tma_rows, tile_rows, row / kPageRows, local_tile(sX(_, _, stage), tile_rows, make_coord(ptid, 0)));
    } else {
      copy_rows(tma, tile_kv, row / kBlockN, sX(_, _, stage));
    }
  };
  // Entries of full tiles only: a lane's rows of the partial tile may lie past the sequence's last page entry.
  auto next_page = [&](int i) {
    return issuer && i < blk.num_tiles && blk.tile_of(i) < full_tiles ? page_of(slot_of(blk.tile_of(i))) : 0;
  };
  page = next_page(0);
#pragma unroll 1
  for (int i = 0; i < blk.num_tiles; ++i) {
    int const n = blk.tile_of(i);
    int const stage = i % T::kStages;
    if (n < full_tiles) {
      if (!issuer) continue;
      int const row = n * kBlockN + row_off - slot_of(n) * p.page_size;  // in the page
      int const next = next_page(i + 1);
      load_tile(smem.k_ring, params.tma_k, params.tma_k_rows, sK, p.head_dim, i, stage, row);
      load_tile(smem.v_ring, params.tma_v, params.tma_v_rows, sV, p.head_dim_v, i, stage, row);
      page = next;
    } else {
      int const rows = blk.seq.seqlen_k - n * kBlockN - load_row;
      smem.k_ring.producer_acquire(i);
      blk.template load_kv<true, Element, 1>(p, false, gmem_load, tKgK, tKsK_cp(_, _, _, stage), tKVcKV, n, rows,
                                             p.head_dim - load_col, load_row, load_col);
      smem.v_ring.producer_acquire(i);
      blk.template load_kv<true, Element, 1>(p, true, gmem_load, tKgK, tVsV_cp(_, _, _, stage), tKVcKV, n, rows,
                                             p.head_dim_v - load_col, load_row, load_col);
      cp_async_wait<0>();
      cutlass::arch::fence_view_async_shared();
      named_sync(kProducersBarrier, T::kProducerThreads);
      if (ptid == 0) {
        smem.k_ring.producer_arrive(i);
        smem.v_ring.producer_arrive(i);
      }
      page = next_page(i + 1);
    }
  }
}

// Producer warpgroup: K_i and V_i for every visible tile i, in the consumers' order, each into its ring's stage:
// one thread issuing TMA copies, or all of them issuing cp.async.
// kDecode (the decode instantiation): K and V may be in pages (p.page_table), then loaded by fwd_load_pages where
// TMA serves them, else with cp.async row by row.
template <class T, bool kDecode>
CUTE_DEVICE void fwd_load(FwdParams<T> const& params, FwdBlock<T::kBlockM, T::kBlockN> const& blk,
                          typename T::SharedStorage& smem, int ptid) {
  using Element = typename T::Element;
  constexpr int kBlockN = T::kBlockN;
  constexpr int kHeadDim = T::kHeadDim;
  FwdKernelParams const& p = params.p;
  auto tile_kv = Shape<Int<kBlockN>, Int<kHeadDim>>{};
  Tensor sK = make_tensor(make_smem_ptr(smem.k), typename T::SmemLayoutKV{});  // (kBlockN, D, stage)
  Tensor sV = make_tensor(make_smem_ptr(smem.v), typename T::SmemLayoutKV{});
  if constexpr (kDecode) {
    if (params.use_tma && p.page_table) return fwd_load_pages(params, blk, smem, ptid);
  }
  if (params.use_tma) {
    if (ptid != 0) return;
    Tensor mK = params.tma_k.get_tma_tensor(make_shape(p.seqlen_k, p.head_dim, p.nheads_kv, p.batch));
    Tensor mV = params.tma_v.get_tma_tensor(make_shape(p.seqlen_k, p.head_dim_v, p.nheads_kv, p.batch));
    Tensor gK = local_tile(mK(_, _, blk.h_kv, blk.b), tile_kv, make_coord(_, 0));  // (kBlockN, D, n)
    Tensor gV = local_tile(mV(_, _, blk.h_kv, blk.b), tile_kv, make_coord(_, 0));
    auto tma_k = params.tma_k.get_slice(_0{});
    auto tma_v = params.tma_v.get_slice(_0{});
    Tensor tKgK = group_modes<0, 3>(tma_k.partition_S(gK));  // (TMA, n)
    Tensor tKsK = group_modes<0, 3>(tma_k.partition_D(sK));  // (TMA, stage)
    Tensor tVgV = group_modes<0, 3>(tma_v.partition_S(gV));
    Tensor tVsV = group_modes<0, 3>(tma_v.partition_D(sV));
#pragma unroll 1
    for (int i = 0; i < blk.num_tiles; ++i) {
      int const n = blk.tile_of(i);
      int const stage = i % T::kStages;
      smem.k_ring.producer_acquire(i);
      copy(params.tma_k.with(smem.k_ring.producer_expect(i, T::kTmaBytes)), tKgK(_, n), tKsK(_, stage));
      smem.v_ring.producer_acquire(i);
      copy(params.tma_v.with(smem.v_ring.producer_expect(i, T::kTmaBytes)), tVgV(_, n), tVsV(_, stage));
    }
    return;
  }
  SeqInfo const& seq = blk.seq;
  Tensor mK = make_tensor(make_gmem_ptr(blk.template k<Element>(p)), make_shape(seq.seqlen_k, Int<kHeadDim>{}),
                          make_stride(p.k_row_stride, _1{}));  // (Sk, D)
  Tensor mV = make_tensor(make_gmem_ptr(blk.template v<Element>(p)), make_shape(seq.seqlen_k, Int<kHeadDim>{}),
                          make_stride(p.v_row_stride, _1{}));  // (Sk, Dv)
  Tensor gK = local_tile(mK, tile_kv, make_coord(_, 0));       // (kBlockN, D, n)
  Tensor gV = local_tile(mV, tile_kv, make_coord(_, 0));
  typename T::GmemLoad gmem_load;
  auto load_thr = gmem_load.get_thread_slice(ptid);
  Tensor tKgK = load_thr.partition_S(gK);  // (CPY, CPY_N, CPY_D, n)
  Tensor tKsK = load_thr.partition_D(sK);  // (CPY, CPY_N, CPY_D, stage)
  Tensor tVgV = load_thr.partition_S(gV);
  Tensor tVsV = load_thr.partition_D(sV);
  Tensor tKVcKV = copy_offsets(gmem_load, tile_kv);
  int load_row, load_col;
  copy_base(load_thr, tile_kv, load_row, load_col);
  int const k_cols = p.head_dim - load_col;
  int const v_cols = p.head_dim_v - load_col;
#pragma unroll 1
  for (int i = 0; i < blk.num_tiles; ++i) {
    int const n = blk.tile_of(i);
    int const stage = i % T::kStages;
    int const rows = seq.seqlen_k - n * kBlockN - load_row;
    smem.k_ring.producer_acquire(i);
    blk.template load_kv<kDecode, Element, T::kGatherGroup>(p, false, gmem_load, tKgK, tKsK(_, _, _, stage), tKVcKV,
                                                            n, rows, k_cols, load_row, load_col);
    smem.k_ring.producer_commit(i);
    smem.v_ring.producer_acquire(i);
    blk.template load_kv<kDecode, Element, T::kGatherGroup>(p, true, gmem_load, tVgV, tVsV(_, _, _, stage), tKVcKV,
                                                            n, rows, v_cols, load_row, load_col);
    smem.v_ring.producer_commit(i);
  }
  cp_async_wait<0>();
}

// Consumer warpgroups' mainloop: Q into shared memory, then S_i = Q K_i^T and O += P_i V_i over every visible tile
// with the online softmax. acc_o ends as the tile's unnormalised O, softmax with its rows' statistics.
template <class T, bool kDecode, class AccO, class Softmax>
CUTE_DEVICE void fwd_mma(FwdParams<T> const& params, FwdBlock<T::kBlockM, T::kBlockN> const& blk,
                         typename T::SharedStorage& smem, int tid, AccO& acc_o, Softmax& softmax) {
  using Element = typename T::Element;
  constexpr int kBlockM = T::kBlockM;
  constexpr int kBlockN = T::kBlockN;
  constexpr int kHeadDim = T::kHeadDim;
  constexpr int kConsumerThreads = T::kConsumerThreads;
  constexpr int kConsumerGroups = kConsumerThreads / 128;
  constexpr int kRows = decltype(size<0>(acc_as_rowcol(acc_o.layout())))::value;
  FwdKernelParams const& p = params.p;
  SeqInfo const& seq = blk.seq;
  Mask const& mask = blk.mask;
  int const m0 = blk.m0;
  int const group = tid / 128;
  int const num_general = blk.num_general, num_tiles = blk.num_tiles;
  auto tile_of = [&](int i) { return blk.tile_of(i); };

  auto tile_q = Shape<Int<kBlockM>, Int<kHeadDim>>{};
  auto tile_s = Shape<Int<kBlockM>, Int<kBlockN>>{};
  Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename T::SmemLayoutQ{});    // (kBlockM, D)
  Tensor sK = make_tensor(make_smem_ptr(smem.k), typename T::SmemLayoutKV{});   // (kBlockN, D, stage)
  Tensor sVt = make_tensor(make_smem_ptr(smem.v), typename T::SmemLayoutVt{});  // (D, kBlockN, stage)

  typename T::TiledMmaS mma_s;
  typename T::TiledMmaO mma_o;
  auto thr_s = mma_s.get_thread_slice(tid);
  auto thr_o = mma_o.get_thread_slice(tid);
  Tensor tSrQ = thr_s.make_fragment_A(thr_s.partition_A(sQ));    // GMMA descriptors (MMA, MMA_M, MMA_D)
  Tensor tSrK = thr_s.make_fragment_B(thr_s.partition_B(sK));    // (MMA, MMA_N, MMA_D, stage)
  Tensor tOrVt = thr_o.make_fragment_B(thr_o.partition_B(sVt));  // (MMA, MMA_D, MMA_N, stage)
  clear(acc_o);

  if (num_tiles > 0) {  // Q, by the consumers, while the producer starts on K and V
    Tensor mQ = make_tensor(make_gmem_ptr(blk.template q<Element>(p)), make_shape(seq.seqlen_q, Int<kHeadDim>{}),
                            make_stride(p.q_row_stride, _1{}));  // (Sq, D)
    Tensor gQ = local_tile(mQ, tile_q, make_coord(blk.m_block, 0));
    typename T::GmemLoadQ load_q;
    auto q_thr = load_q.get_thread_slice(tid);
    int q_row, q_col;
    copy_base(q_thr, tile_q, q_row, q_col);
    copy_tile_zfill(load_q, q_thr.partition_S(gQ), q_thr.partition_D(sQ), copy_offsets(load_q, tile_q),
                    seq.seqlen_q - m0 - q_row, p.head_dim - q_col);
    cp_async_wait<0>();
    cutlass::arch::fence_view_async_shared();
    named_sync(kConsumersBarrier, kConsumerThreads);
  }

  // The warpgroups take turns issuing their MMAs: w waits for its turn, issues, then hands the turn to the next.
  // Warpgroup 0 goes first.
  constexpr bool kTurns = kConsumerGroups > 1 && T::kTakeTurns;
  auto wait_turn = [&]() {
    if constexpr (kTurns) named_sync(kTurnBarrier0 + group, 256);
  };
  auto pass_turn = [&]() {
    if constexpr (kTurns) named_arrive(kTurnBarrier0 + (group + 1) % kConsumerGroups, 256);
  };
  static_assert(kConsumerGroups <= 3, "turns go round at most three warpgroups (named barriers 2-4)");
  if (kTurns && group == 0) named_arrive(kTurnBarrier0, 256);

  constexpr int kPlain = 0, kMasked = 1, kSoftcapped = 2;
  // Scores of tile i (landed in acc_s) become probabilities; correction[] says how to rescale O afterwards.
  auto softmax_of = [&](int i, auto& acc_s, auto kind, auto& correction) __attribute__((always_inline)) {
    constexpr int kKind = decltype(kind)::value;
    if constexpr (kKind == kSoftcapped) apply_softcap(acc_s, p.softcap_prescale);
    if constexpr (kKind != kPlain)
      apply_mask<false, kDecode>(acc_s, mma_s, tile_s, mask, m0, tile_of(i) * kBlockN, blk.group);
    softmax.scores(acc_s, p.scale_log2, correction);
  };
  Tensor rP = make_tensor<Element>(partition_fragment_C(mma_s, tile_s).layout());  // P_{i-1}, converted
  Tensor tOrP = make_tensor(rP.data(), acc_as_a_operand(rP.layout()));           // (MMA, MMA_M, MMA_N / 16)

  // Step i: S_i = Q K_i^T and O += P_{i-1} V_{i-1} in flight together; the softmax of S_i under the second. O is
  // rescaled for P_{i-1}'s max (correction, from step i - 1) while S_i is in flight, before P_{i-1} V_{i-1} is
  // issued (FA3's order), so that only P's conversion waits for the P.V MMA.
  float correction[kRows];
  auto step = [&](int i, auto kind) __attribute__((always_inline)) {
    int const stage = i % T::kStages, prev = (i - 1) % T::kStages;
    Tensor acc_s = partition_fragment_C(mma_s, tile_s);  // (MMA, MMA_M, MMA_N)
    smem.k_ring.consumer_wait(i);
    wait_turn();
    warpgroup_issue<true, false>(mma_s, tSrQ, tSrK(_, _, _, stage), acc_s);
    OnlineSoftmax<kRows>::rescale(acc_o, correction);
    smem.v_ring.consumer_wait(i - 1);
    warpgroup_issue<false, true>(mma_o, tOrP, tOrVt(_, _, _, prev), acc_o);
    pass_turn();
    warpgroup_wait_for<1>(acc_s);
    smem.k_ring.consumer_release(i);
    softmax_of(i, acc_s, kind, correction);
    warpgroup_wait_for<0>(acc_o, rP);
    smem.v_ring.consumer_release(i - 1);
    convert_into(acc_s, rP);
  };

  // The first tile takes the masked (or softcapped) body even where it needs no mask: one tile, at a small cost.
  if (num_tiles > 0) {
    {
      Tensor acc_s = partition_fragment_C(mma_s, tile_s);
      smem.k_ring.consumer_wait(0);
      warpgroup_issue<true, false>(mma_s, tSrQ, tSrK(_, _, _, 0), acc_s);
      warpgroup_wait_for<0>(acc_s);
      smem.k_ring.consumer_release(0);
      if (p.softcap_prescale != 0.f) {
        softmax_of(0, acc_s, Int<kSoftcapped>{}, correction);
      } else {
        softmax_of(0, acc_s, Int<kMasked>{}, correction);
      }
      convert_into(acc_s, rP);
    }
    if (p.softcap_prescale != 0.f) {
      for (int i = 1; i < num_tiles; ++i) step(i, Int<kSoftcapped>{});  // no plain tiles
    } else {
      for (int i = 1; i < num_general; ++i) step(i, Int<kMasked>{});
      for (int i = max(num_general, 1); i < num_tiles; ++i) step(i, Int<kPlain>{});
    }
    int const last = num_tiles - 1;
    OnlineSoftmax<kRows>::rescale(acc_o, correction);
    smem.v_ring.consumer_wait(last);
    warpgroup_issue<false, true>(mma_o, tOrP, tOrVt(_, _, _, last % T::kStages), acc_o);
    warpgroup_wait_for<0>(acc_o, rP);
    smem.v_ring.consumer_release(last);
  }
}

// Consumer warpgroups' epilogue: O normalised (through shared memory, all of it free by now) into out, or as
// float32 partials for the combine kernel (split-KV); the rows' lse.
template <class T, bool kDecode, class AccO, class Softmax>
CUTE_DEVICE void fwd_epilogue(FwdParams<T> const& params, FwdBlock<T::kBlockM, T::kBlockN> const& blk,
                              char* smem_raw, int tid, typename T::Element* o_ptr, AccO& acc_o, Softmax& softmax) {
  using Element = typename T::Element;
  constexpr int kBlockM = T::kBlockM;
  constexpr int kHeadDim = T::kHeadDim;
  constexpr int kConsumerThreads = T::kConsumerThreads;
  constexpr int kRows = decltype(size<0>(acc_as_rowcol(acc_o.layout())))::value;
  FwdKernelParams const& p = params.p;
  SeqInfo const& seq = blk.seq;
  int const b = blk.b, h = blk.h, m0 = blk.m0;
  auto tile_q = Shape<Int<kBlockM>, Int<kHeadDim>>{};
  typename T::TiledMmaO mma_o;
  auto thr_o = mma_o.get_thread_slice(tid);

  float inv[kRows], lse[kRows];
  bool const split = kDecode && p.num_splits > 1;  // split-KV: float32 partials, the sink joining in the combine
  softmax.finish(p.scale_log2, inv, lse, split ? -INFINITY : sink_log2(p, h));

  // Epilogue: O goes through shared memory as float32, unnormalised, each accumulator pair stored straight from its
  // registers; then every thread normalises, converts and stores 16-byte vectors along rows. Normalising or
  // converting O in registers first spilled 100-148 B at head dim 256 (ptxas hoists the 128 multiplies ahead of
  // their stores). Rows are padded by 8 floats against bank conflicts; all of shared memory is free by now.
  constexpr int kStride = kHeadDim + 8;
  float* o_buf = reinterpret_cast<float*>(smem_raw);
  float* inv_buf = o_buf + kBlockM * kStride;
  static_assert((kBlockM * kStride + kBlockM) * int(sizeof(float)) <= T::kSmemBytes);
  TileCoords<typename T::TiledMmaO, decltype(tile_q)> const o_base(mma_o, tile_q);
  auto const o_off = TileCoords<typename T::TiledMmaO, decltype(tile_q)>::offsets(mma_o, tile_q);  // (rows, cols)
  Tensor o_rc = make_tensor(acc_o.data(), acc_as_rowcol(acc_o.layout()));                     // (rows, cols)
  static_assert(decltype(size<0, 0>(acc_o))::value == 2, "pairs of adjacent columns");
  float* o_mine = o_buf + o_base.row_base * kStride + o_base.col_base;
  named_sync(kConsumersBarrier, kConsumerThreads);  // every warpgroup is done reading Q, K and V
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    CUTE_UNROLL
    for (int c = 0; c < size<1>(o_rc); c += 2) {
      int const offset = get<0>(o_off(r, c)) * kStride + get<1>(o_off(r, c));
      *reinterpret_cast<float2*>(o_mine + offset) = make_float2(o_rc(r, c), o_rc(r, c + 1));
    }
    if (o_base.col_base == 0) inv_buf[o_base.row_base + get<0>(o_off(r, 0))] = inv[r];  // one thread per quad
  }
  named_sync(kConsumersBarrier, kConsumerThreads);
  constexpr int kVecsPerRow = kHeadDim / 8;
  int const rows = min(kBlockM, seq.seqlen_q - m0);
  if (kDecode && split) {  // normalised float32 partials, then the combine kernel
    int64_t const row0 = partial_row0(p, seq, b, h, blk.split);
    float* const o_part = p.o_partial + (row0 + m0) * p.head_dim_v;
#pragma unroll 1
    for (int v = tid; v < kBlockM * kHeadDim; v += kConsumerThreads) {
      int const row = v / kHeadDim, col = v % kHeadDim;
      if (row < rows && col < p.head_dim_v)
        o_part[(int64_t)row * p.head_dim_v + col] = o_buf[row * kStride + col] * inv_buf[row];
    }
    store_lse_rows(p.lse_partial + row0, thr_o, tile_q, m0, seq.seqlen_q, lse);
    return;
  }
#pragma unroll 1
  for (int v = tid; v < kBlockM * kVecsPerRow; v += kConsumerThreads) {
    int const row = v / kVecsPerRow;
    int const col = (v % kVecsPerRow) * 8;
    if (row < rows && col < p.head_dim_v) {
      float const* src = o_buf + row * kStride + col;
      float4 const lo = *reinterpret_cast<float4 const*>(src);
      float4 const hi = *reinterpret_cast<float4 const*>(src + 4);
      float const scale = inv_buf[row];
      cutlass::Array<float, 8> const vals = {lo.x * scale, lo.y * scale, lo.z * scale, lo.w * scale,
                                             hi.x * scale, hi.y * scale, hi.z * scale, hi.w * scale};
      cutlass::NumericArrayConverter<Element, float, 8> convert;
      *reinterpret_cast<cutlass::Array<Element, 8>*>(o_ptr + (m0 + row) * p.out_row_stride + col) = convert(vals);
    }
  }

  store_lse(p, thr_o, tile_q, seq, b, h, m0, lse);
}

// The kernel: the block and its tile plan, the rings, then the roles: the producer warpgroup runs fwd_load, the
// consumers fwd_mma and fwd_epilogue. kDecode: the decode instantiation (paged K/V, split-KV: see the portable
// kernel), so that the other keeps its registers.
template <class T, bool kDecode>
__global__ void __launch_bounds__(T::kThreads, 1) fwd_kernel(__grid_constant__ FwdParams<T> const params) {
#if defined(CUTE_ARCH_MMA_SM90A_ENABLED)
  extern __shared__ __align__(1024) char smem_raw[];
  auto& smem = *reinterpret_cast<typename T::SharedStorage*>(smem_raw);
  int const tid = threadIdx.x;
  FwdKernelParams const& p = params.p;

  FwdBlock<T::kBlockM, T::kBlockN> blk;
  if (!blk.template init<kDecode>(p)) return;
  blk.plan_tiles(p);
  if (tid == 0) {
    int const producers = params.use_tma ? 1 : T::kProducerThreads;
    smem.k_ring.init(producers, T::kConsumerThreads / 32);
    smem.v_ring.init(producers, T::kConsumerThreads / 32);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();  // the last CTA-wide barrier: the roles part here

  if (tid >= T::kConsumerThreads) {
    cutlass::arch::warpgroup_reg_dealloc<T::kProducerRegs>();
    fwd_load<T, kDecode>(params, blk, smem, tid - T::kConsumerThreads);
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<T::kConsumerRegs>();

  auto* const o_ptr = blk.template out<typename T::Element>(p);
  Tensor acc_o = partition_fragment_C(typename T::TiledMmaO{}, Shape<Int<T::kBlockM>, Int<T::kHeadDim>>{});  // O
  OnlineSoftmax<decltype(size<0>(acc_as_rowcol(acc_o.layout())))::value> softmax;
  fwd_mma<T, kDecode>(params, blk, smem, tid, acc_o, softmax);
  fwd_epilogue<T, kDecode>(params, blk, smem_raw, tid, o_ptr, acc_o, softmax);
#else
  __trap();  // compiled for sm_90a only (CMakeLists.txt); dispatch never launches it elsewhere
#endif
}

}  // namespace flashcute::sm90
