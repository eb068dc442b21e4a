// The kernels of one backward call, for every backward family, on one stream: preprocess (row terms, zeroed
// workspace), the learnable sink's gradient where asked for, the family's mainloop kernel, dQ conversion, and for
// GQA without determinism the dK/dV conversion. The preprocess and conversion kernels are portable; the mainloop's
// traits T only lend them tile sizes and the dQ accumulator's fragment order.
#pragma once

#include <cuda_runtime.h>

#include "common/bwd_postprocess.cuh"
#include "common/bwd_preprocess.cuh"
#include "common/kernel_params.h"

namespace flashcute {

// kernel(args) is the mainloop kernel and what it takes (p, or a family's params built around it), launched with
// `threads` threads and `kernel_smem` bytes of shared memory (T's unless the kernel adds roles of its own).
template <class T, class Kernel, class Args>
int run_bwd_passes(BwdKernelParams const& p, void* stream_ptr, Kernel kernel, Args const& args,
                   int threads = T::kThreads, int kernel_smem = T::kSmemBytes) {
  using Element = typename T::Element;
  auto const stream = static_cast<cudaStream_t>(stream_ptr);
  // The workspace is carved for this config's tile head dim and query tile (src/api/workspace.h); the kernels
  // index it with compile-time widths.
  if (p.head_dim_rounded != T::kHeadDim || p.seqlen_q_rounded % 128 || p.seqlen_k_rounded % 128)
    return cudaErrorInvalidValue;
  // The workspace's deterministic dQ scheme (turns or slots) must be the one this family's kernel implements.
  if (p.deterministic && (p.dq_turns != nullptr) != T::kDqTurns) return cudaErrorInvalidValue;
  constexpr int kRows = BwdRowKernel::kRows;

  int const pre_rows = p.seqlen_q_rounded > p.seqlen_k_rounded ? p.seqlen_q_rounded : p.seqlen_k_rounded;
  dim3 const pre_grid(pre_rows / kRows, p.nheads, p.batch);
  bwd_preprocess_kernel<Element><<<pre_grid, BwdRowKernel::kThreads, 0, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  if (p.dsink && p.learnable_sink) {
    bwd_dsink_kernel<BwdRowKernel::kThreads><<<p.nheads, BwdRowKernel::kThreads, 0, stream>>>(p);
  }

  int const smem = launch_smem(p, kernel_smem);
  if (smem > 48 * 1024) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
  }
  // Varlen: seqlen_k is the longest sequence; key tiles past a shorter one are skipped at once. Deterministic mode
  // with slots runs dq_slots CTAs per column, each walking a strided set of key tiles (for_each_key_tile). A pass
  // with nothing to do (no keys, or no queries) is not launched: a grid dimension of 0 is a launch error.
  bool const group_in_cta = p.nheads != p.nheads_kv && p.deterministic;
  int const key_tiles = (p.seqlen_k + T::kBlockN - 1) / T::kBlockN;
  bool const slots = p.deterministic && !p.dq_turns;
  dim3 const grid(slots ? p.dq_slots : key_tiles, group_in_cta ? p.nheads_kv : p.nheads, p.batch);
  if (key_tiles > 0) {
    kernel<<<grid, threads, smem, stream>>>(args);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }

  dim3 const dq_grid((p.seqlen_q + T::kBlockM - 1) / T::kBlockM, p.nheads, p.batch);
  if (dq_grid.x > 0) bwd_convert_dq_kernel<T><<<dq_grid, T::kThreads, 0, stream>>>(p);
  if (p.nheads != p.nheads_kv && !p.deterministic && key_tiles > 0) {  // GQA's dk/dv went to float32 accumulators
    dim3 const kv_grid((p.seqlen_k + kRows - 1) / kRows, p.nheads_kv, p.batch);
    bwd_postprocess_kernel<Element><<<kv_grid, BwdRowKernel::kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace flashcute
