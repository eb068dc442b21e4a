// Definition of the portable forward launcher; instantiated once per config by the generated .cu files.
#pragma once

#include <cuda_runtime.h>

#include "common/fwd_combine.cuh"
#include "sm80/fwd_kernel.cuh"

namespace flashcute::sm80 {

template <class T>
int run_fwd(FwdKernelParams const& p, void* stream) {
  auto kernel = uses_decode_kernel(p) ? &fwd_kernel<T, true> : &fwd_kernel<T, false>;
  int const smem = launch_smem(p, T::kSmemBytes);
  if (smem > 48 * 1024) {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
  }
  dim3 const grid = FwdTileScheduler<T::kBlockM>::grid(p);
  kernel<<<grid, T::kThreads, smem, static_cast<cudaStream_t>(stream)>>>(p);
  if (p.num_splits > 1) {
    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
    return launch_fwd_combine<typename T::Element>(p, static_cast<cudaStream_t>(stream));
  }
  return cudaGetLastError();
}

}  // namespace flashcute::sm80
