// Definition of the portable backward launcher; instantiated once per config by the generated .cu files.
#pragma once

#include "sm80/bwd_kernel.cuh"
#include "common/bwd_passes.cuh"

namespace flashcute::sm80 {

template <class T>
int run_bwd(BwdKernelParams const& p, void* stream) {
  return run_bwd_passes<T>(p, stream, &bwd_kernel<T>, p);
}

}  // namespace flashcute::sm80
