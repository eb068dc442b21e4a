// Definition of the Hopper backward launcher; instantiated once per config by the generated .cu files, which are
// compiled for sm_90a only. The preprocess and conversion passes (common/bwd_passes.cuh) serve both families.
#pragma once

#include "common/bwd_passes.cuh"
#include "sm90/bwd_kernel.cuh"

namespace flashcute::sm90 {

template <class T>
int run_bwd(BwdKernelParams const& p, void* stream) {
  return run_bwd_passes<T>(p, stream, &bwd_kernel<T>);
}

}  // namespace flashcute::sm90
