// Definition of the Hopper forward launcher; instantiated once per config by the generated .cu files, which are
// compiled for sm_90a only.
#pragma once

#include <cuda_runtime.h>

#include "sm90/fwd_kernel.cuh"

namespace flashcute::sm90 {

template <class T>
int run_fwd(FwdKernelParams const& p, void* stream) {
  auto kernel = &fwd_kernel<T>;
  constexpr int smem = T::kSmemBytes;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  // Varlen: seqlen_q is the longest sequence; tiles past a shorter sequence exit at once.
  dim3 const grid((p.seqlen_q + T::kBlockM - 1) / T::kBlockM, p.nheads, p.batch);
  kernel<<<grid, T::kThreads, smem, static_cast<cudaStream_t>(stream)>>>(p);
  return cudaGetLastError();
}

}  // namespace flashcute::sm90
