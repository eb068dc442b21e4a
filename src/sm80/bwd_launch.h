// Declarations the host-side registry needs to name the backward launchers; definitions in bwd_launch.cuh.
#pragma once

namespace flashcute {
struct BwdKernelParams;
namespace sm80 {
template <class Element, int kHeadDim, int kBlockM, int kBlockN, int kWarps, bool kVInRegs = false>
struct BwdTraits;
template <class Traits>
int run_bwd(BwdKernelParams const& params, void* stream);
}  // namespace sm80
}  // namespace flashcute
