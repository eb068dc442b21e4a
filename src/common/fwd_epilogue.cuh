// What the forward epilogues of both families share.
#pragma once

#include <cute/tensor.hpp>

#include "common/cute_utils.cuh"
#include "common/kernel_params.h"

namespace flashcute {

// The learnable sink of head h in exp2 units (its logit times log2(e)), or -inf where there is none.
CUTE_DEVICE float sink_log2(FwdKernelParams const& p, int h) {
  return p.learnable_sink ? p.learnable_sink[h] * kLog2e : -INFINITY;
}

// Writes each row's lse (rows of this block below the sequence's end) from the thread of its quad that holds
// column 0. thr is this thread's slice of the MMA whose accumulators held O, tile O's (kBlockM, head dim) shape.
template <int kRows, class ThrMma, class Tile>
CUTE_DEVICE void store_lse(FwdKernelParams const& p, ThrMma const& thr, Tile tile, SeqInfo const& seq, int b, int h,
                           int m0, float const (&lse)[kRows]) {
  if (!p.lse) return;
  Tensor c = thr.partition_C(make_identity_tensor(tile));
  Tensor c_rc = make_tensor(c.data(), acc_as_rowcol(c.layout()));
  if (get<1>(c_rc(0, 0)) != 0) return;
  float* lse_ptr = p.lse + seq.lse_offset(p, b, h);
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    int const row = m0 + get<0>(c_rc(r, 0));
    if (row < seq.seqlen_q) lse_ptr[row] = lse[r];
  }
}

}  // namespace flashcute
