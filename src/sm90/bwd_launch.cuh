// Definition of the Hopper backward launcher; instantiated once per config by the generated .cu files, which are
// compiled for sm_90a only. The preprocess and conversion passes (common/bwd_passes.cuh) serve both families.
#pragma once

#include "sm90/tma_driver.h"  // first: it redirects CuTe's TMA descriptor calls

#include "common/bwd_passes.cuh"
#include "sm90/bwd_kernel.cuh"
#include "sm90/tma.cuh"

namespace flashcute::sm90 {

// Whether TMA serves Q, dO, K and V: fixed-length batches (varlen ones, whose rows past a sequence belong to the
// next one rather than arriving as zeros, use cp.async) with strides tma_strides_ok accepts.
inline bool bwd_tma_serves(BwdKernelParams const& p) {
  if (p.seq_spans || p.seqlen_q <= 0 || p.seqlen_k <= 0) return false;
  int64_t const q_sizes[3] = {p.batch, p.seqlen_q, p.nheads};
  int64_t const k_sizes[3] = {p.batch, p.seqlen_k, p.nheads_kv};
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
  params.tma_q = make_rows_tma<Element, decltype(take<0, 2>(typename T::SmemLayoutQs{})), T::kBlockM, T::kHeadDim>(
      p.q, p.seqlen_q, p.head_dim, p.nheads, p.batch, p.q_row_stride, p.q_head_stride, p.q_batch_stride);
  params.tma_do = make_rows_tma<Element, decltype(take<0, 2>(typename T::SmemLayoutdOs{})), T::kBlockM,
                                T::kHeadDimV>(p.dout, p.seqlen_q, p.head_dim_v, p.nheads, p.batch, p.dout_row_stride,
                                              p.dout_head_stride, p.dout_batch_stride);
  params.tma_k = make_rows_tma<Element, typename T::SmemLayoutKV, T::kBlockN, T::kHeadDim>(
      p.k, p.seqlen_k, p.head_dim, p.nheads_kv, p.batch, p.k_row_stride, p.k_head_stride, p.k_batch_stride);
  params.tma_v = make_rows_tma<Element, typename T::SmemLayoutV, T::kBlockN, T::kHeadDimV>(
      p.v, p.seqlen_k, p.head_dim_v, p.nheads_kv, p.batch, p.v_row_stride, p.v_head_stride, p.v_batch_stride);
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
