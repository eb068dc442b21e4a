// Hopper backward mainloop (wgmma; TMA or cp.async loads). One CTA owns a kBlockN tile of keys of one K/V head and
// walks the query tiles that can see it (common/bwd_block.cuh), loading Q and dO kStages - 1 tiles ahead into a
// ring of stages, each signalled by an mbarrier (no CTA barrier at a step's start; BwdTraits::kStages): thread 0
// issuing TMA copies for fixed-length batches (kTma), every thread cp.async otherwise. Per query tile:
//   S^T = K Q^T, dP^T = V dO^T;  P^T = exp2(S^T * scale_log2 - lse_log2);  dS^T = P^T * (dP^T - D)
//   dV += P^T dO, dK += dS^T Q   (dV, dK in registers for the whole walk)
//   dQ  = dS K                   (dS through shared memory; added into the float32 workspace with atomics, in
//                                 deterministic mode in turns: common/bwd_dq_order.cuh; or, where its buffer
//                                 fits, handed to a writer thread of its own: bwd_ws_kernel)
// Shared-memory writes that a wgmma reads (dS^T, P^T) go through the generic proxy and wgmma reads through the
// async one: a proxy fence, then the barrier.
// How the warpgroups share the work (one per 64 keys, or all on 64 keys splitting the head dim): see BwdTraits.
// Semantics, workspace and GQA as in the portable family (src/sm80/bwd_kernel.cuh).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>

#include "common/bwd_atomics.cuh"
#include "common/bwd_block.cuh"
#include "common/bwd_dq_order.cuh"
#include "common/bwd_epilogue.cuh"
#include "common/bwd_grads.cuh"
#include "common/cute_utils.cuh"
#include "common/kernel_params.h"
#include "common/mask_apply.cuh"
#include "sm90/bwd_traits.cuh"
#include "sm90/pipeline.cuh"
#include "sm90/wgmma.cuh"

namespace flashcute::sm90 {

// What the kernel takes: the family-neutral params and, for the kTma kernel, the TMA copies run_bwd builds on the
// host (src/sm90/bwd_launch.cuh) where they serve: fixed-length batches with strides TMA can address.
template <class T>
struct BwdParams {
  BwdKernelParams p;
  typename T::TmaQ tma_q;
  typename T::TmaDO tma_do;
  typename T::TmaK tma_k;
  typename T::TmaV tma_v;
};

// The kernel with a dQ writer (bwd_ws_kernel): the MMA threads hand each step's dQ to one writer thread through a
// float32 buffer in shared memory, with a message: where it goes and, in deterministic mode, the turn word, the
// value to wait for and the one to hand on (common/bwd_dq_order.cuh). dst null ends the writer.
struct DqMessage {
  float* dst;
  int* word;
  int wait, pass;
};
template <class T>
struct DqWsStorage : T::SharedStorage {
  alignas(128) float dq[T::kBlockM * T::kDqCols];
  DqMessage msg;
  uint64_t dq_full;   // the buffer and message written: one arrival per MMA thread
  uint64_t dq_empty;  // the writer has read them: one arrival
};
// The named barrier of that kernel's MMA threads (0 is __syncthreads, which the writer does not join), as a barrier
// object for store_dk_dv and for_each_key_tile.
constexpr int kWsMmaBarrier = 1;
template <class T>
struct SyncMmaThreads {
  CUTE_DEVICE void operator()() const { named_sync(kWsMmaBarrier, T::kThreads); }
};
// The tile of the dQ writer's kernel (bwd_ws_kernel): tile T where its dQ buffer fits beside it, else T with two
// Q/dO stages (hd64's 128-row tile); kDqWriter: whether it fits then, with one dQ chunk per step (not hd256).
template <class T>
constexpr bool kDqBufferFits = sizeof(DqWsStorage<T>) <= 227 * 1024;
template <class T>
using WsTraits = std::conditional_t<kDqBufferFits<T>, T, typename T::template WithStages<2>>;
template <class T>
constexpr bool kDqWriter = T::kDqChunks == 1 && kDqBufferFits<WsTraits<T>>;
// Where the default mode takes the writer kernel too: the tiles of fewer than 128 keys (hd192's 96, (192, 128)'s 64),
// whose atomics cost the MMA warps more per product than the 128-key tiles' do. On an H100 the writer ran the 64-key
// hd192 tile at 1.08-1.16x the atomics, and hd64 (two Q/dO stages) and hd128 at 0.92-1.04x (bench/RESULTS.md,
// 2026-12-06, third session).
template <class T>
constexpr bool kDqWriterDefault = kDqWriter<T> && T::kBlockN < 128;

// TMA (thread 0): dO of query tile m of head h, batch b (whose first packed row is q_row0), into `stage`,
// signalling `full`.
template <class T>
__device__ __forceinline__ void bwd_load_do_tma(BwdParams<T> const& params, typename T::SharedStorage& smem,
                                                uint64_t& full, int stage, int b, int h, int m, int q_row0) {
  BwdKernelParams const& p = params.p;
  Tensor sdO = make_tensor(make_smem_ptr(smem.dout), typename T::SmemLayoutdOs{});  // (kBlockM, Dv, stage)
  Tensor mdO = params.tma_do.get_tma_tensor(make_shape(tma_rows_q(p), p.head_dim_v, p.nheads, tma_batches(p)));
  auto tma_do = params.tma_do.get_slice(_0{});
  copy(params.tma_do.with(full),
       tma_do.partition_S(local_tile(tma_sequence(p, mdO, h, b, q_row0), Shape<Int<T::kBlockM>, Int<T::kHeadDimV>>{},
                                     make_coord(m, 0))),
       tma_do.partition_D(sdO(_, _, stage)));
}

// TMA (thread 0): Q and (but kOneDoStage) dO of query tile m of head h, batch b, into `stage`, with the rows'
// lse_log2 and D by bulk copies; the stage's mbarrier completes once all have landed. A varlen sequence's first
// packed row is read here from the table rather than kept in a register across the walk (which moved ptxas's
// allocation of the hd128 kernel).
template <class T>
__device__ __forceinline__ void bwd_load_stage_tma(BwdParams<T> const& params, typename T::SharedStorage& smem,
                                                int stage, int b, int h, int m) {
  constexpr int kBlockM = T::kBlockM;
  BwdKernelParams const& p = params.p;
  uint64_t& full = smem.full[stage];
  cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&full, T::kStageTmaBytes);
  Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename T::SmemLayoutQs{});      // (kBlockM, D, stage)
  int const q_row0 = p.seq_spans ? p.seq_spans[b].q_row0 : 0;
  Tensor mQ = params.tma_q.get_tma_tensor(make_shape(tma_rows_q(p), p.head_dim, p.nheads, tma_batches(p)));
  auto tma_q = params.tma_q.get_slice(_0{});
  copy(params.tma_q.with(full),
       tma_q.partition_S(local_tile(tma_sequence(p, mQ, h, b, q_row0), Shape<Int<kBlockM>, Int<T::kHeadDim>>{},
                                    make_coord(m, 0))),
       tma_q.partition_D(sQ(_, _, stage)));
  if constexpr (!T::kOneDoStage) bwd_load_do_tma(params, smem, full, stage, b, h, m, q_row0);
  int64_t const row0 = ((int64_t)b * p.nheads + h) * p.seqlen_q_rounded + m * kBlockM;  // 256-byte aligned
  float* const rows = smem.rows + stage * 2 * kBlockM;
  SM90_BULK_COPY_G2S::copy(p.lse_log2 + row0, &full, rows, kBlockM * sizeof(float));
  SM90_BULK_COPY_G2S::copy(p.dsoftmax_sum + row0, &full, rows + kBlockM, kBlockM * sizeof(float));
}

// ring: the Q stages this CTA used before this key tile (each key tile continues the stages' mbarrier phases);
// key_tiles: the key tiles it loaded before (kTma: the phase of smem.key_tile_full). kTurns: deterministic mode, dQ
// added in turns (common/bwd_dq_order.cuh).
template <class T, bool kTma, bool kTurns, bool kWs = false>
__device__ __forceinline__ void bwd_key_tile(BwdParams<T> const& params, int const n_block, float* const dq_slot,
                                             int& ring, int& key_tiles, int& dq_msgs) {
  BwdKernelParams const& p = params.p;
  using Element = typename T::Element;
  constexpr int kBlockM = T::kBlockM;
  constexpr int kBlockN = T::kBlockN;
  constexpr int kHeadDim = T::kHeadDim;
  constexpr int kHeadDimV = T::kHeadDimV;

  extern __shared__ __align__(1024) char smem_raw[];
  auto& smem = *reinterpret_cast<typename T::SharedStorage*>(smem_raw);
  int const tid = threadIdx.x;

  // A barrier over the MMA threads: the whole CTA, or (kWs) all but the dQ writer's warpgroup.
  std::conditional_t<kWs, SyncMmaThreads<T>, SyncCta> const mma_barrier{};
  // Deterministic mode without a writer: each warp waits for its turn and hands it on itself.
  constexpr bool kWarpTurns = kTurns && !kWs;

  BwdBlock<kBlockM, kBlockN> blk;
  if (!blk.init(p, n_block)) return;
  SeqInfo const& seq = blk.seq;
  int const b = blk.b, n0 = blk.n0, num_iters = blk.num_iters, num_general = blk.num_general;

  auto tile_q = Shape<Int<kBlockM>, Int<kHeadDim>>{};
  auto tile_do = Shape<Int<kBlockM>, Int<kHeadDimV>>{};
  auto tile_kv = Shape<Int<kBlockN>, Int<kHeadDim>>{};
  auto tile_v = Shape<Int<kBlockN>, Int<kHeadDimV>>{};
  auto tile_st = typename T::TileS{};  // S^T, dP^T (keys x queries), or kSwapKV S, dP (queries x keys)
  constexpr bool kSwap = T::kSwapKV;

  Tensor mK = make_tensor(make_gmem_ptr(blk.template k<Element>(p)), make_shape(seq.seqlen_k, Int<kHeadDim>{}),
                          make_stride(p.k_row_stride, _1{}));  // (Sk, D)
  Tensor mV = make_tensor(make_gmem_ptr(blk.template v<Element>(p)), make_shape(seq.seqlen_k, Int<kHeadDimV>{}),
                          make_stride(p.v_row_stride, _1{}));  // (Sk, Dv)
  Element const* q_base = blk.template q<Element>(p);
  Element const* do_base = blk.template dout<Element>(p);

  Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename T::SmemLayoutQs{});       // (kBlockM, D, stage)
  Tensor sdO = make_tensor(make_smem_ptr(smem.dout), typename T::SmemLayoutdOs{});   // (kBlockM, Dv, stage)
  Tensor sK = make_tensor(make_smem_ptr(smem.k), typename T::SmemLayoutKV{});       // (kBlockN, D)
  Tensor sV = make_tensor(make_smem_ptr(smem.v), typename T::SmemLayoutV{});        // (kBlockN, Dv)
  // dS^T and P^T as the registers store them (kSwapKV: dS and P).
  Tensor sdSt = make_tensor(make_smem_ptr(smem.ds), typename T::SmemLayoutPdSStored{});  // (tile_st, stage)
  Tensor sPt = make_tensor(make_smem_ptr(smem.ds + (T::kPtInSmem ? cosize_v<typename T::SmemLayoutdSt> : 0)),
                           typename T::SmemLayoutPdSStored{});                           // (tile_st, stage)

  typename T::GmemLoad gmem_load;
  auto load_thr = gmem_load.get_thread_slice(tid);
  // Copy predicates: thread 0's coordinates against bounds shifted by this thread's base (copy_base).
  Tensor tQcQ = copy_offsets(gmem_load, tile_q);     // (CPY, CPY_M, CPY_D)
  Tensor tdOcdO = copy_offsets(gmem_load, tile_do);  // (CPY, CPY_M, CPY_Dv)
  Tensor tKVcKV = copy_offsets(gmem_load, tile_kv);  // (CPY, CPY_N, CPY_D)
  Tensor tVcV = copy_offsets(gmem_load, tile_v);     // (CPY, CPY_N, CPY_Dv)
  int load_row, load_col;
  copy_base(load_thr, tile_q, load_row, load_col);
  Tensor tQsQ = load_thr.partition_D(sQ);    // (CPY, CPY_M, CPY_D, stage)
  Tensor tdOsdO = load_thr.partition_D(sdO);

  // Q or dO rows (tile: Q's or dO's, coords: its copy offsets) of query tile m of head h into one stage,
  // zero-filled past the sequence and head dim.
  auto load_rows = [&](auto dst, auto tile, auto const& coords, Element const* base, int64_t head_stride,
                       int64_t row_stride, int cols, int h, int m) __attribute__((always_inline)) {
    Tensor mX = make_tensor(make_gmem_ptr(base + h * head_stride), make_shape(seq.seqlen_q, get<1>(tile)),
                            make_stride(row_stride, _1{}));  // (Sq, D or Dv)
    Tensor tXgX = load_thr.partition_S(local_tile(mX, tile, make_coord(m, 0)));
    copy_tile_zfill(gmem_load, tXgX, dst, coords, seq.seqlen_q - m * kBlockM - load_row, cols - load_col);
  };
  // Q, dO and the lse_log2 and D of the rows of flat iteration `it` into its stage; the stage's mbarrier completes
  // once thread 0's TMA copies, or every thread's cp.async copies (these and any before), have landed.
  auto load_q_do = [&](int it) __attribute__((always_inline)) {
    int h, m;
    blk.tile_of(it, h, m);
    int const stage = (ring + it) % T::kStages;
    if constexpr (kTma) {
      if (cutlass::canonical_warp_idx_sync() == 0 && cute::elect_one_sync())
        bwd_load_stage_tma(params, smem, stage, b, h, m);
      return;
    }
    load_rows(tQsQ(_, _, _, stage), tile_q, tQcQ, q_base, p.q_head_stride, p.q_row_stride, p.head_dim, h, m);
    if constexpr (!T::kOneDoStage)
      load_rows(tdOsdO(_, _, _, stage), tile_do, tdOcdO, do_base, p.dout_head_stride, p.dout_row_stride,
                p.head_dim_v, h, m);
    load_row_terms<kBlockM>(p, b, h, m, smem.rows + stage * 2 * kBlockM);
    cutlass::arch::cpasync_barrier_arrive_noinc(&smem.full[stage]);
  };
  // kOneDoStage: dO of flat iteration `it` into its one stage, signalling smem.do_full.
  auto load_do = [&](int it) __attribute__((always_inline)) {
    int h, m;
    blk.tile_of(it, h, m);
    if constexpr (kTma) {
      if (cutlass::canonical_warp_idx_sync() == 0 && cute::elect_one_sync()) {
        cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&smem.do_full, T::kDoTmaBytes);
        bwd_load_do_tma(params, smem, smem.do_full, 0, b, h, m, p.seq_spans ? p.seq_spans[b].q_row0 : 0);
      }
      return;
    }
    load_rows(tdOsdO(_, _, _, 0), tile_do, tdOcdO, do_base, p.dout_head_stride, p.dout_row_stride, p.head_dim_v, h,
              m);
    cutlass::arch::cpasync_barrier_arrive_noinc(&smem.do_full);
  };

  if (num_iters > 0) {
    if constexpr (kTma) {
      if (tid == 0) {
        cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&smem.key_tile_full, T::kKeyTileTmaBytes);
        Tensor mK = params.tma_k.get_tma_tensor(make_shape(tma_rows_k(p), p.head_dim, p.nheads_kv, tma_batches(p)));
        Tensor mV =
            params.tma_v.get_tma_tensor(make_shape(tma_rows_k(p), p.head_dim_v, p.nheads_kv, tma_batches(p)));
        auto tma_k = params.tma_k.get_slice(_0{});
        auto tma_v = params.tma_v.get_slice(_0{});
        copy(params.tma_k.with(smem.key_tile_full),
             tma_k.partition_S(
                 local_tile(tma_sequence(p, mK, blk.h_kv, b, seq.k_row0), tile_kv, make_coord(n_block, 0))),
             tma_k.partition_D(sK));
        copy(params.tma_v.with(smem.key_tile_full),
             tma_v.partition_S(
                 local_tile(tma_sequence(p, mV, blk.h_kv, b, seq.k_row0), tile_v, make_coord(n_block, 0))),
             tma_v.partition_D(sV));
      }
    } else {
      Tensor tKgK = load_thr.partition_S(local_tile(mK, tile_kv, make_coord(n_block, 0)));  // (CPY, CPY_N, CPY_D)
      Tensor tVgV = load_thr.partition_S(local_tile(mV, tile_v, make_coord(n_block, 0)));
      copy_tile_zfill(gmem_load, tKgK, load_thr.partition_D(sK), tKVcKV, seq.seqlen_k - n0 - load_row,
                      p.head_dim - load_col);
      copy_tile_zfill(gmem_load, tVgV, load_thr.partition_D(sV), tVcV, seq.seqlen_k - n0 - load_row,
                      p.head_dim_v - load_col);
    }
    CUTE_UNROLL
    for (int it = 0; it < T::kStages - 1; ++it)
      if (it < num_iters) load_q_do(it);
    if constexpr (T::kOneDoStage) load_do(0);
    if constexpr (kTma) cutlass::arch::ClusterBarrier::wait(&smem.key_tile_full, key_tiles++ & 1);
  }

  typename T::TiledMmaSdP mma_sdp;
  typename T::TiledMmaKV mma_kv;
  typename T::TiledMmaV mma_dv;
  typename T::TiledMmaQ mma_dq;
  // Sliced for the shared-memory operands only, whose GMMA descriptors depend on the warpgroup alone. kTma: by its
  // first thread, read through a shuffle so that ptxas knows it warp-uniform and keeps the descriptors in uniform
  // registers (sliced by threadIdx.x it rebuilt each one in per-thread registers, moved over before every wgmma:
  // the hd128 plain step went from 828 to 609 SASS instructions with this and stmatrix, bench/RESULTS.md,
  // twenty-fifth session, run 4). The cp.async kernels keep the thread's slice: the same change made the hd64 one
  // spill 80-100 B where it spilled 8. CUTLASS's canonical_warp_group_idx() is the same shuffle of threadIdx.x, but
  // ptxas allocates the kernels differently with it (the hd64 TMA one spilling 16 B instead of 12), untimed.
  int const wg_thread = kTma ? __shfl_sync(0xffffffff, tid / 128, 0) * 128 : tid;
  auto thr_sdp = mma_sdp.get_thread_slice(wg_thread);
  auto thr_kv = mma_kv.get_thread_slice(wg_thread);
  auto thr_dv = mma_dv.get_thread_slice(wg_thread);
  auto thr_dq = mma_dq.get_thread_slice(wg_thread);
  Tensor acc_dk = partition_fragment_C(mma_kv, typename T::template TileGrad<kHeadDim>{});  // (MMA, MMA_N, MMA_D)
  Tensor acc_dv = partition_fragment_C(mma_dv, typename T::template TileGrad<kHeadDimV>{});
  clear(acc_dk);
  clear(acc_dv);

  auto sts_ds = make_tiled_copy_C(std::conditional_t<kTma, typename T::SmemStoreS, typename T::SmemStoreC>{}, mma_sdp);
  auto sts_ds_thr = sts_ds.get_thread_slice(tid);
  Tensor tdSsdS = sts_ds_thr.partition_D(sdSt);  // (CPY, CPY_N, CPY_M, stage)
  Tensor tPsPt = sts_ds_thr.partition_D(sPt);

  // Rows (keys) and columns (queries) of the S^T tile this thread holds: its base plus thread 0's compile-time
  // offsets, see TileCoords. The row terms are per query, i.e. per column here (kSwapKV: per row).
  using Coords = TileCoords<typename T::TiledMmaSdP, decltype(tile_st)>;
  Coords const s_base(mma_sdp, tile_st);
  auto const s_off = Coords::offsets(mma_sdp, tile_st);  // (rows, cols)
  auto const col_term = [&](int r, int c) { return kSwap ? get<0>(s_off(r, 0)) : get<1>(s_off(0, c)); };
  int const query_base = kSwap ? s_base.row_base : s_base.col_base;
  // Deterministic mode with turns: the turn word of the previous step's query tile, handed on under the next
  // step's first MMAs (or after the walk), where the release's fence overlaps the tensor cores.
  int* turn = nullptr;

  auto step = [&](int it, auto general) __attribute__((always_inline)) {
    constexpr bool kGeneral = decltype(general)::value;
    int h, m;
    blk.tile_of(it, h, m);
    int const m0 = m * kBlockM;
    int const stage = (ring + it) % T::kStages;
    int64_t const bh = (int64_t)b * p.nheads + h;
    int const do_stage = T::kOneDoStage ? 0 : stage;
    // The other dS stage may still be read by the other warpgroup's previous step (one stage: see kOneDoStage).
    int const ds_stage = T::kDsStages == 1 ? 0 : it & 1;
    // Issued right after this step's shared-memory barrier: every warp past it is done with step it - 1, whose
    // stage this refills with step it + kStages - 1.
    auto load_ahead = [&] {
      if (it + T::kStages - 1 < num_iters) load_q_do(it + T::kStages - 1);
    };

    cutlass::arch::ClusterBarrier::wait(&smem.full[stage], ((ring + it) / T::kStages) & 1);

    // kTma: the GMMA descriptors rebuilt each step from a shared-memory base the compiler cannot see through, so
    // that it does not hoist one per k-slice out of the walk into registers (ptxas then spilled them: 164 B at hd128).
    char* base = smem_raw;
    if constexpr (kTma) asm volatile("" : "+l"(base));
    auto& sm = *reinterpret_cast<typename T::SharedStorage*>(base);
    auto view = [&](auto* ptr, auto layout) { return make_tensor(make_smem_ptr(ptr), layout); };
    Element* const sm_p = sm.ds + (T::kPtInSmem ? cosize_v<typename T::SmemLayoutdSt> : 0);
    Tensor tQrdS = thr_dq.make_fragment_A(thr_dq.partition_A(view(sm.ds, typename T::SmemLayoutdS{})));
    Tensor sKt = view(sm.k, typename T::SmemLayoutKt{});
    // The S / dP products' operands, as (A, B): K and Q (S^T), or Q and K (kSwapKV S); stage-indexed ones take
    // `stage` in issue_sdp.
    auto const operands_sdp = [&](auto* keys, auto keys_layout, auto* rows, auto rows_layout) {
      if constexpr (kSwap)
        return cute::make_tuple(thr_sdp.make_fragment_A(thr_sdp.partition_A(view(rows, rows_layout))),
                                thr_sdp.make_fragment_B(thr_sdp.partition_B(view(keys, keys_layout))));
      else
        return cute::make_tuple(thr_sdp.make_fragment_A(thr_sdp.partition_A(view(keys, keys_layout))),
                                thr_sdp.make_fragment_B(thr_sdp.partition_B(view(rows, rows_layout))));
    };
    auto const s_ops = operands_sdp(sm.k, typename T::SmemLayoutKV{}, sm.q, typename T::SmemLayoutQs{});
    auto const dp_ops = operands_sdp(sm.v, typename T::SmemLayoutV{}, sm.dout, typename T::SmemLayoutdOs{});
    auto const issue_sdp = [&](auto const& ops, auto& acc, int st) __attribute__((always_inline)) {
      if constexpr (kSwap)
        warpgroup_issue<true, false>(mma_sdp, get<0>(ops)(_, _, _, st), get<1>(ops), acc);
      else
        warpgroup_issue<true, false>(mma_sdp, get<0>(ops), get<1>(ops)(_, _, _, st), acc);
    };
    // dV, dK: (A, B) = (P^T or dS^T, dO or Q read MN-major), or kSwapKV (dO^T or Q^T, P^T or dS^T read MN-major).
    auto const operands_grad = [&](auto& thr, auto* pds, auto* rows, auto rows_t_layout) {
      if constexpr (kSwap)
        return cute::make_tuple(thr.make_fragment_A(thr.partition_A(view(rows, rows_t_layout))),
                                thr.make_fragment_B(thr.partition_B(view(pds, typename T::SmemLayoutdSt{}))));
      else
        return cute::make_tuple(thr.make_fragment_A(thr.partition_A(view(pds, typename T::SmemLayoutdSt{}))),
                                thr.make_fragment_B(thr.partition_B(view(rows, rows_t_layout))));
    };
    auto const dv_ops = operands_grad(thr_dv, sm_p, sm.dout, typename T::SmemLayoutdOst{});
    auto const dk_ops = operands_grad(thr_kv, sm.ds, sm.q, typename T::SmemLayoutQst{});
    // dV or dK from shared memory alone (kSplitHeadDim, kSwapKV), or with P^T / dS^T from registers (a_regs).
    // st: the stage of the Q or dO rows read.
    auto const issue_grad = [&](auto& mma, auto const& ops, auto& acc, int st) __attribute__((always_inline)) {
      if constexpr (kSwap)
        warpgroup_issue<false, false>(mma, get<0>(ops)(_, _, _, st), get<1>(ops)(_, _, _, ds_stage), acc);
      else
        warpgroup_issue<false, false>(mma, get<0>(ops)(_, _, _, ds_stage), get<1>(ops)(_, _, _, st), acc);
    };
    auto const issue_grad_regs = [&](auto& mma, auto const& a_regs, auto const& ops, auto& acc, int st)
                                     __attribute__((always_inline)) {
      warpgroup_issue<false, true>(mma, a_regs, get<1>(ops)(_, _, _, st), acc);
    };

    Tensor acc_s = partition_fragment_C(mma_sdp, tile_st);   // (MMA, MMA_N, MMA_M)
    Tensor acc_dp = partition_fragment_C(mma_sdp, tile_st);  // (MMA, MMA_N, MMA_M)
    issue_sdp(s_ops, acc_s, stage);
    if constexpr (T::kOneDoStage) cutlass::arch::ClusterBarrier::wait(&smem.do_full, (ring + it) & 1);
    issue_sdp(dp_ops, acc_dp, do_stage);
    if constexpr (kWarpTurns) {
      if (p.dq_turns && it > 0) DqTurns::pass(turn, n_block + 1);
    }
    Tensor s = make_tensor(acc_s.data(), acc_as_rowcol(acc_s.layout()));     // (keys, queries), kSwapKV transposed
    Tensor ds = make_tensor(acc_dp.data(), acc_as_rowcol(acc_dp.layout()));  // (keys, queries), kSwapKV transposed
    // Row terms from the preprocess; rows past the sequence hold its padding (lse_log2 = +inf, D = 0), so P = 0.
    // Read into registers while the MMAs run: the waits below order every shared-memory access, and reads after
    // them left the exponentials waiting on their latency (ncu, bench/RESULTS.md thirteenth session).
    // Where a thread holds more than 16 query columns (128-row steps) they are read from shared memory where used.
    constexpr int kTerms = decltype(size<kSwap ? 0 : 1>(s))::value;  // this thread's queries
    constexpr bool kTermsInRegs = kTerms <= 16;
    float const* const rows = smem.rows + stage * 2 * kBlockM + query_base;
    float lse2_r[kTermsInRegs ? kTerms : 1], dsum_r[kTermsInRegs ? kTerms : 1];
    if constexpr (kTermsInRegs) {
      CUTE_UNROLL
      for (int t = 0; t < kTerms; ++t) {
        int const q = kSwap ? col_term(t, 0) : col_term(0, t);
        lse2_r[t] = rows[q], dsum_r[t] = rows[kBlockM + q];
      }
    }
    float const* const lse2 = kTermsInRegs ? lse2_r : rows;
    float const* const dsum = kTermsInRegs ? dsum_r : rows + kBlockM;
    auto const reg_term = [&](int r, int c) { return kTermsInRegs ? (kSwap ? r : c) : col_term(r, c); };
    if constexpr (kGeneral) {
      warpgroup_wait_for<0>(acc_s, acc_dp);
      grads_general(s, ds, lse2, dsum, reg_term, p.softcap_prescale, p.scale_log2,
                    [&] { apply_mask<!kSwap>(acc_s, mma_sdp, tile_st, blk.mask, m0, n0); });
    } else {
      // P^T's exponentials run while dP^T is still being computed.
      warpgroup_wait_for<1>(acc_s);
      probs_plain(s, lse2, reg_term, p.scale_log2);
      warpgroup_wait_for<0>(acc_dp);
      grads_plain(ds, s, dsum, reg_term);
    }
    // Register -> shared stores into this step's dS stage, picked at compile time so every address is a constant
    // offset (ptxas, hd128: 8 B of spills against 24 B with the stage as a runtime index).
    auto store_ds_stage = [&](auto const& r, auto& dst) __attribute__((always_inline)) {
      if constexpr (T::kDsStages == 1)
        cute::copy(sts_ds, sts_ds_thr.retile_S(r), dst(_, _, _, _0{}));
      else if (ds_stage)
        cute::copy(sts_ds, sts_ds_thr.retile_S(r), dst(_, _, _, _1{}));
      else
        cute::copy(sts_ds, sts_ds_thr.retile_S(r), dst(_, _, _, _0{}));
    };
    Tensor rP = convert_to<Element>(acc_s);
    Tensor rdS = convert_to<Element>(acc_dp);
    // dV first, then dQ's first chunk as soon as dS is in shared memory, then dK: dQ's atomics are issued while
    // the tensor cores work on dK.
    if constexpr (T::kPtInSmem) {
      store_ds_stage(rP, tPsPt);
      store_ds_stage(rdS, tdSsdS);
      cutlass::arch::fence_view_async_shared();
      mma_barrier();  // every warpgroup's P^T and dS^T columns (kSwapKV: P, dS keys) are in shared memory
      load_ahead();
      issue_grad(mma_dv, dv_ops, acc_dv, do_stage);
    } else {
      Tensor tVrP = make_tensor(rP.data(), acc_as_a_operand(rP.layout()));  // (MMA, MMA_N, MMA_M / 16)
      issue_grad_regs(mma_dv, tVrP, dv_ops, acc_dv, do_stage);
      store_ds_stage(rdS, tdSsdS);
      cutlass::arch::fence_view_async_shared();
      mma_barrier();  // every warpgroup's dS^T rows are in shared memory, for wgmma
      load_ahead();
    }

    float* const dq_tile = dq_slot + (bh * p.seqlen_q_rounded + m0) * kHeadDim;  // this query tile's chunks
    auto tile_dq = Shape<Int<kBlockM>, Int<T::kDqCols>>{};
    auto dq_chunk = [&](int c, auto issue_dk) __attribute__((always_inline)) {
      Tensor sKt_c = local_tile(sKt, Shape<Int<T::kDqCols>, Int<kBlockN>>{}, make_coord(c, 0));  // (Dc, kBlockN)
      Tensor tQrKt = thr_dq.make_fragment_B(thr_dq.partition_B(sKt_c));  // (MMA, MMA_Dc, MMA_N)
      Tensor acc_dq = partition_fragment_C(mma_dq, tile_dq);              // (MMA, MMA_M, MMA_Dc / warpgroups)
      warpgroup_issue<true, false>(mma_dq, tQrdS(_, _, _, ds_stage), tQrKt, acc_dq);
      if constexpr (decltype(issue_dk)::value) {
        if constexpr (T::kPtInSmem) {
          issue_grad(mma_kv, dk_ops, acc_dk, stage);
        } else {
          Tensor tKrdS = make_tensor(rdS.data(), acc_as_a_operand(rdS.layout()));
          issue_grad_regs(mma_kv, tKrdS, dk_ops, acc_dk, stage);
        }
        warpgroup_wait_for<1>(acc_dv, acc_dq, rP);
        if constexpr (T::kOneDoStage) {
          mma_barrier();  // every warpgroup's dV and dQ are done: dO's stage and the dS stage are free
          if (it + 1 < num_iters) load_do(it + 1);
        }
        // The first chunk's atomics wait for this query tile's turn, under the dK product.
        if constexpr (kWarpTurns) {
          if (p.dq_turns) {
            turn = DqTurns::await<kBlockM, T::kWarps>(p, blk, bh, m, n_block);
          }
        }
      } else {
        warpgroup_wait_for<0>(acc_dq);
      }
      if constexpr (kWs) {
        // Into the writer's buffer once it has read the last one, with the message; the writer adds it.
        static_assert(T::kDqChunks == 1, "one dQ chunk per step");
        auto& ws = *reinterpret_cast<DqWsStorage<T>*>(smem_raw);
        cutlass::arch::ClusterBarrier::wait(&ws.dq_empty, (dq_msgs++ & 1) ^ 1);
        float* const dst = ws.dq + T::dq_frag_offset(0, tid);
        CUTE_UNROLL
        for (int i = 0; i < size(acc_dq); i += 2)
          *reinterpret_cast<float2*>(dst + T::dq_frag_offset(i, 0)) = make_float2(acc_dq(i), acc_dq(i + 1));
        if (tid == 0) {
          if constexpr (kTurns)
            ws.msg = DqMessage{dq_tile, DqTurns::word<kBlockM, T::kWarps>(p, bh, m0, n_block),
                               DqTurns::awaited(p, blk, m, n_block), n_block + 1};
          else
            ws.msg = DqMessage{dq_tile, nullptr, 0, 0};
        }
        cutlass::arch::fence_view_async_shared();
        cutlass::arch::ClusterBarrier::arrive(&ws.dq_full);
      } else {
        atomic_add_dq_tile<T>(dq_tile + c * kBlockM * T::kDqCols, acc_dq, opaque_thread_index());
      }
    };
    dq_chunk(0, cute::true_type{});
    warpgroup_wait_for<0>(acc_dk, rdS);
    CUTE_UNROLL
    for (int c = 1; c < T::kDqChunks; ++c) dq_chunk(c, cute::false_type{});
  };
  for (int it = 0; it < num_general; ++it) step(it, cute::true_type{});
  for (int it = num_general; it < num_iters; ++it) step(it, cute::false_type{});

  if constexpr (kWarpTurns) {
    if (p.dq_turns && num_iters > 0) DqTurns::pass(turn, n_block + 1);
  }
  ring += num_iters;
  store_dk_dv<T, T::kSwapKV>(p, blk, mma_kv, mma_dv, acc_dk, acc_dv, sK, sV, mma_barrier);
  // The next key tile's TMA copies overwrite K's and V's shared memory, which the epilogue has just written and read
  // through the generic proxy: fenced here, ordered by the CTA barrier after this key tile (for_each_key_tile).
  if constexpr (kTma) cutlass::arch::fence_view_async_shared();
}

// Grid and deterministic mode: for_each_key_tile (common/bwd_epilogue.cuh). Deterministic mode runs a kernel of
// its own (kTurns), so the default one carries no turn code.
template <class T, bool kTma, bool kTurns>
__global__ void __launch_bounds__(T::kThreads, 1) bwd_kernel(__grid_constant__ BwdParams<T> const params) {
#if defined(CUTE_ARCH_MMA_SM90A_ENABLED)
  extern __shared__ __align__(1024) char smem_raw[];
  auto& smem = *reinterpret_cast<typename T::SharedStorage*>(smem_raw);
  if (threadIdx.x == 0) {
    CUTE_UNROLL
    for (int s = 0; s < T::kStages; ++s) cutlass::arch::ClusterBarrier::init(&smem.full[s], kTma ? 1 : T::kThreads);
    cutlass::arch::ClusterBarrier::init(&smem.key_tile_full, 1);
    if constexpr (T::kOneDoStage) cutlass::arch::ClusterBarrier::init(&smem.do_full, kTma ? 1 : T::kThreads);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  int ring = 0, key_tiles = 0, dq_msgs = 0;
  for_each_key_tile<T::kBlockN, kTurns>(params.p, [&](int n, float* dq_slot) {
    bwd_key_tile<T, kTma, kTurns>(params, n, dq_slot, ring, key_tiles, dq_msgs);
  });
#else
  __trap();  // compiled for sm_90a only (CMakeLists.txt); dispatch never launches it elsewhere
#endif
}

// The writer thread of bwd_ws_kernel: for each message, adds the buffer into dQ with one bulk reduction and frees
// the buffer once read. kTurns: it first waits for the query tile's turn, and hands the turn on once the addition
// is done; only this thread waits on the turn and on the GPU-scope release, the MMA threads only for a free buffer.
template <class T, bool kTurns>
__device__ __forceinline__ void bwd_dq_writer(DqWsStorage<T>& smem) {
  for (int k = 0;; ++k) {
    cutlass::arch::ClusterBarrier::wait(&smem.dq_full, k & 1);
    DqMessage const msg = smem.msg;
    if (msg.dst == nullptr) break;
    if constexpr (kTurns) {
      DqTurns::poll(msg.word, msg.wait);
      bulk_fence_global();
    }
    bulk_reduce_add(msg.dst, smem.dq, T::kBlockM * T::kDqCols * sizeof(float));
    bulk_commit();
    bulk_wait_read();
    cutlass::arch::ClusterBarrier::arrive(&smem.dq_empty);
    if constexpr (kTurns) {
      bulk_wait_done();
      bulk_fence_global();
      DqTurns::release(msg.word, msg.pass);
    }
  }
  bulk_wait_done();
}

// TMA loads where a float32 dQ buffer fits beside the tile's shared memory (kDqWriter): the MMA warpgroups of
// bwd_kernel plus a warpgroup whose first thread adds dQ (bwd_dq_writer); setmaxnreg moves that warpgroup's
// registers to the MMA threads. kTurns: deterministic mode.
template <class T, bool kTurns>
__global__ void __launch_bounds__(T::kThreads + 128, 1) bwd_ws_kernel(__grid_constant__ BwdParams<T> const params) {
#if defined(CUTE_ARCH_MMA_SM90A_ENABLED)
  extern __shared__ __align__(1024) char smem_raw[];
  auto& smem = *reinterpret_cast<DqWsStorage<T>*>(smem_raw);
  if (threadIdx.x == 0) {
    CUTE_UNROLL
    for (int s = 0; s < T::kStages; ++s) cutlass::arch::ClusterBarrier::init(&smem.full[s], 1);
    cutlass::arch::ClusterBarrier::init(&smem.key_tile_full, 1);
    if constexpr (T::kOneDoStage) cutlass::arch::ClusterBarrier::init(&smem.do_full, 1);
    cutlass::arch::ClusterBarrier::init(&smem.dq_full, T::kThreads);
    cutlass::arch::ClusterBarrier::init(&smem.dq_empty, 1);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x >= T::kThreads) {
    cutlass::arch::warpgroup_reg_dealloc<24>();
    if (threadIdx.x == T::kThreads) bwd_dq_writer<T, kTurns>(smem);
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<240>();
  int ring = 0, key_tiles = 0, dq_msgs = 0;
  for_each_key_tile<T::kBlockN, kTurns>(
      params.p,
      [&](int n, float* dq_slot) {
        bwd_key_tile<T, true, kTurns, true>(params, n, dq_slot, ring, key_tiles, dq_msgs);
      },
      SyncMmaThreads<T>{});
  // The message that ends the writer.
  cutlass::arch::ClusterBarrier::wait(&smem.dq_empty, (dq_msgs & 1) ^ 1);
  if (threadIdx.x == 0) smem.msg.dst = nullptr;
  cutlass::arch::ClusterBarrier::arrive(&smem.dq_full);
#else
  __trap();
#endif
}

}  // namespace flashcute::sm90
