// Which query tile of which head and sequence a forward CTA computes, and the grid that covers them all: the one
// place where either forward family decides it. Tiles are numbered in one order, which a Hopper CTA per tile takes
// from its linear block index (the hardware starts blocks in about that order) and the persistent grid (the Hopper
// forward, tile_counter set) from a counter: one CTA per SM, CTA c taking tile c first and then whichever tile the
// counter hands out next, so every CTA picks up the next tile in the order as soon as it is free, without a launch
// between tiles. The order: the (head, sequence) rows in sections of section_heads consecutive rows (rows of one
// section share L2 while its tiles run), section by section; inside a section the largest query tiles first,
// those of every row of the section before the next smaller ones. Under a causal mask a query tile sees more keys
// the larger it is, so the longest tiles start first and the last to start are short (longest processing time
// first): with one row per section the last row's longest tile starts near the end and runs alone (6-14% of a
// causal call's time on 132 SMs in a greedy-schedule model, more the fewer tiles a head has). Without a causal mask
// every tile of a sequence costs the same and one row per section keeps the fewest heads' K/V in flight.
// The portable kernel keeps one row after the other (launched()). Varlen: seqlen_q is the longest sequence, and a
// tile past the end of a shorter one has nothing to do (FwdBlock::init).
#pragma once

#include <cuda_runtime.h>

#include "common/hostdevice.h"
#include "common/kernel_params.h"

namespace flashcute {

struct FwdTile {
  int m_block, h, b;
};

// A call's tile order (FwdTileScheduler::order), its divisions prepared on the host: m query tiles per row; the
// first section holds `rest` rows (0: none), every other section `width` rows (m * width tiles). One row after the
// other is width 1, rest 0.
struct FwdTileOrder {
  int count;  // tiles
  int m;
  int rest;
  IntDivisor section;  // m * width
  IntDivisor width;
  IntDivisor rest_rows;
  IntDivisor heads;  // nheads
};

// Rows per section for a call: as many as half of L2 holds the K/V of (query heads sharing a K/V head counted once),
// and at most kMaxSectionRows. 1 (one row after the other, the largest tile of each first) without a causal mask,
// without an L2 size (0), for one query tile per row (seqlen_q <= 64, the smallest kBlockM) and where 64-row tiles
// would number 2^31 or more. On an H100 (bench/RESULTS.md, 2026-12-06 eighth session, run 1: one short run each,
// about +-3%) sections of 3-25 rows ran 0.97-1.08x the row-after-row order (hd128-256 from 2k: 0.99-1.08x), sections
// of 33-100 rows 0.90-0.97x (hd64 at 1k-2k, hd128 and hd192 at 1k, where half of L2 holds many heads). Ninth
// session, run 1 (widths 2-33): the rule's widths 1.01-1.13x with 64 rows or fewer, but at hd64 1k and 4k and hd128
// 2k (128 rows or more) every width lost 0.5-8%, two rows a section as much as 33 (hd128 1k, 256 rows: 0.96-1.01x):
// not yet explained (per-tile cost is suspected).
constexpr int kMaxSectionRows = 24;
inline int fwd_section_heads(FwdKernelParams const& p, int64_t l2_bytes, int element_bytes) {
  int64_t const rows = int64_t(p.nheads) * p.batch * (p.num_splits > 1 ? p.num_splits : 1);
  if (!p.causal || rows <= 1 || p.seqlen_q <= 64 || rows * ((p.seqlen_q + 63) / 64) >= (int64_t(1) << 31)) return 1;
  int64_t const kv_bytes = int64_t(p.seqlen_k > 0 ? p.seqlen_k : 1) * (p.head_dim + p.head_dim_v) * element_bytes;
  int64_t per = (l2_bytes / 2 / kv_bytes) * (p.kv_group > 1 ? p.kv_group : 1);
  if (per > kMaxSectionRows) per = kMaxSectionRows;
  return int(per < 1 ? 1 : per < rows ? per : rows);
}

template <int kBlockM>
struct FwdTileScheduler {
  static dim3 grid(FwdKernelParams const& p) {
    return dim3(m_blocks(p), p.nheads, p.batch * (p.num_splits > 1 ? p.num_splits : 1));
  }
  FLASHCUTE_HD static int64_t count(FwdKernelParams const& p) {
    return int64_t(m_blocks(p)) * p.nheads * p.batch * (p.num_splits > 1 ? p.num_splits : 1);
  }
  FLASHCUTE_HD static int m_blocks(FwdKernelParams const& p) { return (p.seqlen_q + kBlockM - 1) / kBlockM; }
  // The order of a call (count(p) < 2^31: fwd_section_heads keeps wider sections below that). Row r is head
  // r % nheads of grid slot z = r / nheads. Where the width does not divide the rows, the first section takes the
  // remainder, so that the last is a full one.
  static FwdTileOrder order(FwdKernelParams const& p) {
    FwdTileOrder o{};
    o.count = int(count(p));
    o.m = m_blocks(p);
    int const rows = o.m > 0 ? int(count(p) / o.m) : 0;
    int const width = p.section_heads <= 1 ? 1 : p.section_heads < rows ? p.section_heads : rows;
    o.rest = rows % width;
    o.section = IntDivisor::make(o.m * width);
    o.width = IntDivisor::make(width);
    o.rest_rows = IntDivisor::make(o.rest);
    o.heads = IntDivisor::make(p.nheads);
    return o;
  }
  // Tile `index` (< o.count) of the order.
  FLASHCUTE_HD static FwdTile tile(FwdTileOrder const& o, int index) {
    int first_row = 0;
    IntDivisor in_section = o.rest_rows;
    if (index >= o.m * o.rest) {
      index -= o.m * o.rest;
      int const section = o.section.div(index);
      index -= section * o.section.d;
      first_row = o.rest + section * o.width.d;
      in_section = o.width;
    }
    int const step = in_section.div(index);
    int const row = first_row + (index - step * in_section.d);
    int const b = o.heads.div(row);
    return {o.m - 1 - step, row - b * o.heads.d, b};
  }
  static FwdTile tile(FwdKernelParams const& p, int index) { return tile(order(p), index); }
#if defined(__CUDACC__)
  // One CTA per tile: this block's tile.
  __device__ static FwdTile tile(FwdTileOrder const& o) {
    if (o.width.d == 1) return launched();  // one row after the other (rest is then 0)
    return tile(o, int(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)));
  }
  // This block's tile in the order of one row after the other, whatever section_heads says: the portable kernel's,
  // where the sectioned tile (held in registers rather than read again from blockIdx) made ptxas spill (hd128 128 x
  // 32 on sm_90a: 0 -> 24 B).
  __device__ static FwdTile launched() {
    return {int(gridDim.x - 1 - blockIdx.x), int(blockIdx.y), int(blockIdx.z)};
  }
#endif
};

}  // namespace flashcute
