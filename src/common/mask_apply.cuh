// Applies the shared Mask policy (common/mask.h) and the softcap to a score tile held in SM80 or SM90 accumulators.
#pragma once

#include "common/cute_utils.cuh"
#include "common/mask.h"

namespace flashcute {

// Element coordinates are split into this thread's base (two integers) plus per-element offsets taken from thread
// 0's partition, which fold to constants. Partitioning the identity tensor with the real thread index instead
// made ptxas hoist every coordinate out of the mainloop and spill (measured: 255 registers + 124 B of spills at
// hd128 128x64, against 220 and none without the mask).
template <class TiledMma, class Shape>
struct TileCoords {
  int row_base;
  int col_base;
  CUTE_DEVICE TileCoords(TiledMma const& mma, Shape shape) {
    auto mine = mma.get_thread_slice(threadIdx.x).partition_C(make_identity_tensor(shape));
    row_base = get<0>(mine(0));
    col_base = get<1>(mine(0));
  }
  CUTE_DEVICE static auto offsets(TiledMma const& mma, Shape shape) {
    auto lane0 = mma.get_thread_slice(_0{}).partition_C(make_identity_tensor(shape));
    return make_tensor(lane0.data(), acc_as_rowcol(lane0.layout()));  // (rows, cols) of thread 0
  }
};

// m0 (first query) and n0 (first key) place the tile in the sequence; every element outside the Mask's window
// becomes -inf. Rows are queries and columns keys; kTransposed swaps them (the Hopper backward's S^T): key j is seen
// by queries [query_begin(j), query_end(j + 1)), keys past the sequence by none. kPacked (the forward's packed GQA):
// tile row r is query row r / group.
template <bool kTransposed = false, bool kPacked = false, class Acc, class TiledMma, class Shape>
CUTE_DEVICE void apply_mask(Acc& acc, TiledMma const& mma, Shape shape, Mask const& mask, int m0, int n0,
                            int group = 1) {
  Tensor s = make_tensor(acc.data(), acc_as_rowcol(acc.layout()));
  TileCoords<TiledMma, Shape> const base(mma, shape);
  auto const off = TileCoords<TiledMma, Shape>::offsets(mma, shape);
  CUTE_UNROLL
  for (int r = 0; r < size<0>(s); ++r) {
    int begin, end;  // this row's visible columns, relative to its first column
    if constexpr (kTransposed) {
      int const j = n0 + base.row_base + get<0>(off(r, 0));
      begin = mask.query_begin(j) - m0 - base.col_base;
      end = (j < mask.seqlen_k ? mask.query_end(j + 1) : 0) - m0 - base.col_base;
    } else {
      int i = m0 + base.row_base + get<0>(off(r, 0));
      if constexpr (kPacked) i /= group;
      begin = mask.key_begin(i) - n0 - base.col_base;
      end = mask.key_end(i) - n0 - base.col_base;
    }
    CUTE_UNROLL
    for (int k = 0; k < size<1>(s); ++k) {
      int const c = get<1>(off(r, k));
      if (c < begin || c >= end) s(r, k) = -INFINITY;
    }
  }
}

template <class Acc>
CUTE_DEVICE void apply_softcap(Acc& acc, float prescale) {
  CUTE_UNROLL
  for (int i = 0; i < size(acc); ++i) acc(i) = tanh_accurate(acc(i) * prescale);
}

}  // namespace flashcute
