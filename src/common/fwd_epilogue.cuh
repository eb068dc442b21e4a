// What the forward epilogues of both families share.
#pragma once

#include <cute/tensor.hpp>

#include "common/cute_utils.cuh"
#include "common/kernel_params.h"
#include "common/mask_apply.cuh"

namespace flashcute {

// The learnable sink of head h in exp2 units (its logit times log2(e)), or -inf where there is none.
CUTE_DEVICE float sink_log2(FwdKernelParams const& p, int h) {
  return p.learnable_sink ? p.learnable_sink[h] * kLog2e : -INFINITY;
}

// Writes each row's lse (rows of this block below the sequence's end: rows_left = seqlen_q - m0) from the thread of
// its quad that holds column 0, at lse_row0[row]. thr is this thread's slice of the MMA whose accumulators held O,
// tile O's (kBlockM, head dim) shape.
template <int kRows, class ThrMma, class Tile>
CUTE_DEVICE void store_lse_rows(float* lse_row0, ThrMma const& thr, Tile tile, int m0, int seqlen_q,
                                float const (&lse)[kRows]) {
  Tensor c = thr.partition_C(make_identity_tensor(tile));
  Tensor c_rc = make_tensor(c.data(), acc_as_rowcol(c.layout()));
  if (get<1>(c_rc(0, 0)) != 0) return;
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    int const row = m0 + get<0>(c_rc(r, 0));
    if (row < seqlen_q) lse_row0[row] = lse[r];
  }
}

template <int kRows, class ThrMma, class Tile>
CUTE_DEVICE void store_lse(FwdKernelParams const& p, ThrMma const& thr, Tile tile, SeqInfo const& seq, int b, int h,
                           int m0, float const (&lse)[kRows]) {
  if (p.lse) store_lse_rows(p.lse + seq.lse_offset(p, b, h), thr, tile, m0, seq.seqlen_q, lse);
}

// Split-KV: element offset of row 0 of this sequence's slots for split `split` of head h in the partials
// (kernel_params.h); times head_dim_v for o_partial.
CUTE_DEVICE int64_t partial_row0(FwdKernelParams const& p, SeqInfo const& seq, int b, int h, int split) {
  return ((int64_t)split * p.nheads + h) * p.partial_rows + (p.seq_spans ? seq.q_row0 : (int64_t)b * p.seqlen_q);
}

// Split-KV: this thread's normalised O (acc_o, float32 accumulators of mma over tile) into the float32 partial rows
// at o_row0 (row stride head_dim_v), rows below seqlen_q and columns below head_dim_v.
template <class TiledMma, class Tile, class Acc>
CUTE_DEVICE void store_o_partial(FwdKernelParams const& p, TiledMma const& mma, Tile tile, Acc const& acc_o,
                                 float* o_row0, int m0, int seqlen_q) {
  TileCoords<TiledMma, Tile> const base(mma, tile);
  auto const off = TileCoords<TiledMma, Tile>::offsets(mma, tile);
  Tensor o_rc = make_tensor(acc_o.data(), acc_as_rowcol(acc_o.layout()));
  int const cols = p.head_dim_v - base.col_base;
  CUTE_UNROLL
  for (int r = 0; r < size<0>(o_rc); ++r) {
    int const row = m0 + base.row_base + get<0>(off(r, 0));
    if (row >= seqlen_q) continue;
    float* dst = o_row0 + (int64_t)row * p.head_dim_v + base.col_base;
    CUTE_UNROLL
    for (int c = 0; c < size<1>(o_rc); ++c) {
      int const col = get<1>(off(r, c));
      if (col < cols) dst[col] = o_rc(r, c);
    }
  }
}

}  // namespace flashcute
