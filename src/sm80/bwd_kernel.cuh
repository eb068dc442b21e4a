// Portable backward mainloop (mma.sync + cp.async + ldmatrix). One CTA owns a kBlockN tile of keys of one K/V head
// and walks the query tiles that can see it; per query tile it recomputes P from the forward's lse and adds
//   dV += P^T dO,  dK += dS^T Q  (registers, whole loop)   and   dQ += dS K  (float32 workspace, per tile)
// with dS = P * (dP - D), dP = dO V^T (DESIGN.md section 2). Softmax scale: see bwd_postprocess.cuh.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/fast_math.h>

#include "common/bwd_atomics.cuh"
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

  extern __shared__ __align__(128) char smem_raw[];
  auto& smem = *reinterpret_cast<typename T::SharedStorage*>(smem_raw);
  int const tid = threadIdx.x;

  int const b = blockIdx.z;
  SeqInfo const seq = SeqInfo::make(p, b);
  // Every key row the sequence owns gets a gradient; rows past seqused_k (seq.seqlen_k) get exact zeros.
  int const key_rows = p.cu_seqlens_k ? p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b] : seq.seqlen_k;
  int const n0 = n_block * kBlockN;
  if (n0 >= key_rows) return;

  // GQA: nondeterministic CTAs take one query head each and add dK/dV into float32 accumulators; deterministic
  // ones take the whole group in order, so dK/dV are summed in registers and need no ordering of their own.
  bool const gqa = p.nheads != p.nheads_kv;
  bool const group_in_cta = gqa && p.deterministic;
  int const h_kv = group_in_cta ? blockIdx.y : blockIdx.y / p.kv_group;
  int const h_first = group_in_cta ? blockIdx.y * p.kv_group : blockIdx.y;
  int const num_heads = group_in_cta ? p.kv_group : 1;

  Mask const mask = seq.mask(p);
  int m_begin = 0, num_m = 0;
  if (n0 < seq.seqlen_k) {
    int const q_lo = mask.query_begin(n0);
    int const q_hi = mask.query_end(min(n0 + kBlockN, seq.seqlen_k));
    if (q_hi > q_lo) m_begin = q_lo / kBlockM, num_m = (q_hi + kBlockM - 1) / kBlockM - m_begin;
  }
  // One flat walk over (head, query tile) pairs, so the Q/dO prefetch crosses head boundaries like tile ones.
  int const num_iters = num_m * num_heads;
  // Query tiles [m_plain_lo, m_plain_hi) see every key of this tile. Without softcap they take the plain step (no
  // mask, no softcap code) in a loop of their own after the general ones, as in the forward (see fwd_kernel.cuh
  // for the measurements behind two loops in sequence). The order of query tiles changes no bits: in
  // deterministic mode each dQ float still receives its additions in key-tile order.
  int m_plain_lo = m_begin, m_plain_hi = m_begin;
  if (p.softcap_prescale == 0.f)
    mask.full_query_tiles(n0, n0 + kBlockN, kBlockM, m_begin, m_begin + num_m, m_plain_lo, m_plain_hi);
  int const num_m_plain = m_plain_hi - m_plain_lo;
  int const num_m_general = num_m - num_m_plain;
  int const num_general = num_m_general * num_heads;
  // Flat iteration -> (head, query tile): the general tiles of every head (those below the plain range, then
  // those above it), then the plain ones.
  cutlass::FastDivmod const per_head_general(max(num_m_general, 1)), per_head_plain(max(num_m_plain, 1));
  auto tile_of = [&](int it, int& h, int& m) {
    bool const general = it < num_general;
    int const j = general ? it : it - num_general;
    int dh, k;
    if (general)
      per_head_general(dh, k, j);
    else
      per_head_plain(dh, k, j);
    h = h_first + dh;
    m = !general ? m_plain_lo + k : k < m_plain_lo - m_begin ? m_begin + k : m_plain_hi + (k - (m_plain_lo - m_begin));
  };

  auto tile_q = Shape<Int<kBlockM>, Int<kHeadDim>>{};
  auto tile_kv = Shape<Int<kBlockN>, Int<kHeadDim>>{};
  auto tile_s = Shape<Int<kBlockM>, Int<kBlockN>>{};

  Element const* k_ptr = static_cast<Element const*>(p.k) + seq.k_offset(p, b, p.k_batch_stride, p.k_row_stride) +
                         h_kv * p.k_head_stride;
  Element const* v_ptr = static_cast<Element const*>(p.v) + seq.k_offset(p, b, p.v_batch_stride, p.v_row_stride) +
                         h_kv * p.v_head_stride;
  Element const* q_base = static_cast<Element const*>(p.q) + seq.q_offset(p, b, p.q_batch_stride, p.q_row_stride);
  Element const* do_base =
      static_cast<Element const*>(p.dout) + seq.q_offset(p, b, p.dout_batch_stride, p.dout_row_stride);
  Tensor mK = make_tensor(make_gmem_ptr(k_ptr), make_shape(seq.seqlen_k, Int<kHeadDim>{}),
                          make_stride(p.k_row_stride, _1{}));  // (Sk, D)
  Tensor mV = make_tensor(make_gmem_ptr(v_ptr), make_shape(seq.seqlen_k, Int<kHeadDim>{}),
                          make_stride(p.v_row_stride, _1{}));  // (Sk, Dv)
  Tensor gK = local_tile(mK, tile_kv, make_coord(n_block, 0));  // (kBlockN, D)
  Tensor gV = local_tile(mV, tile_kv, make_coord(n_block, 0));  // (kBlockN, Dv)

  Tensor sK = make_tensor(make_smem_ptr(smem.k), typename T::SmemLayoutKV{});       // (kBlockN, D)
  Tensor sV = make_tensor(make_smem_ptr(smem.v), typename T::SmemLayoutKV{});       // (kBlockN, Dv)
  Tensor sKt = make_tensor(make_smem_ptr(smem.k), typename T::SmemLayoutKt{});      // (D, kBlockN)
  Tensor sdO = make_tensor(make_smem_ptr(smem.dout), typename T::SmemLayoutQ{});    // (kBlockM, Dv)
  Tensor sdOt = make_tensor(make_smem_ptr(smem.dout), typename T::SmemLayoutQt{});  // (Dv, kBlockM)
  Tensor sP = make_tensor(make_smem_ptr(smem.p), typename T::SmemLayoutPdS{});      // (kBlockM, kBlockN)
  Tensor sPt = make_tensor(make_smem_ptr(smem.p), typename T::SmemLayoutPdSt{});    // (kBlockN, kBlockM)
  Tensor sdS = make_tensor(make_smem_ptr(smem.ds), typename T::SmemLayoutPdS{});    // (kBlockM, kBlockN)
  Tensor sdSt = make_tensor(make_smem_ptr(smem.ds), typename T::SmemLayoutPdSt{});  // (kBlockN, kBlockM)

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
    tile_of(it, h, m);
    Tensor mX = make_tensor(make_gmem_ptr(base + h * head_stride), make_shape(seq.seqlen_q, Int<kHeadDim>{}),
                            make_stride(row_stride, _1{}));  // (Sq, D)
    Tensor tXgX = load_thr.partition_S(local_tile(mX, tile_q, make_coord(m, 0)));
    Tensor tXsX = load_thr.partition_D(make_tensor(make_smem_ptr(dst), typename T::SmemLayoutQ{}));
    copy_tile_zfill(gmem_load, tXgX, tXsX, tQcQ, seq.seqlen_q - m * kBlockM - load_row, cols - load_col);
  };
  // Q of flat iteration `it`, with the lse_log2 and D of its rows (the preprocess padded both arrays to whole
  // tiles, so these 16-byte copies need no bounds).
  auto load_q = [&](int it, int stage) {
    load_q_rows(smem.q + stage * T::kQElems, q_base, p.q_head_stride, p.q_row_stride, p.head_dim, it);
    constexpr int kVecs = kBlockM / 4;
    if (tid < 2 * kVecs) {
      int h, m;
      tile_of(it, h, m);
      int64_t const row0 = ((int64_t)b * p.nheads + h) * p.seqlen_q_rounded + m * kBlockM + (tid % kVecs) * 4;
      float const* src = (tid < kVecs ? p.lse_log2 : p.dsoftmax_sum) + row0;
      float* dst = smem.rows + stage * 2 * kBlockM + (tid / kVecs) * kBlockM + (tid % kVecs) * 4;
      SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>::copy(*reinterpret_cast<cute::uint128_t const*>(src),
                                                       *reinterpret_cast<cute::uint128_t*>(dst));
    }
  };
  auto load_do = [&](int it) {
    load_q_rows(smem.dout, do_base, p.dout_head_stride, p.dout_row_stride, p.head_dim_v, it);
  };

  if (num_iters > 0) {
    Tensor tKgK = load_thr.partition_S(gK);  // (CPY, CPY_N, CPY_D)
    Tensor tKsK = load_thr.partition_D(sK);
    Tensor tVgV = load_thr.partition_S(gV);
    Tensor tVsV = load_thr.partition_D(sV);
    copy_tile_zfill(gmem_load, tKgK, tKsK, tKVcKV, seq.seqlen_k - n0 - load_row, p.head_dim - load_col);
    copy_tile_zfill(gmem_load, tVgV, tVsV, tKVcKV, seq.seqlen_k - n0 - load_row, p.head_dim_v - load_col);
    load_q(0, 0);
    load_do(0);
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
  Tensor tPsdO = ldsm_sdp_a.get_thread_slice(tid).partition_S(sdO);   // dP = dO V^T
  Tensor tPsV = ldsm_sdp_b.get_thread_slice(tid).partition_S(sV);
  Tensor tVsPt = ldsm_kv_a.get_thread_slice(tid).partition_S(sPt);    // dV = P^T dO
  Tensor tVsdOt = ldsm_kv_b.get_thread_slice(tid).partition_S(sdOt);
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
  constexpr int kRows = decltype(size<0>(s_off))::value;
  constexpr int kCols = decltype(size<1>(s_off))::value;

  auto step = [&](int it, auto general) __attribute__((always_inline)) {
    constexpr bool kGeneral = decltype(general)::value;
    int h, m;
    tile_of(it, h, m);
    int const m0 = m * kBlockM;
    int const stage = kDoubleQ ? (it & 1) : 0;
    int64_t const bh = (int64_t)b * p.nheads + h;

    // Q/dO (and K/V) of this tile have landed, and every warp is done with the previous tile's P, dS and Q
    // stage, so the other Q stage may be refilled and P, dS overwritten.
    cp_async_wait<0>();
    __syncthreads();
    if constexpr (kDoubleQ) {
      if (it + 1 < num_iters) {
        load_q(it + 1, stage ^ 1);
        cp_async_fence();
      }
    }
    Tensor sQ = make_tensor(make_smem_ptr(smem.q + stage * T::kQElems), typename T::SmemLayoutQ{});    // (kBlockM, D)
    Tensor sQt = make_tensor(make_smem_ptr(smem.q + stage * T::kQElems), typename T::SmemLayoutQt{});  // (D, kBlockM)
    Tensor tSsQ = ldsm_sdp_a.get_thread_slice(tid).partition_S(sQ);
    Tensor tKsQt = ldsm_kv_b.get_thread_slice(tid).partition_S(sQt);

    // Row terms from the preprocess; rows past the sequence hold its padding (lse_log2 = +inf, D = 0), so P = 0
    // there.
    float const* lse2 = smem.rows + stage * 2 * kBlockM + s_base.row_base;
    float const* dsum = lse2 + kBlockM;
    Tensor acc_s = partition_fragment_C(mma_sdp, tile_s);   // (MMA, MMA_M, MMA_N)
    Tensor acc_dp = partition_fragment_C(mma_sdp, tile_s);  // (MMA, MMA_M, MMA_N)
    Tensor s = make_tensor(acc_s.data(), acc_as_rowcol(acc_s.layout()));     // (rows, cols)
    Tensor ds = make_tensor(acc_dp.data(), acc_as_rowcol(acc_dp.layout()));  // (rows, cols)
    if constexpr (kGeneral) {
      // dP before S: the softcap's derivative then folds into dS as S is produced, with no copy of S kept alive
      // across a GEMM.
      clear(acc_dp);
      gemm_ss(acc_dp, tPrdO, tPrV, tPsdO, tPsV, mma_sdp, ldsm_sdp_a, ldsm_sdp_b);
      clear(acc_s);
      gemm_ss(acc_s, tSrQ, tSrK, tSsQ, tSsK, mma_sdp, ldsm_sdp_a, ldsm_sdp_b);
      if (p.softcap_prescale != 0.f) {
        // s = c * tanh(x / c) enters exp2 as t * (c * log2 e) with t = tanh(x / c); ds/dx = 1 - t^2.
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
          CUTE_UNROLL
          for (int c = 0; c < kCols; ++c) {
            float const t = tanh_accurate(s(r, c) * p.softcap_prescale);
            s(r, c) = t;
            ds(r, c) = (ds(r, c) - dsum[get<0>(s_off(r, 0))]) * (1.f - t * t);
          }
        }
      } else {
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
          CUTE_UNROLL
          for (int c = 0; c < kCols; ++c) ds(r, c) -= dsum[get<0>(s_off(r, 0))];
        }
      }
      // Masking after the derivative factor: a masked score is -inf, which must only ever meet exp2, never t * t.
      apply_mask(acc_s, mma_sdp, tile_s, mask, m0, n0);
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        CUTE_UNROLL
        for (int c = 0; c < kCols; ++c) {
          // -inf scores and +inf lse_log2 both give exp2(-inf) = 0; neither can make NaN here.
          float const pr = exp2f(fmaf(s(r, c), p.scale_log2, -lse2[get<0>(s_off(r, 0))]));
          s(r, c) = pr;
          ds(r, c) *= pr;
        }
      }
      Tensor rP = convert_to<Element>(acc_s);
      Tensor rdS = convert_to<Element>(acc_dp);
      cute::copy(sts_sdp, sts_sdp_thr.retile_S(rP), tPsP);
      cute::copy(sts_sdp, sts_sdp_thr.retile_S(rdS), tPsdS);
    } else {
      // S before dP (no softcap here): P's exponentials and its store to shared memory can then overlap the dP
      // product's MMAs.
      clear(acc_s);
      gemm_ss(acc_s, tSrQ, tSrK, tSsQ, tSsK, mma_sdp, ldsm_sdp_a, ldsm_sdp_b);
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        CUTE_UNROLL
        for (int c = 0; c < kCols; ++c) s(r, c) = exp2f(fmaf(s(r, c), p.scale_log2, -lse2[get<0>(s_off(r, 0))]));
      }
      Tensor rP = convert_to<Element>(acc_s);
      cute::copy(sts_sdp, sts_sdp_thr.retile_S(rP), tPsP);
      clear(acc_dp);
      gemm_ss(acc_dp, tPrdO, tPrV, tPsdO, tPsV, mma_sdp, ldsm_sdp_a, ldsm_sdp_b);
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        CUTE_UNROLL
        for (int c = 0; c < kCols; ++c) ds(r, c) = (ds(r, c) - dsum[get<0>(s_off(r, 0))]) * s(r, c);
      }
      Tensor rdS = convert_to<Element>(acc_dp);
      cute::copy(sts_sdp, sts_sdp_thr.retile_S(rdS), tPsdS);
    }
    __syncthreads();  // P and dS are read by other warps' dV, dK and dQ products

    gemm_ss<T::kStreamKV>(acc_dv, tVrPt, tVrdOt, tVsPt, tVsdOt, mma_kv, ldsm_kv_a, ldsm_kv_b);
    if constexpr (!kDoubleQ) gemm_ss<T::kStreamKV>(acc_dk, tKrdSt, tKrQt, tKsdSt, tKsQt, mma_kv, ldsm_kv_a, ldsm_kv_b);
    if (it + 1 < num_iters) {
      // Every warp is done reading dO (and the single Q stage): refill them under the dQ product.
      __syncthreads();
      load_do(it + 1);
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
      atomic_add_dq_tile<T>(dq_tile + c * kBlockM * T::kDqCols, acc_dq);
    }
    if constexpr (kDoubleQ) gemm_ss<T::kStreamKV>(acc_dk, tKrdSt, tKrQt, tKsdSt, tKsQt, mma_kv, ldsm_kv_a, ldsm_kv_b);
  };
  for (int it = 0; it < num_general; ++it) step(it, cute::true_type{});
  for (int it = num_general; it < num_iters; ++it) step(it, cute::false_type{});

  // Epilogue.
  if (gqa && !group_in_cta) {
    if (num_iters == 0) return;  // the accumulators were zeroed by the preprocess
    int64_t const row_stride = (int64_t)p.nheads_kv * kHeadDim;
    int64_t const off = (int64_t)b * p.seqlen_k_rounded * row_stride + (int64_t)h_kv * kHeadDim;
    Tensor mdKacc = make_tensor(make_gmem_ptr(p.dk_accum + off), make_shape(p.seqlen_k_rounded, Int<kHeadDim>{}),
                                make_stride(row_stride, _1{}));  // (Sk_rounded, D)
    Tensor mdVacc = make_tensor(make_gmem_ptr(p.dv_accum + off), make_shape(p.seqlen_k_rounded, Int<kHeadDim>{}),
                                make_stride(row_stride, _1{}));  // (Sk_rounded, Dv)
    Tensor tdKg = kv_thr.partition_C(local_tile(mdKacc, tile_kv, make_coord(n_block, 0)));  // (MMA, MMA_N, MMA_D)
    Tensor tdVg = kv_thr.partition_C(local_tile(mdVacc, tile_kv, make_coord(n_block, 0)));
    atomic_add_fragment(tdKg, acc_dk);
    atomic_add_fragment(tdVg, acc_dv);
    return;
  }

  // dK and dV go through K's and V's smem (16-byte global stores along rows); every warp must be done reading
  // K and V first.
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dk); ++i) acc_dk(i) *= p.softmax_scale;
  Tensor rdK = convert_to<Element>(acc_dk);
  Tensor rdV = convert_to<Element>(acc_dv);
  __syncthreads();
  auto sts_kv = make_tiled_copy_C(typename T::SmemStoreC{}, mma_kv);
  auto sts_kv_thr = sts_kv.get_thread_slice(tid);
  Tensor tdKsdK = sts_kv_thr.partition_D(sK);
  Tensor tdVsdV = sts_kv_thr.partition_D(sV);
  cute::copy(sts_kv, sts_kv_thr.retile_S(rdK), tdKsdK);
  cute::copy(sts_kv, sts_kv_thr.retile_S(rdV), tdVsdV);
  __syncthreads();

  Element* dk_ptr = static_cast<Element*>(p.dk) + seq.k_offset(p, b, p.dk_batch_stride, p.dk_row_stride) +
                    h_kv * p.dk_head_stride;
  Element* dv_ptr = static_cast<Element*>(p.dv) + seq.k_offset(p, b, p.dv_batch_stride, p.dv_row_stride) +
                    h_kv * p.dv_head_stride;
  Tensor mdK = make_tensor(make_gmem_ptr(dk_ptr), make_shape(key_rows, Int<kHeadDim>{}),
                           make_stride(p.dk_row_stride, _1{}));  // (Sk, D)
  Tensor mdV = make_tensor(make_gmem_ptr(dv_ptr), make_shape(key_rows, Int<kHeadDim>{}),
                           make_stride(p.dv_row_stride, _1{}));  // (Sk, Dv)
  Tensor gdK = local_tile(mdK, tile_kv, make_coord(n_block, 0));  // (kBlockN, D)
  Tensor gdV = local_tile(mdV, tile_kv, make_coord(n_block, 0));  // (kBlockN, Dv)

  store_tile(typename T::GmemStore{}, sK, gdK, tile_kv, key_rows - n0, p.head_dim);
  store_tile(typename T::GmemStore{}, sV, gdV, tile_kv, key_rows - n0, p.head_dim_v);
}

// Grid: (key tiles, or dq_slots in deterministic mode; nheads, or nheads_kv for deterministic GQA; batch).
// Default: one key tile per CTA, every CTA adding dQ into the one accumulator with atomics (their order varies).
// Deterministic: CTA s of a column walks key tiles s, s + slots, ... and adds only into slot s. The dQ fragment of
// a query tile maps to the same threads for every key tile, so each float is added to by one thread in program
// order (same-address atomics of one thread are ordered), and bwd_convert_dq_kernel sums the slots in order.
template <class T>
__global__ void __launch_bounds__(T::kThreads, 1) bwd_kernel(__grid_constant__ BwdKernelParams const p) {
  int const key_tiles = (p.seqlen_k + T::kBlockN - 1) / T::kBlockN;
  int const stride = p.deterministic ? gridDim.x : key_tiles;
  float* const dq_slot = p.dq_accum + (p.deterministic ? blockIdx.x * p.dq_slot_elems : 0);
  for (int n = blockIdx.x; n < key_tiles; n += stride) {
    bwd_key_tile<T>(p, n, dq_slot);
    __syncthreads();  // the next key tile's loads overwrite shared memory the epilogue has just read
  }
}

}  // namespace flashcute::sm80
