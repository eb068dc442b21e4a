// Declarations the host-side registry needs to name the Hopper forward launchers; definitions in fwd_launch.cuh.
#pragma once

namespace flashcute {
struct FwdKernelParams;
namespace sm90 {
template <class Element, int kHeadDim, int kBlockM, int kBlockN, int kWarps, int kHeadDimV = kHeadDim>
struct FwdTraits;
// Returns a cudaError_t as int so host code needs no CUDA headers.
template <class Traits>
int run_fwd(FwdKernelParams const& params, void* stream);
}  // namespace sm90
}  // namespace flashcute
