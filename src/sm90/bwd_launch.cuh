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

template <class T>
int run_bwd(BwdKernelParams const& p, void* stream) {
  using Element = typename T::Element;
  BwdParams<T> params{};
  params.p = p;
  bool const turns = p.dq_turns != nullptr;  // deterministic mode (the workspace holds turn words)
  if (!bwd_tma_serves(p))
    return run_bwd_passes<T>(p, stream, turns ? &bwd_kernel<T, false, true> : &bwd_kernel<T, false, false>, params);
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
  if (!encoded.ok())  // the driver refused one
    return run_bwd_passes<T>(p, stream, turns ? &bwd_kernel<T, false, true> : &bwd_kernel<T, false, false>, params);
  // Deterministic mode hands dQ to a writer thread where a float32 buffer for it fits (bwd_det_ws_kernel).
  if constexpr (kDetWs<T>) {
    if (turns)
      return run_bwd_passes<T>(p, stream, &bwd_det_ws_kernel<T>, params, T::kThreads + 128,
                               (int)sizeof(DqWsStorage<T>));
  }
  return run_bwd_passes<T>(p, stream, turns ? &bwd_kernel<T, true, true> : &bwd_kernel<T, true, false>, params);
}

}  // namespace flashcute::sm90
