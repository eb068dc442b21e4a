// Hopper forward mainloop (wgmma + cp.async): one CTA owns a kBlockM tile of queries of one head, one warpgroup per
// 64 rows, and walks its visible K/V tiles from the last to the first (the tiles that need masking first), loading
// the next tile while the current one is computed. Each warpgroup reads its operands from shared memory once per
// tile (mma.sync reads them once per warp), which is what this family buys over the portable one
// (src/sm80/fwd_kernel.cuh, whose masking, softmax, copies and tile order it shares).
#pragma once

#include <cute/tensor.hpp>

#include "common/cute_utils.cuh"
#include "common/fwd_block.cuh"
#include "common/kernel_params.h"
#include "common/mask_apply.cuh"
#include "common/softmax.cuh"
#include "sm90/fwd_traits.cuh"
#include "sm90/wgmma.cuh"

namespace flashcute::sm90 {

template <class T>
__global__ void __launch_bounds__(T::kThreads, 1) fwd_kernel(__grid_constant__ FwdKernelParams const p) {
#if defined(CUTE_ARCH_MMA_SM90A_ENABLED)
  using Element = typename T::Element;
  constexpr int kBlockM = T::kBlockM;
  constexpr int kBlockN = T::kBlockN;
  constexpr int kHeadDim = T::kHeadDim;

  extern __shared__ __align__(1024) char smem_raw[];
  auto& smem = *reinterpret_cast<typename T::SharedStorage*>(smem_raw);
  int const tid = threadIdx.x;

  FwdBlock<kBlockM, kBlockN> blk;
  if (!blk.init(p)) return;
  SeqInfo const& seq = blk.seq;
  Mask const& mask = blk.mask;
  int const m_block = blk.m_block, b = blk.b, h = blk.h, m0 = blk.m0;

  auto tile_q = Shape<Int<kBlockM>, Int<kHeadDim>>{};
  auto tile_kv = Shape<Int<kBlockN>, Int<kHeadDim>>{};
  auto tile_s = Shape<Int<kBlockM>, Int<kBlockN>>{};
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
  Tensor gQ = local_tile(mQ, tile_q, make_coord(m_block, 0));  // (kBlockM, D)
  Tensor gK = local_tile(mK, tile_kv, make_coord(_, 0));       // (kBlockN, D, n)
  Tensor gV = local_tile(mV, tile_kv, make_coord(_, 0));       // (kBlockN, D, n)

  Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename T::SmemLayoutQ{});    // (kBlockM, D)
  Tensor sK = make_tensor(make_smem_ptr(smem.k), typename T::SmemLayoutKV{});   // (kBlockN, D, stage)
  Tensor sV = make_tensor(make_smem_ptr(smem.v), typename T::SmemLayoutKV{});   // (kBlockN, D, stage)
  Tensor sVt = make_tensor(make_smem_ptr(smem.v), typename T::SmemLayoutVt{});  // (D, kBlockN, stage)

  typename T::GmemLoad gmem_load;
  auto load_thr = gmem_load.get_thread_slice(tid);
  Tensor tQgQ = load_thr.partition_S(gQ);  // (CPY, CPY_M, CPY_D)
  Tensor tQsQ = load_thr.partition_D(sQ);
  Tensor tKgK = load_thr.partition_S(gK);  // (CPY, CPY_N, CPY_D, n)
  Tensor tKsK = load_thr.partition_D(sK);  // (CPY, CPY_N, CPY_D, stage)
  Tensor tVgV = load_thr.partition_S(gV);
  Tensor tVsV = load_thr.partition_D(sV);
  // Copy predicates: thread 0's coordinates against bounds shifted by this thread's base (copy_base).
  Tensor tQcQ = copy_offsets(gmem_load, tile_q);     // (CPY, CPY_M, CPY_D)
  Tensor tKVcKV = copy_offsets(gmem_load, tile_kv);  // (CPY, CPY_N, CPY_D)
  int load_row, load_col;
  copy_base(load_thr, tile_q, load_row, load_col);
  int const k_cols = p.head_dim - load_col;
  int const v_cols = p.head_dim_v - load_col;

  typename T::TiledMmaS mma_s;
  typename T::TiledMmaO mma_o;
  auto thr_s = mma_s.get_thread_slice(tid);
  auto thr_o = mma_o.get_thread_slice(tid);
  Tensor tSrQ = thr_s.make_fragment_A(thr_s.partition_A(sQ));    // GMMA descriptors (MMA, MMA_M, MMA_D)
  Tensor tSrK = thr_s.make_fragment_B(thr_s.partition_B(sK));    // (MMA, MMA_N, MMA_D, stage)
  Tensor tOrVt = thr_o.make_fragment_B(thr_o.partition_B(sVt));  // (MMA, MMA_D, MMA_N, stage)
  Tensor acc_o = partition_fragment_C(mma_o, tile_q);            // (MMA, MMA_M, MMA_D)
  clear(acc_o);

  constexpr int kRows = decltype(size<0>(acc_as_rowcol(acc_o.layout())))::value;
  OnlineSoftmax<kRows> softmax;

  // General tiles (masked or softcapped) first, then the plain ones: common/fwd_block.cuh.
  blk.plan_tiles(p);
  int const num_general = blk.num_general, num_tiles = blk.num_tiles;
  auto tile_of = [&](int i) { return blk.tile_of(i); };

  // Each step computes S_i = Q K_i^T, its softmax, then O += P_i V_i. Shared memory holds two stages of K and V:
  // tile i + 1 loads into the other stage during step i. The prologue loads V_0 in a group of its own, so the
  // first S starts once Q and K_0 have landed (worth 0.85 -> 1.1x FA2 on short causal sequences, where the first
  // tile is a large share of each CTA's work).
  // Measured and not kept: issuing S_{i+1} ... P_i V_i back to back and running the softmax of one tile under the
  // other's MMAs (FlashAttention-3's intra-warpgroup overlap). ptxas waits for every wgmma in flight before the
  // first warp shuffle of the softmax (the row max), so nothing overlapped and long sequences lost 8-12%.
  auto load_k = [&](int n, int stage) __attribute__((always_inline)) {
    copy_tile_zfill(gmem_load, tKgK(_, _, _, n), tKsK(_, _, _, stage), tKVcKV,
                    seq.seqlen_k - n * kBlockN - load_row, k_cols);
  };
  auto load_v = [&](int n, int stage) __attribute__((always_inline)) {
    copy_tile_zfill(gmem_load, tVgV(_, _, _, n), tVsV(_, _, _, stage), tKVcKV,
                    seq.seqlen_k - n * kBlockN - load_row, v_cols);
  };
  // What this thread loaded has landed; after the barrier, what every thread loaded.
  auto sync_tiles = [&](auto pending) __attribute__((always_inline)) {
    cp_async_wait<decltype(pending)::value>();
    sync_smem_for_wgmma();
  };

  if (num_tiles > 0) {
    copy_tile_zfill(gmem_load, tQgQ, tQsQ, tQcQ, seq.seqlen_q - m0 - load_row, k_cols);
    load_k(tile_of(0), 0);
    cp_async_fence();
    load_v(tile_of(0), 0);
    cp_async_fence();
  }

  constexpr int kPlain = 0, kMasked = 1, kSoftcapped = 2;
  // kFirst: step 0, a body of its own (V_0 arrives in a later group than K_0): runtime tests of i == 0 inside the
  // one body cost the other steps 4-8% at hd128 (bench/RESULTS.md, fifth session, runs C and D).
  auto step = [&](int i, auto kind, auto first) __attribute__((always_inline)) {
    constexpr int kKind = decltype(kind)::value;
    constexpr bool kFirst = decltype(first)::value;
    int const stage = i & 1;
    // K_i (and V_i, except in step 0) have landed, and every warpgroup is done with step i - 1's stage.
    sync_tiles(Int<kFirst ? 1 : 0>{});
    if (i + 1 < num_tiles) {
      load_k(tile_of(i + 1), stage ^ 1);
      load_v(tile_of(i + 1), stage ^ 1);
    }
    cp_async_fence();

    Tensor acc_s = partition_fragment_C(mma_s, tile_s);  // (MMA, MMA_M, MMA_N)
    warpgroup_issue<true, false>(mma_s, tSrQ, tSrK(_, _, _, stage), acc_s);
    warpgroup_wait_for<0>(acc_s);
    if constexpr (kKind == kSoftcapped) apply_softcap(acc_s, p.softcap_prescale);
    if constexpr (kKind != kPlain) apply_mask(acc_s, mma_s, tile_s, mask, m0, tile_of(i) * kBlockN);
    softmax.update(acc_s, acc_o, p.scale_log2);
    if constexpr (kFirst) sync_tiles(Int<1>{});  // V_0
    Tensor rP = convert_to<Element>(acc_s);
    Tensor tOrP = make_tensor(rP.data(), acc_as_a_operand(rP.layout()));  // (MMA, MMA_M, MMA_N / 16)
    warpgroup_issue<false, true>(mma_o, tOrP, tOrVt(_, _, _, stage), acc_o);
    warpgroup_wait_for<0>(acc_o, rP);
  };

  // The first tile takes the masked (or softcapped) body even where it needs no mask: one tile, at a small cost.
  if (num_tiles > 0) {
    if (p.softcap_prescale != 0.f) {
      step(0, Int<kSoftcapped>{}, true_type{});
      for (int i = 1; i < num_tiles; ++i) step(i, Int<kSoftcapped>{}, false_type{});  // no plain tiles
    } else {
      step(0, Int<kMasked>{}, true_type{});
      for (int i = 1; i < num_general; ++i) step(i, Int<kMasked>{}, false_type{});
      for (int i = max(num_general, 1); i < num_tiles; ++i) step(i, Int<kPlain>{}, false_type{});
    }
  }

  float inv[kRows], lse[kRows];
  softmax.finish(p.scale_log2, inv, lse);

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
  __syncthreads();  // every warpgroup is done reading Q, K and V
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    CUTE_UNROLL
    for (int c = 0; c < size<1>(o_rc); c += 2) {
      int const offset = get<0>(o_off(r, c)) * kStride + get<1>(o_off(r, c));
      *reinterpret_cast<float2*>(o_mine + offset) = make_float2(o_rc(r, c), o_rc(r, c + 1));
    }
    if (o_base.col_base == 0) inv_buf[o_base.row_base + get<0>(o_off(r, 0))] = inv[r];  // one thread per quad
  }
  __syncthreads();
  constexpr int kVecsPerRow = kHeadDim / 8;
  int const rows = min(kBlockM, seq.seqlen_q - m0);
#pragma unroll 1
  for (int v = tid; v < kBlockM * kVecsPerRow; v += T::kThreads) {
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

  if (p.lse) {
    Tensor cO = thr_o.partition_C(make_identity_tensor(tile_q));
    Tensor cO_rc = make_tensor(cO.data(), acc_as_rowcol(cO.layout()));
    float* lse_ptr = p.lse + seq.lse_offset(p, b, h);
    if (get<1>(cO_rc(0, 0)) == 0) {  // one thread of each quad holds column 0 of its rows
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        int const row = m0 + get<0>(cO_rc(r, 0));
        if (row < seq.seqlen_q) lse_ptr[row] = lse[r];
      }
    }
  }
#else
  __trap();  // compiled for sm_90a only (CMakeLists.txt); dispatch never launches it elsewhere
#endif
}

}  // namespace flashcute::sm90
