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
  kGroupBarrier0 = 6,     // kGroupBarrier0 + w: the threads of consumer warpgroup w (6-8)
};

// What the kernel takes: the family-neutral params and the TMA copies of K and V, which run_fwd builds on the host
// (src/sm90/fwd_launch.cuh) where use_tma says they serve: fixed-length batches, varlen ones without padded rows,
// and paged K/V whose pages hold whole key tiles (tma_k, tma_v) or tile them in copies of kPageRows rows
// (tma_k_rows, tma_v_rows). Other varlen batches and pages load with cp.async.
template <class T>
struct FwdParams {
  FwdKernelParams p;
  FwdTileOrder order;  // FwdTileScheduler<T::kBlockM>::order(p)
  typename T::TmaKV tma_k;
  typename T::TmaV tma_v;
  bool use_tma;
  typename T::TmaKVRows tma_k_rows;
  typename T::TmaVRows tma_v_rows;
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
  constexpr int kHeadDimV = T::kHeadDimV;
  constexpr int kPageRows = T::kPageRows;
  FwdKernelParams const& p = params.p;
  auto tile_kv = Shape<Int<kBlockN>, Int<kHeadDim>>{};
  auto tile_v = Shape<Int<kBlockN>, Int<kHeadDimV>>{};
  auto view = [&](int d) { return make_shape(p.page_size, d, p.nheads_kv, p.num_pages); };
  Tensor sK = make_tensor(make_smem_ptr(smem.k), typename T::SmemLayoutKV{});  // (kBlockN, D, stage)
  Tensor sV = make_tensor(make_smem_ptr(smem.v), typename T::SmemLayoutV{});   // (kBlockN, Dv, stage)
  bool const rows_mode = p.page_size < kBlockN;
  int const row_off = rows_mode ? ptid * kPageRows : 0;  // this lane's first row in a tile
  bool const issuer = ptid < (rows_mode ? kBlockN / kPageRows : 1);
  auto slot_of = [&](int n) { return blk.page_slot(p, n * kBlockN + row_off); };
  int const full_tiles = blk.seq.seqlen_k / kBlockN;  // tiles n < full_tiles hold kBlockN keys

  typename T::GmemLoad gmem_load;  // the partial tile's cp.asyncs
  auto load_thr = gmem_load.get_thread_slice(ptid);
  // The rows' layouts only (copy_rows_zfill).
  auto rows_of = [&](auto tile) {
    return load_thr.partition_S(local_tile(
        make_tensor(make_gmem_ptr(static_cast<Element const*>(p.k)), tile, make_stride(p.k_row_stride, _1{})), tile,
        make_coord(_, 0)));
  };
  Tensor tKgK = rows_of(tile_kv);
  Tensor tVgV = rows_of(tile_v);
  Tensor tKsK_cp = load_thr.partition_D(sK);  // (CPY, CPY_N, CPY_D, stage)
  Tensor tVsV_cp = load_thr.partition_D(sV);
  Tensor tKVcKV = copy_offsets(gmem_load, tile_kv);
  Tensor tVcV = copy_offsets(gmem_load, tile_v);
  int load_row, load_col;
  copy_base(load_thr, tile_kv, load_row, load_col);

  // Tile i (stage, its first row in the page) of K or V from page `page`: one copy of the tile, or of this lane's
  // kPageRows rows (rows_mode); thread 0 expects the tile's bytes.
  int page;
  auto load_tile = [&](auto& ring, auto const& tma, auto const& tma_rows, auto& sX, auto tile, int d, int i,
                       int stage, int row) {
    auto tile_rows = Shape<Int<kPageRows>, decltype(get<1>(tile))>{};
    auto copy_rows = [&](auto const& copy_op, auto box, int t, auto&& dst) {
      Tensor g = local_tile(copy_op.get_tma_tensor(view(d))(_, _, blk.h_kv, page), box, make_coord(t, 0));
      auto thr = copy_op.get_slice(_0{});
      copy(copy_op.with(ring.producer_barrier(i)), group_modes<0, 3>(thr.partition_S(g)),
           group_modes<0, 3>(thr.partition_D(dst)));
    };
    ring.producer_acquire(i);
    if (ptid == 0) ring.producer_expect(i, uint32_t(size(tile) * sizeof(Element)));
    if (rows_mode) {
      copy_rows(tma_rows, tile_rows, row / kPageRows, local_tile(sX(_, _, stage), tile_rows, make_coord(ptid, 0)));
    } else {
      copy_rows(tma, tile, row / kBlockN, sX(_, _, stage));
    }
  };
  // Entries of full tiles only: a lane's rows of the partial tile may lie past the sequence's last page entry.
  auto next_page = [&](int i) {
    return issuer && i < blk.num_tiles && blk.tile_of(i) < full_tiles ? blk.page_of(p, slot_of(blk.tile_of(i))) : 0;
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
      load_tile(smem.k_ring, params.tma_k, params.tma_k_rows, sK, tile_kv, p.head_dim, i, stage, row);
      load_tile(smem.v_ring, params.tma_v, params.tma_v_rows, sV, tile_v, p.head_dim_v, i, stage, row);
      page = next;
    } else {
      int const rows = blk.seq.seqlen_k - n * kBlockN - load_row;
      smem.k_ring.producer_acquire(i);
      blk.template load_kv<true, Element, 1, false>(p, false, gmem_load, tKgK, tKsK_cp(_, _, _, stage), tKVcKV, n,
                                                    rows, p.head_dim - load_col, load_row, load_col);
      smem.v_ring.producer_acquire(i);
      blk.template load_kv<true, Element, 1, false>(p, true, gmem_load, tVgV, tVsV_cp(_, _, _, stage), tVcV, n,
                                                    rows, p.head_dim_v - load_col, load_row, load_col);
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
// one thread issuing TMA copies, or all of them issuing cp.async (whose completions the caller waits for before it
// exits). `base`: the rings' uses before this block (the persistent grid's earlier tiles), so that step i of the
// block is use base + i of each ring.
// kDecode (the decode instantiation, one CTA per tile): K and V may be in pages (p.page_table), then loaded by
// fwd_load_pages where TMA serves them, else with cp.async row by row.
template <class T, bool kDecode>
CUTE_DEVICE void fwd_load(FwdParams<T> const& params, FwdBlock<T::kBlockM, T::kBlockN> const& blk,
                          typename T::SharedStorage& smem, int ptid, int base) {
  using Element = typename T::Element;
  constexpr int kBlockN = T::kBlockN;
  constexpr int kHeadDim = T::kHeadDim;
  constexpr int kHeadDimV = T::kHeadDimV;
  FwdKernelParams const& p = params.p;
  auto tile_kv = Shape<Int<kBlockN>, Int<kHeadDim>>{};
  auto tile_v = Shape<Int<kBlockN>, Int<kHeadDimV>>{};
  Tensor sK = make_tensor(make_smem_ptr(smem.k), typename T::SmemLayoutKV{});  // (kBlockN, D, stage)
  Tensor sV = make_tensor(make_smem_ptr(smem.v), typename T::SmemLayoutV{});   // (kBlockN, Dv, stage)
  if constexpr (kDecode) {
    if (params.use_tma && p.page_table) return fwd_load_pages(params, blk, smem, ptid);
  }
  if (params.use_tma) {
    if (ptid != 0) return;
    Tensor mK = params.tma_k.get_tma_tensor(make_shape(tma_rows_k(p), p.head_dim, p.nheads_kv, tma_batches(p)));
    Tensor mV = params.tma_v.get_tma_tensor(make_shape(tma_rows_k(p), p.head_dim_v, p.nheads_kv, tma_batches(p)));
    Tensor gK = local_tile(tma_sequence(p, mK, blk.h_kv, blk.b, blk.seq.k_row0), tile_kv,
                           make_coord(_, 0));  // (kBlockN, D, n)
    Tensor gV = local_tile(tma_sequence(p, mV, blk.h_kv, blk.b, blk.seq.k_row0), tile_v,
                           make_coord(_, 0));  // (kBlockN, Dv, n)
    auto tma_k = params.tma_k.get_slice(_0{});
    auto tma_v = params.tma_v.get_slice(_0{});
    Tensor tKgK = group_modes<0, 3>(tma_k.partition_S(gK));  // (TMA, n)
    Tensor tKsK = group_modes<0, 3>(tma_k.partition_D(sK));  // (TMA, stage)
    Tensor tVgV = group_modes<0, 3>(tma_v.partition_S(gV));
    Tensor tVsV = group_modes<0, 3>(tma_v.partition_D(sV));
#pragma unroll 1
    for (int i = 0; i < blk.num_tiles; ++i) {
      int const n = blk.tile_of(i);
      int const use = base + i;
      int const stage = use % T::kStages;
      smem.k_ring.producer_acquire(use);
      copy(params.tma_k.with(smem.k_ring.producer_expect(use, T::kTmaBytes)), tKgK(_, n), tKsK(_, stage));
      smem.v_ring.producer_acquire(use);
      copy(params.tma_v.with(smem.v_ring.producer_expect(use, T::kTmaBytesV)), tVgV(_, n), tVsV(_, stage));
    }
    return;
  }
  SeqInfo const& seq = blk.seq;
  Tensor mK = make_tensor(make_gmem_ptr(blk.template k<Element>(p)), make_shape(seq.seqlen_k, Int<kHeadDim>{}),
                          make_stride(p.k_row_stride, _1{}));  // (Sk, D)
  Tensor mV = make_tensor(make_gmem_ptr(blk.template v<Element>(p)), make_shape(seq.seqlen_k, Int<kHeadDimV>{}),
                          make_stride(p.v_row_stride, _1{}));  // (Sk, Dv)
  Tensor gK = local_tile(mK, tile_kv, make_coord(_, 0));       // (kBlockN, D, n)
  Tensor gV = local_tile(mV, tile_v, make_coord(_, 0));        // (kBlockN, Dv, n)
  typename T::GmemLoad gmem_load;
  auto load_thr = gmem_load.get_thread_slice(ptid);
  Tensor tKgK = load_thr.partition_S(gK);  // (CPY, CPY_N, CPY_D, n)
  Tensor tKsK = load_thr.partition_D(sK);  // (CPY, CPY_N, CPY_D, stage)
  Tensor tVgV = load_thr.partition_S(gV);
  Tensor tVsV = load_thr.partition_D(sV);
  Tensor tKVcKV = copy_offsets(gmem_load, tile_kv);
  Tensor tVcV = copy_offsets(gmem_load, tile_v);
  int load_row, load_col;
  copy_base(load_thr, tile_kv, load_row, load_col);
  int const k_cols = p.head_dim - load_col;
  int const v_cols = p.head_dim_v - load_col;
#pragma unroll 1
  for (int i = 0; i < blk.num_tiles; ++i) {
    int const n = blk.tile_of(i);
    int const use = base + i;
    int const stage = use % T::kStages;
    int const rows = seq.seqlen_k - n * kBlockN - load_row;
    smem.k_ring.producer_acquire(use);
    blk.template load_kv<kDecode, Element, T::kGatherGroup, false>(p, false, gmem_load, tKgK, tKsK(_, _, _, stage),
                                                                   tKVcKV, n, rows, k_cols, load_row, load_col);
    smem.k_ring.producer_commit(use);
    smem.v_ring.producer_acquire(use);
    blk.template load_kv<kDecode, Element, T::kGatherGroup, false>(p, true, gmem_load, tVgV, tVsV(_, _, _, stage),
                                                                   tVcV, n, rows, v_cols, load_row, load_col);
    smem.v_ring.producer_commit(use);
  }
}

// Consumer warpgroup `group`'s 64 rows of the block's Q into its rows of shared memory, by its own 128 threads
// (cp.async, zeros past the sequence and the head dim); fwd_wait_q waits for them. Each warpgroup's MMAs read only
// its own rows of Q, so the warpgroups load (and, in the persistent grid, reload) them independently.
template <class T>
CUTE_DEVICE void fwd_load_q(FwdParams<T> const& params, FwdBlock<T::kBlockM, T::kBlockN> const& blk,
                            typename T::SharedStorage& smem, int tid) {
  using Element = typename T::Element;
  auto tile_rows = Shape<_64, Int<T::kHeadDim>>{};
  FwdKernelParams const& p = params.p;
  int const group = tid / 128;
  Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename T::SmemLayoutQ{});  // (kBlockM, D)
  Tensor mQ = make_tensor(make_gmem_ptr(blk.template q<Element>(p)), make_shape(blk.seq.seqlen_q, Int<T::kHeadDim>{}),
                          make_stride(p.q_row_stride, _1{}));  // (Sq, D)
  Tensor gQ = local_tile(mQ, tile_rows, make_coord(blk.m_block * (T::kBlockM / 64) + group, 0));
  typename T::GmemLoad load_q;  // 128 threads
  auto q_thr = load_q.get_thread_slice(tid % 128);
  int q_row, q_col;
  copy_base(q_thr, tile_rows, q_row, q_col);
  copy_tile_zfill(load_q, q_thr.partition_S(gQ), q_thr.partition_D(local_tile(sQ, tile_rows, make_coord(group, 0))),
                  copy_offsets(load_q, tile_rows), blk.seq.seqlen_q - blk.m0 - 64 * group - q_row, p.head_dim - q_col);
}
CUTE_DEVICE void fwd_wait_q(int tid) {
  cp_async_wait<0>();
  cutlass::arch::fence_view_async_shared();
  named_sync(kGroupBarrier0 + tid / 128, 128);
}

// Consumer warpgroups' mainloop, once fwd_wait_q has Q in shared memory: S_i = Q K_i^T and O += P_i V_i over every
// visible tile with the online softmax. acc_o ends as the tile's unnormalised O, softmax with its rows'
// statistics. `base`: the K/V rings' uses before this block (as for fwd_load).
template <class T, bool kDecode, class AccO, class Softmax>
CUTE_DEVICE void fwd_mma(FwdParams<T> const& params, FwdBlock<T::kBlockM, T::kBlockN> const& blk,
                         typename T::SharedStorage& smem, int tid, int base, AccO& acc_o, Softmax& softmax) {
  using Element = typename T::Element;
  constexpr int kBlockM = T::kBlockM;
  constexpr int kBlockN = T::kBlockN;
  constexpr int kConsumerThreads = T::kConsumerThreads;
  constexpr int kConsumerGroups = kConsumerThreads / 128;
  constexpr int kRows = decltype(size<0>(acc_as_rowcol(acc_o.layout())))::value;
  FwdKernelParams const& p = params.p;
  Mask const& mask = blk.mask;
  int const m0 = blk.m0;
  int const group = tid / 128;
  int const num_general = blk.num_general, num_tiles = blk.num_tiles;
  auto tile_of = [&](int i) { return blk.tile_of(i); };

  auto tile_s = Shape<Int<kBlockM>, Int<kBlockN>>{};
  Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename T::SmemLayoutQ{});    // (kBlockM, D)
  Tensor sK = make_tensor(make_smem_ptr(smem.k), typename T::SmemLayoutKV{});   // (kBlockN, D, stage)
  Tensor sVt = make_tensor(make_smem_ptr(smem.v), typename T::SmemLayoutVt{});  // (Dv, kBlockN, stage)

  typename T::TiledMmaS mma_s;
  typename T::TiledMmaO mma_o;
  // Sliced by the warpgroup's first thread, warp-uniform through a shuffle: the descriptors then stay in uniform
  // registers (src/sm90/bwd_kernel.cuh says more).
  int const wg_thread = __shfl_sync(0xffffffff, group, 0) * 128;
  auto thr_s = mma_s.get_thread_slice(wg_thread);
  auto thr_o = mma_o.get_thread_slice(wg_thread);
  Tensor tSrQ = thr_s.make_fragment_A(thr_s.partition_A(sQ));    // GMMA descriptors (MMA, MMA_M, MMA_D)
  Tensor tSrK = thr_s.make_fragment_B(thr_s.partition_B(sK));    // (MMA, MMA_N, MMA_D, stage)
  Tensor tOrVt = thr_o.make_fragment_B(thr_o.partition_B(sVt));  // (MMA, MMA_D, MMA_N, stage)
  clear(acc_o);

  // The warpgroups take turns issuing their MMAs: w waits for its turn, issues, then hands the turn to the next.
  // Warpgroup 0 goes first (fwd_kernel's first arrival). Every warpgroup takes the same steps in every block, so
  // the turn goes round without a break from one block to the next.
  constexpr bool kTurns = kConsumerGroups > 1 && T::kTakeTurns;
  auto wait_turn = [&]() {
    if constexpr (kTurns) named_sync(kTurnBarrier0 + group, 256);
  };
  auto pass_turn = [&]() {
    if constexpr (kTurns) named_arrive(kTurnBarrier0 + (group + 1) % kConsumerGroups, 256);
  };
  static_assert(kConsumerGroups <= 3, "turns go round at most three warpgroups (named barriers 2-4)");

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
  // issued (FA3's order), so that only P's conversion waits for the P.V MMA. A warp none of whose rows' max moved
  // skips the rescale: on an H100 1.00-1.04x from 8k keys, 0.99-1.01x below (bench/RESULTS.md, twelfth session).
  float correction[kRows];
  auto step = [&](int i, auto kind) __attribute__((always_inline)) {
    int const use = base + i;
    int const stage = use % T::kStages, prev = (use - 1) % T::kStages;
    Tensor acc_s = partition_fragment_C(mma_s, tile_s);  // (MMA, MMA_M, MMA_N)
    smem.k_ring.consumer_wait(use);
    wait_turn();
    warpgroup_issue<true, false>(mma_s, tSrQ, tSrK(_, _, _, stage), acc_s);
    OnlineSoftmax<kRows>::rescale_if_moved(acc_o, correction);
    smem.v_ring.consumer_wait(use - 1);
    warpgroup_issue<false, true>(mma_o, tOrP, tOrVt(_, _, _, prev), acc_o);
    pass_turn();
    warpgroup_wait_for<1>(acc_s);
    smem.k_ring.consumer_release(use);
    softmax_of(i, acc_s, kind, correction);
    warpgroup_wait_for<0>(acc_o, rP);
    smem.v_ring.consumer_release(use - 1);
    convert_into(acc_s, rP);
  };

  // The first tile takes the masked (or softcapped) body even where it needs no mask: one tile, at a small cost.
  if (num_tiles > 0) {
    {
      Tensor acc_s = partition_fragment_C(mma_s, tile_s);
      smem.k_ring.consumer_wait(base);
      warpgroup_issue<true, false>(mma_s, tSrQ, tSrK(_, _, _, base % T::kStages), acc_s);
      warpgroup_wait_for<0>(acc_s);
      smem.k_ring.consumer_release(base);
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
    int const last = base + num_tiles - 1;
    OnlineSoftmax<kRows>::rescale(acc_o, correction);
    smem.v_ring.consumer_wait(last);
    warpgroup_issue<false, true>(mma_o, tOrP, tOrVt(_, _, _, last % T::kStages), acc_o);
    warpgroup_wait_for<0>(acc_o, rP);
    smem.v_ring.consumer_release(last);
  }
}

// Consumer warpgroups' epilogue, each warpgroup for its own 64 rows: O normalised and converted in registers, into
// shared memory (the warpgroup's rows of T::kOwnO's buffer, else of Q, which its MMAs no longer read) with 32-bit
// stores, then out in 16-byte vectors along rows; the rows' lse. Split-KV (the decode instantiation) writes float32
// partials for the combine kernel instead, through all of shared memory (one CTA per tile there).
template <class T, bool kDecode, class AccO, class Softmax>
CUTE_DEVICE void fwd_epilogue(FwdParams<T> const& params, FwdBlock<T::kBlockM, T::kBlockN> const& blk,
                              typename T::SharedStorage& smem, int tid, AccO& acc_o, Softmax& softmax) {
  using Element = typename T::Element;
  constexpr int kBlockM = T::kBlockM;
  constexpr int kHeadDim = T::kHeadDimV;  // O's
  constexpr int kConsumerThreads = T::kConsumerThreads;
  constexpr int kRows = decltype(size<0>(acc_as_rowcol(acc_o.layout())))::value;
  FwdKernelParams const& p = params.p;
  SeqInfo const& seq = blk.seq;
  int const b = blk.b, h = blk.h, m0 = blk.m0;
  int const group = tid / 128;
  auto tile_q = Shape<Int<kBlockM>, Int<kHeadDim>>{};  // O's tile
  typename T::TiledMmaO mma_o;
  auto thr_o = mma_o.get_thread_slice(tid);

  float inv[kRows], lse[kRows];
  bool const split = kDecode && p.num_splits > 1;  // split-KV: float32 partials, the sink joining in the combine
  softmax.finish(p.scale_log2, inv, lse, split ? -INFINITY : sink_log2(p, h));
  Tensor o_rc = make_tensor(acc_o.data(), acc_as_rowcol(acc_o.layout()));  // (rows, cols)

  if constexpr (kDecode) {
    if (split) {  // every accumulator pair stored from its registers, then normalised float32 rows
      constexpr int kStride = kHeadDim + 8;  // floats, against bank conflicts
      float* o_buf = reinterpret_cast<float*>(&smem);
      float* inv_buf = o_buf + kBlockM * kStride;
      static_assert((kBlockM * kStride + kBlockM) * int(sizeof(float)) <= T::kSmemBytes);
      TileCoords<typename T::TiledMmaO, decltype(tile_q)> const o_base(mma_o, tile_q);
      auto const o_off = TileCoords<typename T::TiledMmaO, decltype(tile_q)>::offsets(mma_o, tile_q);
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
      int const rows = min(kBlockM, seq.seqlen_q - m0);
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
  }

  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    CUTE_UNROLL
    for (int c = 0; c < size<1>(o_rc); ++c) o_rc(r, c) *= inv[r];
  }
  static_assert(cosize_v<typename T::SmemLayoutO> <= cosize_v<typename T::SmemLayoutQ>);
  Tensor sO = make_tensor(make_smem_ptr(T::kOwnO ? smem.o : smem.q), typename T::SmemLayoutO{});  // (kBlockM, Dv)
  auto sts = make_tiled_copy_C(Copy_Atom<SharedStore32, Element>{}, mma_o);
  auto sts_thr = sts.get_thread_slice(tid);
  Tensor rO = make_tensor<Element>(acc_o.layout());
  convert_into(acc_o, rO);
  // The warpgroup's reads of the buffer for the previous block ended before fwd_wait_q's barrier; of Q (kOwnO
  // false), its MMAs ended before this barrier.
  if constexpr (!T::kOwnO) named_sync(kGroupBarrier0 + group, 128);
  cute::copy(sts, sts_thr.retile_S(rO), sts_thr.partition_D(sO));
  named_sync(kGroupBarrier0 + group, 128);

  auto tile_rows = Shape<_64, Int<kHeadDim>>{};
  Tensor mO = make_tensor(make_gmem_ptr(blk.template out<Element>(p)), make_shape(seq.seqlen_q, Int<kHeadDim>{}),
                          make_stride(p.out_row_stride, _1{}));  // (Sq, D)
  store_tile(typename T::GmemStore{}, local_tile(sO, tile_rows, make_coord(group, 0)),
             local_tile(mO, tile_rows, make_coord(blk.m_block * (kBlockM / 64) + group, 0)), tile_rows,
             seq.seqlen_q - m0 - 64 * group, p.head_dim_v, tid % 128);
  store_lse(p, thr_o, tile_q, seq, b, h, m0, lse);
}

// The kernel: the rings, then the roles. The producer warpgroup runs fwd_load for each block, the consumers
// fwd_load_q, fwd_mma and fwd_epilogue. One CTA per tile, or (p.tile_counter set: the persistent grid) one per SM
// walking tiles: producer thread 0 takes the next tile's index from the counter once it has issued a block's loads
// and hands it (the index, or the tile decoded) to the consumers through tile_ring, read after their
// mainloop, so the producer loads the next block's K/V under this block's last steps and epilogue, and (kOwnO) the
// consumers its Q under their epilogue. kDecode: the decode instantiation (paged K/V, split-KV: see the portable
// kernel), one CTA per tile, so that the other keeps its registers.
template <class T, bool kDecode>
__global__ void __launch_bounds__(T::kThreads, 1) fwd_kernel(__grid_constant__ FwdParams<T> const params) {
#if defined(CUTE_ARCH_MMA_SM90A_ENABLED)
  extern __shared__ __align__(1024) char smem_raw[];
  auto& smem = *reinterpret_cast<typename T::SharedStorage*>(smem_raw);
  using Scheduler = FwdTileScheduler<T::kBlockM>;
  using Block = FwdBlock<T::kBlockM, T::kBlockN>;
  // What producer thread 0 hands the consumers: the next tile decoded, or its index (the decode instantiation, one
  // CTA per tile, never walks tiles).
  constexpr bool kHandOver = T::kHandOverTile && !kDecode;
  using Handed = std::conditional_t<kHandOver, FwdTile, int>;
  auto slot = [&](int k) -> Handed& { return *reinterpret_cast<Handed*>(&smem.next_tile[k % 2]); };
  int const tid = threadIdx.x;
  FwdKernelParams const& p = params.p;
  bool const persistent = !kDecode && p.tile_counter;
  // Tile `index` of the persistent grid's order, or this CTA's (index -1); tiles past the last: none.
  auto tiles = [&]() { return persistent ? params.order.count : 0; };
  auto tile_at = [&](int index) {
    return index < 0 ? Scheduler::tile(params.order) : Scheduler::tile(params.order, index);
  };
  int const first = persistent ? int(blockIdx.x) : -1;
  // What the producer hands over for tile `index` (none past the last), whether it is none, and its tile.
  auto hand = [&](int index) -> Handed {
    if constexpr (kHandOver) return index < tiles() ? Scheduler::tile(params.order, index) : FwdTile{-1, 0, 0};
    else return index;
  };
  auto none = [&](Handed const& t) {
    if constexpr (kHandOver) return t.m_block < 0;
    else return t >= tiles();
  };
  auto tile_of = [&](Handed const& t) -> FwdTile {
    if constexpr (kHandOver) return t;
    else return tile_at(t);
  };
  auto start = [&]() -> Handed {
    if constexpr (kHandOver) return tile_at(first);
    else return first;
  };

  if (tid == 0) {
    int const producers = params.use_tma ? 1 : T::kProducerThreads;
    smem.k_ring.init(producers, T::kConsumerThreads / 32);
    smem.v_ring.init(producers, T::kConsumerThreads / 32);
    smem.tile_ring.init(1, T::kConsumerThreads);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();  // the last CTA-wide barrier: the roles part here

  if (tid >= T::kConsumerThreads) {
    cutlass::arch::warpgroup_reg_dealloc<T::kProducerRegs>();
    int const ptid = tid - T::kConsumerThreads;
    bool const tma = params.use_tma && !(kDecode && p.page_table);  // fwd_load's one-thread path
    if (tma && ptid != 0) return;
    Handed cur = start();
    for (int k = 0, base = 0;; ++k) {
      Block blk;
      if (blk.template init<kDecode>(p, tile_of(cur))) {
        blk.plan_tiles(p);
        fwd_load<T, kDecode>(params, blk, smem, ptid, base);
        base += blk.num_tiles;
      }
      // The next tile, taken once this block's loads are issued (a kStages-tile lead on the consumers): taken at
      // the block's start instead, a CTA held a tile for a whole block while others ran dry (hd128 causal 16k 7%
      // slower than one CTA per tile, bench/RESULTS.md, sixteenth session).
      Handed next = hand(tiles());  // none without the persistent grid
      if (persistent) {
        if (ptid == 0) {
          next = hand(atomicAdd(p.tile_counter, 1) + int(gridDim.x));
          smem.tile_ring.producer_acquire(k);
          slot(k) = next;
          smem.tile_ring.producer_arrive(k);
        }
        if (!tma) {
          named_sync(kProducersBarrier, T::kProducerThreads);
          next = slot(k);
        }
      }
      if (none(next)) break;
      cur = next;
    }
    if (!tma) cp_async_wait<0>();
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<T::kConsumerRegs>();

  if (T::kConsumerThreads > 128 && T::kTakeTurns && tid < 128) named_arrive(kTurnBarrier0, 256);  // fwd_mma
  // The next block's Q into this warpgroup's rows, once their last reader (its MMAs, or kOwnO false the epilogue)
  // is done.
  auto load_next_q = [&](Handed const& next) {
    Block nblk;
    if (!none(next) && nblk.template init<kDecode>(p, tile_of(next))) {
      named_sync(kGroupBarrier0 + tid / 128, 128);
      fwd_load_q(params, nblk, smem, tid);
    }
  };
  Handed cur = start();
  for (int k = 0, base = 0;; ++k) {
    // A handed tile is read again here rather than kept in registers through the epilogue; its slot is released now.
    if constexpr (kHandOver) {
      if (k > 0) {
        cur = slot(k - 1);
        smem.tile_ring.consumer_arrive(k - 1);
      }
    }
    Block blk;
    bool const live = blk.template init<kDecode>(p, tile_of(cur));
    if (live) {
      blk.plan_tiles(p);
      if (k == 0) fwd_load_q(params, blk, smem, tid);
    }
    Tensor acc_o = partition_fragment_C(typename T::TiledMmaO{}, Shape<Int<T::kBlockM>, Int<T::kHeadDimV>>{});  // O
    OnlineSoftmax<decltype(size<0>(acc_as_rowcol(acc_o.layout())))::value> softmax;
    if (live) {
      fwd_wait_q(tid);
      fwd_mma<T, kDecode>(params, blk, smem, tid, base, acc_o, softmax);
      base += blk.num_tiles;
    }
    // The next tile, which the producer hands over once it has issued this block's loads (so only after the
    // mainloop: before it, the producer would wait for stages that this wait keeps full).
    Handed next = hand(tiles());
    if (persistent) {
      smem.tile_ring.consumer_wait(k);
      next = slot(k);
      if constexpr (!kHandOver) smem.tile_ring.consumer_arrive(k);
    }
    if constexpr (T::kOwnO) load_next_q(next);
    if (live) fwd_epilogue<T, kDecode>(params, blk, smem, tid, acc_o, softmax);
    if constexpr (!T::kOwnO) load_next_q(next);
    if (none(next)) break;
    if constexpr (!kHandOver) cur = next;
  }
#else
  __trap();  // compiled for sm_90a only (CMakeLists.txt); dispatch never launches it elsewhere
#endif
}

}  // namespace flashcute::sm90
