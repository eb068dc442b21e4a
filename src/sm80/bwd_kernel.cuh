// Portable backward mainloop (mma.sync + cp.async + ldmatrix). One CTA owns a kBlockN tile of keys of one K/V head
// and walks the query tiles that can see it (common/bwd_block.cuh); per query tile it recomputes P from the
// forward's lse and adds
//   dV += P^T dO,  dK += dS^T Q  (registers, whole loop)   and   dQ += dS K  (float32 workspace, per tile)
// with dS = P * (dP - D), dP = dO V^T (DESIGN.md section 2). Softmax scale: see bwd_postprocess.cuh.
#pragma once

#include <cute/tensor.hpp>

#include "common/bwd_atomics.cuh"
#include "common/bwd_block.cuh"
#include "common/bwd_dq_order.cuh"
#include "common/bwd_epilogue.cuh"
#include "common/bwd_grads.cuh"
#include "common/cute_utils.cuh"
#include "common/kernel_params.h"
#include "common/mask_apply.cuh"
#include "sm80/bwd_traits.cuh"

namespace flashcute::sm80 {

// A tensor of the given shape with a plain layout, only for sizing register fragments of transposed operands.
template <class Element, class Shape_>
CUTE_DEVICE auto shape_tensor(Shape_ const& shape) {
  return make_tensor(make_smem_ptr(static_cast<Element*>(nullptr)), make_layout(shape));
}

// One key tile (n_block) of one grid column: dK/dV of its keys, and its share of dQ added into dq_slot.
template <class T>
__device__ __forceinline__ void bwd_key_tile(BwdKernelParams const& p, int const n_block, float* const dq_slot) {
  using Element = typename T::Element;
  constexpr int kBlockM = T::kBlockM;
  constexpr int kBlockN = T::kBlockN;
  constexpr int kHeadDim = T::kHeadDim;
  constexpr bool kDoubleQ = T::kDoubleBufferQ;
  constexpr bool kDoubleDo = T::kDoubleBufferDo;  // implies kDoubleQ

  extern __shared__ __align__(128) char smem_raw[];
  auto& smem = *reinterpret_cast<typename T::SharedStorage*>(smem_raw);
  int const tid = threadIdx.x;

  BwdBlock<kBlockM, kBlockN> blk;
  if (!blk.init(p, n_block)) return;
  SeqInfo const& seq = blk.seq;
  int const b = blk.b, n0 = blk.n0, num_iters = blk.num_iters, num_general = blk.num_general;

  auto tile_q = Shape<Int<kBlockM>, Int<kHeadDim>>{};
  auto tile_kv = Shape<Int<kBlockN>, Int<kHeadDim>>{};
  auto tile_s = Shape<Int<kBlockM>, Int<kBlockN>>{};

  Element const* k_ptr = blk.template k<Element>(p);
  Element const* v_ptr = blk.template v<Element>(p);
  Element const* q_base = blk.template q<Element>(p);
  Element const* do_base = blk.template dout<Element>(p);
  Tensor mK = make_tensor(make_gmem_ptr(k_ptr), make_shape(seq.seqlen_k, Int<kHeadDim>{}),
                          make_stride(p.k_row_stride, _1{}));  // (Sk, D)
  Tensor mV = make_tensor(make_gmem_ptr(v_ptr), make_shape(seq.seqlen_k, Int<kHeadDim>{}),
                          make_stride(p.v_row_stride, _1{}));  // (Sk, Dv)
  Tensor gK = local_tile(mK, tile_kv, make_coord(n_block, 0));  // (kBlockN, D)
  Tensor gV = local_tile(mV, tile_kv, make_coord(n_block, 0));  // (kBlockN, Dv)

  Tensor sK = make_tensor(make_smem_ptr(smem.k), typename T::SmemLayoutKV{});       // (kBlockN, D)
  Tensor sV = make_tensor(make_smem_ptr(smem.v()), typename T::SmemLayoutKV{});     // (kBlockN, Dv)
  Tensor sKt = make_tensor(make_smem_ptr(smem.k), typename T::SmemLayoutKt{});      // (D, kBlockN)
  Tensor sP = make_tensor(make_smem_ptr(smem.p()), typename T::SmemLayoutPdS{});      // (kBlockM, kBlockN)
  Tensor sPt = make_tensor(make_smem_ptr(smem.p()), typename T::SmemLayoutPdSt{});    // (kBlockN, kBlockM)
  Tensor sdS = make_tensor(make_smem_ptr(smem.ds()), typename T::SmemLayoutPdS{});    // (kBlockM, kBlockN)
  Tensor sdSt = make_tensor(make_smem_ptr(smem.ds()), typename T::SmemLayoutPdSt{});  // (kBlockN, kBlockM)

  typename T::GmemLoad gmem_load;
  auto load_thr = gmem_load.get_thread_slice(tid);
  // Copy predicates: thread 0's coordinates against bounds shifted by this thread's base (copy_base).
  Tensor tQcQ = copy_offsets(gmem_load, tile_q);     // (CPY, CPY_M, CPY_D)
  Tensor tKVcKV = copy_offsets(gmem_load, tile_kv);  // (CPY, CPY_N, CPY_D)
  int load_row, load_col;
  copy_base(load_thr, tile_q, load_row, load_col);

  // Q or dO rows of flat iteration `it` into a (kBlockM, D) smem tile, zero-filled past the sequence and head dim.
  auto load_q_rows = [&](Element* dst, Element const* base, int64_t head_stride, int64_t row_stride, int cols,
                         int it) {
    int h, m;
    blk.tile_of(it, h, m);
    Tensor mX = make_tensor(make_gmem_ptr(base + h * head_stride), make_shape(seq.seqlen_q, Int<kHeadDim>{}),
                            make_stride(row_stride, _1{}));  // (Sq, D)
    Tensor tXgX = load_thr.partition_S(local_tile(mX, tile_q, make_coord(m, 0)));
    Tensor tXsX = load_thr.partition_D(make_tensor(make_smem_ptr(dst), typename T::SmemLayoutQ{}));
    copy_tile_zfill(gmem_load, tXgX, tXsX, tQcQ, seq.seqlen_q - m * kBlockM - load_row, cols - load_col);
  };
  // Q of flat iteration `it`, with the lse_log2 and D of its rows.
  auto load_q = [&](int it, int stage) {
    load_q_rows(smem.q + stage * T::kQElems, q_base, p.q_head_stride, p.q_row_stride, p.head_dim, it);
    int h, m;
    blk.tile_of(it, h, m);
    load_row_terms<kBlockM>(p, b, h, m, smem.rows + stage * 2 * kBlockM);
  };
  auto load_do = [&](int it, int stage) {
    load_q_rows(smem.dout + stage * T::kQElems, do_base, p.dout_head_stride, p.dout_row_stride, p.head_dim_v, it);
  };

  if (num_iters > 0) {
    Tensor tKgK = load_thr.partition_S(gK);  // (CPY, CPY_N, CPY_D)
    Tensor tKsK = load_thr.partition_D(sK);
    Tensor tVgV = load_thr.partition_S(gV);
    Tensor tVsV = load_thr.partition_D(sV);
    copy_tile_zfill(gmem_load, tKgK, tKsK, tKVcKV, seq.seqlen_k - n0 - load_row, p.head_dim - load_col);
    copy_tile_zfill(gmem_load, tVgV, tVsV, tKVcKV, seq.seqlen_k - n0 - load_row, p.head_dim_v - load_col);
    load_q(0, 0);
    load_do(0, 0);
    cp_async_fence();
  }

  typename T::TiledMmaSdP mma_sdp;
  typename T::TiledMmaKV mma_kv;
  typename T::TiledMmaQ mma_q;
  auto sdp_thr = mma_sdp.get_thread_slice(tid);
  auto kv_thr = mma_kv.get_thread_slice(tid);
  auto q_thr = mma_q.get_thread_slice(tid);

  // smem -> register copies: plain ldmatrix where the operand is K-major in smem, .trans where it is stored the
  // other way round (every operand of the dK/dV products, and K in dQ = dS K).
  auto ldsm_sdp_a = make_tiled_copy_A(typename T::SmemLoadN{}, mma_sdp);
  auto ldsm_sdp_b = make_tiled_copy_B(typename T::SmemLoadN{}, mma_sdp);
  auto ldsm_kv_a = make_tiled_copy_A(typename T::SmemLoadT{}, mma_kv);
  auto ldsm_kv_b = make_tiled_copy_B(typename T::SmemLoadT{}, mma_kv);
  auto ldsm_q_a = make_tiled_copy_A(typename T::SmemLoadN{}, mma_q);
  auto ldsm_q_b = make_tiled_copy_B(typename T::SmemLoadT{}, mma_q);

  Tensor tSsK = ldsm_sdp_b.get_thread_slice(tid).partition_S(sK);     // S = Q K^T
  Tensor tPsV = ldsm_sdp_b.get_thread_slice(tid).partition_S(sV);
  Tensor tVsPt = ldsm_kv_a.get_thread_slice(tid).partition_S(sPt);    // dV = P^T dO
  Tensor tKsdSt = ldsm_kv_a.get_thread_slice(tid).partition_S(sdSt);  // dK = dS^T Q
  Tensor tQsdS = ldsm_q_a.get_thread_slice(tid).partition_S(sdS);     // dQ = dS K

  Tensor tSrQ = sdp_thr.partition_fragment_A(shape_tensor<Element>(tile_q));    // (MMA, MMA_M, MMA_D)
  Tensor tSrK = sdp_thr.partition_fragment_B(shape_tensor<Element>(tile_kv));   // (MMA, MMA_N, MMA_D)
  Tensor tPrdO = sdp_thr.partition_fragment_A(shape_tensor<Element>(tile_q));   // (MMA, MMA_M, MMA_Dv)
  Tensor tPrV = sdp_thr.partition_fragment_B(shape_tensor<Element>(tile_kv));   // (MMA, MMA_N, MMA_Dv)
  Tensor tVrPt = kv_thr.partition_fragment_A(
      shape_tensor<Element>(Shape<Int<kBlockN>, Int<kBlockM>>{}));  // (MMA, MMA_N, MMA_M)
  Tensor tVrdOt = kv_thr.partition_fragment_B(
      shape_tensor<Element>(Shape<Int<kHeadDim>, Int<kBlockM>>{}));  // (MMA, MMA_Dv, MMA_M)
  Tensor tKrdSt = kv_thr.partition_fragment_A(shape_tensor<Element>(Shape<Int<kBlockN>, Int<kBlockM>>{}));
  Tensor tKrQt = kv_thr.partition_fragment_B(shape_tensor<Element>(Shape<Int<kHeadDim>, Int<kBlockM>>{}));
  Tensor tQrdS = q_thr.partition_fragment_A(shape_tensor<Element>(tile_s));  // (MMA, MMA_M, MMA_N)
  auto tile_dq = Shape<Int<kBlockM>, Int<T::kDqCols>>{};
  Tensor tQrKt = q_thr.partition_fragment_B(
      shape_tensor<Element>(Shape<Int<T::kDqCols>, Int<kBlockN>>{}));  // (MMA, MMA_Dc, MMA_N)

  if constexpr (T::kVInRegs) {
    // V into registers for the whole key tile; the first step's barrier then lets P and dS overwrite its bytes.
    if (num_iters > 0) {
      cp_async_wait<0>();
      __syncthreads();
      cute::copy(ldsm_sdp_b, tPsV, ldsm_sdp_b.get_thread_slice(tid).retile_D(tPrV));
    }
  }

  Tensor acc_dk = partition_fragment_C(mma_kv, tile_kv);  // (MMA, MMA_N, MMA_D)
  Tensor acc_dv = partition_fragment_C(mma_kv, tile_kv);  // (MMA, MMA_N, MMA_Dv)
  clear(acc_dk);
  clear(acc_dv);

  auto sts_sdp = make_tiled_copy_C(typename T::SmemStoreC{}, mma_sdp);
  auto sts_sdp_thr = sts_sdp.get_thread_slice(tid);
  Tensor tPsP = sts_sdp_thr.partition_D(sP);
  Tensor tPsdS = sts_sdp_thr.partition_D(sdS);

  // Rows of the S tile this thread holds: its base row plus thread 0's (compile-time) offsets, see TileCoords.
  TileCoords<typename T::TiledMmaSdP, decltype(tile_s)> const s_base(mma_sdp, tile_s);
  auto const s_off = TileCoords<typename T::TiledMmaSdP, decltype(tile_s)>::offsets(mma_sdp, tile_s);  // (rows, cols)
  // The row terms of element (r, c) sit at its row (common/bwd_grads.cuh).
  auto const row_term = [&](int r, int) { return get<0>(s_off(r, 0)); };

  // Deterministic mode with turns: the turn word of the previous step's query tile, handed on after the next step's
  // first product (or after the walk), by when this step's atomics have mostly landed.
  int* turn = nullptr;

  auto step = [&](int it, auto general) __attribute__((always_inline)) {
    constexpr bool kGeneral = decltype(general)::value;
    int h, m;
    blk.tile_of(it, h, m);
    int const m0 = m * kBlockM;
    int const stage = kDoubleQ ? (it & 1) : 0;
    int const do_stage = kDoubleDo ? (it & 1) : 0;
    auto pass_turn = [&] {
      if constexpr (T::kDqTurns) {
        if (p.dq_turns && it > 0) DqTurns::pass(turn, n_block + 1);
      }
    };
    int64_t const bh = (int64_t)b * p.nheads + h;

    // Q/dO (and K/V) of this tile have landed, and every warp is done with the previous tile's P, dS and Q
    // stage, so the other Q stage may be refilled and P, dS overwritten.
    cp_async_wait<0>();
    __syncthreads();
    if constexpr (kDoubleQ) {
      if (it + 1 < num_iters) {
        load_q(it + 1, stage ^ 1);
        if constexpr (kDoubleDo) load_do(it + 1, do_stage ^ 1);
        cp_async_fence();
      }
    }
    Tensor sQ = make_tensor(make_smem_ptr(smem.q + stage * T::kQElems), typename T::SmemLayoutQ{});    // (kBlockM, D)
    Tensor sQt = make_tensor(make_smem_ptr(smem.q + stage * T::kQElems), typename T::SmemLayoutQt{});  // (D, kBlockM)
    Tensor tSsQ = ldsm_sdp_a.get_thread_slice(tid).partition_S(sQ);
    Tensor tKsQt = ldsm_kv_b.get_thread_slice(tid).partition_S(sQt);
    // (kBlockM, Dv)
    Tensor sdO = make_tensor(make_smem_ptr(smem.dout + do_stage * T::kQElems), typename T::SmemLayoutQ{});
    Tensor sdOt = make_tensor(make_smem_ptr(smem.dout + do_stage * T::kQElems), typename T::SmemLayoutQt{});
    Tensor tPsdO = ldsm_sdp_a.get_thread_slice(tid).partition_S(sdO);    // dP = dO V^T
    Tensor tVsdOt = ldsm_kv_b.get_thread_slice(tid).partition_S(sdOt);  // dV = P^T dO

    // Row terms from the preprocess; rows past the sequence hold its padding (lse_log2 = +inf, D = 0), so P = 0
    // there.
    float const* lse2 = smem.rows + stage * 2 * kBlockM + s_base.row_base;
    float const* dsum = lse2 + kBlockM;
    Tensor acc_s = partition_fragment_C(mma_sdp, tile_s);   // (MMA, MMA_M, MMA_N)
    Tensor acc_dp = partition_fragment_C(mma_sdp, tile_s);  // (MMA, MMA_M, MMA_N)
    auto gemm_dp = [&] {  // acc_dp += dO V^T
      if constexpr (T::kVInRegs) {
        gemm_sr(acc_dp, tPrdO, tPrV, tPsdO, mma_sdp, ldsm_sdp_a);
      } else {
        gemm_ss(acc_dp, tPrdO, tPrV, tPsdO, tPsV, mma_sdp, ldsm_sdp_a, ldsm_sdp_b);
      }
    };
    Tensor s = make_tensor(acc_s.data(), acc_as_rowcol(acc_s.layout()));     // (rows, cols)
    Tensor ds = make_tensor(acc_dp.data(), acc_as_rowcol(acc_dp.layout()));  // (rows, cols)
    if constexpr (kGeneral) {
      // dP before S: the softcap's derivative then folds into dS as S is produced, with no copy of S kept alive
      // across a GEMM.
      clear(acc_dp);
      gemm_dp();
      pass_turn();
      clear(acc_s);
      gemm_ss(acc_s, tSrQ, tSrK, tSsQ, tSsK, mma_sdp, ldsm_sdp_a, ldsm_sdp_b);
      grads_general(s, ds, lse2, dsum, row_term, p.softcap_prescale, p.scale_log2,
                    [&] { apply_mask(acc_s, mma_sdp, tile_s, blk.mask, m0, n0); });
      Tensor rP = convert_to<Element>(acc_s);
      Tensor rdS = convert_to<Element>(acc_dp);
      cute::copy(sts_sdp, sts_sdp_thr.retile_S(rP), tPsP);
      cute::copy(sts_sdp, sts_sdp_thr.retile_S(rdS), tPsdS);
    } else {
      // S before dP (no softcap here): P's exponentials and its store to shared memory can then overlap the dP
      // product's MMAs.
      clear(acc_s);
      gemm_ss(acc_s, tSrQ, tSrK, tSsQ, tSsK, mma_sdp, ldsm_sdp_a, ldsm_sdp_b);
      pass_turn();
      probs_plain(s, lse2, row_term, p.scale_log2);
      Tensor rP = convert_to<Element>(acc_s);
      cute::copy(sts_sdp, sts_sdp_thr.retile_S(rP), tPsP);
      clear(acc_dp);
      gemm_dp();
      grads_plain(ds, s, dsum, row_term);
      Tensor rdS = convert_to<Element>(acc_dp);
      cute::copy(sts_sdp, sts_sdp_thr.retile_S(rdS), tPsdS);
    }
    __syncthreads();  // P and dS are read by other warps' dV, dK and dQ products

    gemm_ss(acc_dv, tVrPt, tVrdOt, tVsPt, tVsdOt, mma_kv, ldsm_kv_a, ldsm_kv_b);
    if constexpr (!kDoubleQ) gemm_ss(acc_dk, tKrdSt, tKrQt, tKsdSt, tKsQt, mma_kv, ldsm_kv_a, ldsm_kv_b);
    if (!kDoubleDo && it + 1 < num_iters) {
      // Every warp is done reading dO (and the single Q stage): refill them under the dQ product.
      __syncthreads();
      load_do(it + 1, 0);
      if constexpr (!kDoubleQ) load_q(it + 1, 0);
      cp_async_fence();
    }

    float* const dq_tile = dq_slot + (bh * p.seqlen_q_rounded + m0) * kHeadDim;  // this query tile's chunks
    CUTE_UNROLL
    for (int c = 0; c < T::kDqChunks; ++c) {
      Tensor acc_dq = partition_fragment_C(mma_q, tile_dq);  // (MMA, MMA_M, MMA_Dc)
      clear(acc_dq);
      Tensor sKt_c = local_tile(sKt, Shape<Int<T::kDqCols>, Int<kBlockN>>{}, make_coord(c, 0));  // (Dc, kBlockN)
      Tensor tQsKt = ldsm_q_b.get_thread_slice(tid).partition_S(sKt_c);
      gemm_ss(acc_dq, tQrdS, tQrKt, tQsdS, tQsKt, mma_q, ldsm_q_a, ldsm_q_b);
      if constexpr (T::kDqTurns) {
        // The first chunk's atomics wait for this query tile's turn.
        if (p.dq_turns && c == 0) {
          turn = DqTurns::await<kBlockM, T::kWarps>(p, blk, bh, m, n_block);
        }
      }
      atomic_add_dq_tile<T>(dq_tile + c * kBlockM * T::kDqCols, acc_dq);
    }
    if constexpr (kDoubleQ) gemm_ss(acc_dk, tKrdSt, tKrQt, tKsdSt, tKsQt, mma_kv, ldsm_kv_a, ldsm_kv_b);
  };
  for (int it = 0; it < num_general; ++it) step(it, cute::true_type{});
  for (int it = num_general; it < num_iters; ++it) step(it, cute::false_type{});
  if constexpr (T::kDqTurns) {
    if (p.dq_turns && num_iters > 0) DqTurns::pass(turn, n_block + 1);
  }

  store_dk_dv<T>(p, blk, mma_kv, mma_kv, acc_dk, acc_dv, sK, sV);
}

// Grid and deterministic mode: for_each_key_tile (common/bwd_epilogue.cuh).
template <class T>
__global__ void __launch_bounds__(T::kThreads, 1) bwd_kernel(__grid_constant__ BwdKernelParams const p) {
  for_each_key_tile<T::kBlockN, T::kDqTurns>(p, [&](int n, float* dq_slot) { bwd_key_tile<T>(p, n, dq_slot); });
}

}  // namespace flashcute::sm80
