// Which query tile of which head and sequence a forward CTA computes, and the grid that covers them all: the one
// place where either forward family decides it. One CTA per tile, the largest query tiles first (under causal
// masks they see the most keys, so the tail of the grid is short). Varlen: seqlen_q is the longest sequence, and a
// CTA past the end of a shorter one finds nothing to do (FwdBlock::init).
#pragma once

#include <cuda_runtime.h>

#include "common/kernel_params.h"

namespace flashcute {

struct FwdTile {
  int m_block, h, b;
};

template <int kBlockM>
struct FwdTileScheduler {
  static dim3 grid(FwdKernelParams const& p) {
    return dim3((p.seqlen_q + kBlockM - 1) / kBlockM, p.nheads, p.batch * (p.num_splits > 1 ? p.num_splits : 1));
  }
#if defined(__CUDACC__)
  __device__ static FwdTile tile() {
    return {int(gridDim.x - 1 - blockIdx.x), int(blockIdx.y), int(blockIdx.z)};
  }
#endif
};

}  // namespace flashcute
