// The parts of a backward CTA's work that do not depend on its MMA family: the row terms it loads per query tile,
// how its dK and dV leave, and the walk over key tiles. T is a family's BwdTraits (Element, kBlockM, kBlockN,
// kHeadDim, SmemStoreC, GmemStore).
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>

#include "common/bwd_atomics.cuh"
#include "common/bwd_block.cuh"
#include "common/cute_utils.cuh"
#include "common/kernel_params.h"

namespace flashcute {

// lse_log2 then D of the kBlockM rows of query tile m of head h into dst[0, 2 * kBlockM), by cp.async from the
// first kBlockM / 2 threads (the preprocess padded both arrays to whole tiles, so the 16-byte copies need no bounds).
template <int kBlockM>
CUTE_DEVICE void load_row_terms(BwdKernelParams const& p, int b, int h, int m, float* dst) {
  constexpr int kVecs = kBlockM / 4;
  int const tid = threadIdx.x;
  if (tid < 2 * kVecs) {
    int64_t const row0 = ((int64_t)b * p.nheads + h) * p.seqlen_q_rounded + m * kBlockM + (tid % kVecs) * 4;
    float const* src = (tid < kVecs ? p.lse_log2 : p.dsoftmax_sum) + row0;
    SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>::copy(
        *reinterpret_cast<cute::uint128_t const*>(src),
        *reinterpret_cast<cute::uint128_t*>(dst + (tid / kVecs) * kBlockM + (tid % kVecs) * 4));
  }
}

// dK and dV of the CTA's key tile, from accumulators partitioned by mma_k and mma_v (dV's, at T::kHeadDimV
// columns; scaled sums: dK still lacks the softmax scale). GQA without determinism adds them into the float32
// accumulators (converted later by bwd_postprocess_kernel); otherwise they go through K's and V's shared memory
// (sK, sV: every thread must be done reading them) so the global stores are 16-byte vectors along rows.
// A barrier over every thread of the CTA; a warp-specialised kernel passes one over its MMA threads instead.
// kTransposed: the accumulators hold dK^T and dV^T (head dim x keys; the Hopper kSwapKV tile), stored element by
// element into transposed views.
struct SyncCta {
  CUTE_DEVICE void operator()() const { __syncthreads(); }
};

template <class T, bool kTransposed = false, class MmaK, class MmaV, class AccK, class AccV, class SK, class SV,
          class Sync = SyncCta>
CUTE_DEVICE void store_dk_dv(BwdKernelParams const& p, BwdBlock<T::kBlockM, T::kBlockN> const& blk,
                             MmaK const& mma_k, MmaV const& mma_v, AccK& acc_dk, AccV& acc_dv, SK& sK, SV& sV,
                             Sync const& sync = {}) {
  using Element = typename T::Element;
  constexpr int kHeadDim = T::kHeadDim;
  constexpr int kHeadDimV = T::kHeadDimV;
  auto tile_kv = Shape<Int<T::kBlockN>, Int<kHeadDim>>{};
  auto tile_v = Shape<Int<T::kBlockN>, Int<kHeadDimV>>{};
  // A (keys, cols) tensor, its tile n and its tile shape as the accumulators see them.
  auto acc_view = [](auto t) {
    if constexpr (kTransposed)
      return make_tensor(t.data(), select<1, 0>(t.layout()));
    else
      return t;
  };
  auto acc_tile = [](auto tile) {
    if constexpr (kTransposed)
      return make_shape(get<1>(tile), get<0>(tile));
    else
      return tile;
  };
  auto acc_coord = [](int n) {
    if constexpr (kTransposed)
      return make_coord(0, n);
    else
      return make_coord(n, 0);
  };
  auto thr = mma_k.get_thread_slice(threadIdx.x);
  auto thr_v = mma_v.get_thread_slice(threadIdx.x);
  if (blk.gqa && !blk.group_in_cta) {
    if (blk.num_iters == 0) return;  // the accumulators were zeroed by the preprocess
    int64_t const row_stride = (int64_t)p.nheads_kv * kHeadDim;
    int64_t const off = blk.kv_accum_offset(p);
    Tensor mdKacc = make_tensor(make_gmem_ptr(p.dk_accum + off), make_shape(p.seqlen_k_rounded, Int<kHeadDim>{}),
                                make_stride(row_stride, _1{}));  // (Sk_rounded, D)
    Tensor mdVacc = make_tensor(make_gmem_ptr(p.dv_accum + off), make_shape(p.seqlen_k_rounded, Int<kHeadDimV>{}),
                                make_stride(row_stride, _1{}));  // (Sk_rounded, Dv)
    Tensor tdKg = thr.partition_C(local_tile(acc_view(mdKacc), acc_tile(tile_kv), acc_coord(blk.n_block)));
    Tensor tdVg = thr_v.partition_C(local_tile(acc_view(mdVacc), acc_tile(tile_v), acc_coord(blk.n_block)));
    if constexpr (kTransposed) {  // neighbouring accumulator columns are neighbouring rows here: one float each
      CUTE_UNROLL
      for (int i = 0; i < size(acc_dk); ++i) atomicAdd(&tdKg(i), acc_dk(i));
      CUTE_UNROLL
      for (int i = 0; i < size(acc_dv); ++i) atomicAdd(&tdVg(i), acc_dv(i));
    } else {
      atomic_add_fragment(tdKg, acc_dk);
      atomic_add_fragment(tdVg, acc_dv);
    }
    return;
  }

  CUTE_UNROLL
  for (int i = 0; i < size(acc_dk); ++i) acc_dk(i) *= p.softmax_scale;
  Tensor rdK = convert_to<Element>(acc_dk);
  Tensor rdV = convert_to<Element>(acc_dv);
  sync();
  using Store = std::conditional_t<kTransposed, Copy_Atom<UniversalCopy<Element>, Element>, typename T::SmemStoreC>;
  auto sts = make_tiled_copy_C(Store{}, mma_k);
  auto sts_thr = sts.get_thread_slice(threadIdx.x);
  cute::copy(sts, sts_thr.retile_S(rdK), sts_thr.partition_D(acc_view(sK)));
  auto sts_v = make_tiled_copy_C(Store{}, mma_v);
  auto sts_v_thr = sts_v.get_thread_slice(threadIdx.x);
  cute::copy(sts_v, sts_v_thr.retile_S(rdV), sts_v_thr.partition_D(acc_view(sV)));
  sync();

  int const key_rows = blk.key_rows(p);
  Tensor mdK = make_tensor(make_gmem_ptr(blk.template dk<Element>(p)), make_shape(key_rows, Int<kHeadDim>{}),
                           make_stride(p.dk_row_stride, _1{}));  // (Sk, D)
  Tensor mdV = make_tensor(make_gmem_ptr(blk.template dv<Element>(p)), make_shape(key_rows, Int<kHeadDimV>{}),
                           make_stride(p.dv_row_stride, _1{}));  // (Sk, Dv)
  int const rows = key_rows - blk.n0;
  store_tile(typename T::GmemStore{}, sK, local_tile(mdK, tile_kv, make_coord(blk.n_block, 0)), tile_kv, rows,
             p.head_dim);
  store_tile(typename T::GmemStore{}, sV, local_tile(mdV, tile_v, make_coord(blk.n_block, 0)), tile_v, rows,
             p.head_dim_v);
}

// The key tiles of one grid column: (key tiles, or dq_slots in deterministic mode with slots; nheads, or nheads_kv
// for deterministic GQA; batch). Default: one key tile per CTA, every CTA adding dQ into the one accumulator with
// atomics (their order varies). Deterministic with turns (kTurns: the kernel's turn code): likewise, the CTAs of a
// query tile adding in turn (common/bwd_dq_order.cuh), numbered so that the key tile that goes first is launched
// first.
// Deterministic with slots: CTA s of a column walks key tiles s, s + slots, ... and adds only into slot s. The dQ
// fragment of a query tile maps to the same threads for every key tile, so each float is added to by one thread in
// program order (same-address atomics of one thread are ordered), and bwd_convert_dq_kernel sums the slots in
// order. Slots cost no waiting, but every CTA walks its column's whole dQ once per key tile, so they outgrow L2 at
// long sequences (src/api/workspace.h). key_tile(n, dq_slot) does one key tile.
template <int kBlockN, bool kTurns, class KeyTile, class Sync = SyncCta>
CUTE_DEVICE void for_each_key_tile(BwdKernelParams const& p, KeyTile&& key_tile, Sync const& sync = {}) {
  int const key_tiles = (p.seqlen_k + kBlockN - 1) / kBlockN;
  // Two copies of one walk, each the form ptxas measured best for its tiles: a single form made the kTurns tiles
  // spill (hd256: 100 B) or changed the SASS of the others.
  if constexpr (kTurns) {
    bool const slots = p.deterministic && !p.dq_turns;
    int const stride = slots ? gridDim.x : key_tiles;
    float* const dq_slot = p.dq_accum + (slots ? blockIdx.x * p.dq_slot_elems : 0);
    int const first = p.dq_turns && p.dq_descending ? key_tiles - 1 - (int)blockIdx.x : (int)blockIdx.x;
    for (int n = first; n < key_tiles; n += stride) {
      key_tile(n, p.dq_turns ? p.dq_accum + (n % p.dq_slots) * p.dq_slot_elems : dq_slot);
      sync();  // the next key tile's loads overwrite shared memory the epilogue has just read
    }
  } else {
    int const stride = p.deterministic ? gridDim.x : key_tiles;
    float* const dq_slot = p.dq_accum + (p.deterministic ? blockIdx.x * p.dq_slot_elems : 0);
    for (int n = blockIdx.x; n < key_tiles; n += stride) {
      key_tile(n, dq_slot);
      sync();
    }
  }
}

}  // namespace flashcute
