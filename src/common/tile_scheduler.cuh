// Which query tile of which head and sequence a forward CTA computes, and the grid that covers them all: the one
// place where either forward family decides it. Tiles are numbered in one order, the largest query tiles of a head
// first (under causal masks they see the most keys, so the tail of the work is short), then head by head (the CTAs
// in flight share one head's K/V in L2), then sequence by sequence. One CTA per tile takes them in that order from
// its block index; the persistent grid (the Hopper forward, tile_counter set) runs one CTA per SM, CTA c taking
// tile c first and then whichever tile a counter hands out next, so every CTA picks up the next tile in the order
// as soon as it is free, as the hardware schedules one CTA per tile, without a launch between tiles. Varlen:
// seqlen_q is the longest sequence, and a tile past the end of a shorter one has nothing to do (FwdBlock::init).
#pragma once

#include <cuda_runtime.h>

#include "common/hostdevice.h"
#include "common/kernel_params.h"

namespace flashcute {

struct FwdTile {
  int m_block, h, b;
};

template <int kBlockM>
struct FwdTileScheduler {
  static dim3 grid(FwdKernelParams const& p) {
    return dim3(m_blocks(p), p.nheads, p.batch * (p.num_splits > 1 ? p.num_splits : 1));
  }
  FLASHCUTE_HD static int64_t count(FwdKernelParams const& p) {
    return int64_t(m_blocks(p)) * p.nheads * p.batch * (p.num_splits > 1 ? p.num_splits : 1);
  }
  FLASHCUTE_HD static int m_blocks(FwdKernelParams const& p) { return (p.seqlen_q + kBlockM - 1) / kBlockM; }
#if defined(__CUDACC__)
  // One CTA per tile.
  __device__ static FwdTile tile() {
    return {int(gridDim.x - 1 - blockIdx.x), int(blockIdx.y), int(blockIdx.z)};
  }
  // Tile `index` of the order, as the one-CTA-per-tile grid numbers its blocks (the persistent grid).
  __device__ static FwdTile tile(FwdKernelParams const& p, int index) {
    int const m = m_blocks(p);
    int const rest = index / m;
    return {m - 1 - (index - rest * m), rest % p.nheads, rest / p.nheads};
  }
#endif
};

}  // namespace flashcute
