// Definition of the Hopper backward launcher; instantiated once per config by the generated .cu files, which are
// compiled for sm_90a only. The preprocess and conversion passes (common/bwd_passes.cuh) serve both families.
#pragma once

#include "sm90/tma_driver.h"  // first: it redirects CuTe's TMA descriptor calls

#include "common/bwd_passes.cuh"
#include "sm90/bwd_kernel.cuh"
#include "sm90/tma.cuh"

namespace flashcute::sm90 {

// Whether TMA serves Q, dO, K and V, with strides tma_strides_ok accepts: fixed-length batches, and varlen ones
// without padded rows (packed_rows_q / packed_rows_k: each tensor as one sequence of its packed rows).
inline bool bwd_tma_serves(BwdKernelParams const& p) {
  if (p.seqlen_q <= 0 || p.seqlen_k <= 0 || (p.seq_spans && !(p.packed_rows_q > 0 && p.packed_rows_k > 0)))
    return false;
  int64_t const q_sizes[3] = {tma_batches(p), tma_rows_q(p), p.nheads};
  int64_t const k_sizes[3] = {tma_batches(p), tma_rows_k(p), p.nheads_kv};
  return tma_strides_ok(q_sizes, {p.q_batch_stride, p.q_row_stride, p.q_head_stride}) &&
         tma_strides_ok(q_sizes, {p.dout_batch_stride, p.dout_row_stride, p.dout_head_stride}) &&
         tma_strides_ok(k_sizes, {p.k_batch_stride, p.k_row_stride, p.k_head_stride}) &&
         tma_strides_ok(k_sizes, {p.v_batch_stride, p.v_row_stride, p.v_head_stride});
}

// The TMA copies of Q, dO, K and V for tile T's shared-memory layouts; false where the driver refused one.
template <class T>
bool make_bwd_tma(BwdParams<T>& params) {
  using Element = typename T::Element;
  BwdKernelParams const& p = params.p;
  TmaEncodeCheck encoded;
  int const rows_q = tma_rows_q(p), rows_k = tma_rows_k(p), batches = tma_batches(p);
  params.tma_q = make_rows_tma<Element, decltype(take<0, 2>(typename T::SmemLayoutQs{})), T::kBlockM, T::kHeadDim>(
      p.q, rows_q, p.head_dim, p.nheads, batches, p.q_row_stride, p.q_head_stride, p.q_batch_stride);
  params.tma_do = make_rows_tma<Element, decltype(take<0, 2>(typename T::SmemLayoutdOs{})), T::kBlockM,
                                T::kHeadDimV>(p.dout, rows_q, p.head_dim_v, p.nheads, batches, p.dout_row_stride,
                                              p.dout_head_stride, p.dout_batch_stride);
  params.tma_k = make_rows_tma<Element, typename T::SmemLayoutKV, T::kBlockN, T::kHeadDim>(
      p.k, rows_k, p.head_dim, p.nheads_kv, batches, p.k_row_stride, p.k_head_stride, p.k_batch_stride);
  params.tma_v = make_rows_tma<Element, typename T::SmemLayoutV, T::kBlockN, T::kHeadDimV>(
      p.v, rows_k, p.head_dim_v, p.nheads_kv, batches, p.v_row_stride, p.v_head_stride, p.v_batch_stride);
  return encoded.ok();
}

// Names a tile (its traits) as a value, for a generic lambda.
template <class U>
struct TileTag {
  using type = U;
};

template <class T>
int run_bwd(BwdKernelParams const& p, void* stream) {
  bool const turns = p.dq_turns != nullptr;  // deterministic mode (the workspace holds turn words)
  // TMA loads where they serve and the driver encodes the copies; kernel of tile U (`tile` names it).
  constexpr int kRefused = -1;
  auto with_tma = [&](auto tile, auto kernel, int threads, int smem_bytes) {
    using U = typename decltype(tile)::type;
    BwdParams<U> params{};
    params.p = p;
    return make_bwd_tma(params) ? run_bwd_passes<U>(p, stream, kernel, params, threads, smem_bytes) : kRefused;
  };
  int status = kRefused;
  if (bwd_tma_serves(p)) {
    // A writer thread adds dQ where a float32 buffer for it fits (bwd_ws_kernel): in deterministic mode, and in the
    // default mode where it measured faster (kDqWriterDefault).
    if constexpr (kDqWriter<T>) {
      using W = WsTraits<T>;
      constexpr int kWsThreads = W::kThreads + 128, kWsSmem = sizeof(DqWsStorage<W>);
      if (turns)
        status = with_tma(TileTag<W>{}, &bwd_ws_kernel<W, true>, kWsThreads, kWsSmem);
      else if constexpr (kDqWriterDefault<T>)
        status = with_tma(TileTag<W>{}, &bwd_ws_kernel<W, false>, kWsThreads, kWsSmem);
      else
        status = with_tma(TileTag<T>{}, &bwd_kernel<T, true, false>, T::kThreads, T::kSmemBytes);
    } else {
      status = with_tma(TileTag<T>{}, turns ? &bwd_kernel<T, true, true> : &bwd_kernel<T, true, false>,
                        T::kThreads, T::kSmemBytes);
    }
  }
  if (status != kRefused) return status;
  BwdParams<T> params{};  // cp.async loads
  params.p = p;
  return run_bwd_passes<T>(p, stream, turns ? &bwd_kernel<T, false, true> : &bwd_kernel<T, false, false>, params);
}

}  // namespace flashcute::sm90
