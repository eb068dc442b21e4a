// Declarations the host-side registry needs to name the Hopper backward launchers; definitions in bwd_launch.cuh.
#pragma once

namespace flashcute {
struct BwdKernelParams;
namespace sm90 {
template <class Element, int kHeadDim, int kBlockM, int kBlockN, int kWarps, int kHeadDimV = kHeadDim, int kStages = 0>
struct BwdTraits;
// Returns a cudaError_t as int so host code needs no CUDA headers.
template <class Traits>
int run_bwd(BwdKernelParams const& params, void* stream);
}  // namespace sm90
}  // namespace flashcute
