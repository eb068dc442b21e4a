// The backward's elementwise step on one score tile, for every backward family (DESIGN.md section 2):
//   P = exp2(S * scale_log2 - lse_log2),  dS = P * (dP - D)   (times 1 - t^2 under a softcap, t = tanh(x / c))
// s and ds are (rows, cols) views of the S and dP accumulators, overwritten with P and dS. term(r, c) is the index
// of element (r, c)'s query in the row-term arrays lse2 (lse * log2 e) and dsum (D): its row in the portable
// family's S, its column in the Hopper family's S^T.
#pragma once

#include <cute/tensor.hpp>

#include "common/cute_utils.cuh"  // tanh_accurate

namespace flashcute {

// Tiles that need masking or a softcap. mask() sets the masked scores to -inf; it runs after the softcap's
// derivative factor, since a masked score must only ever meet exp2, never t * t.
template <class S, class DS, class Term, class MaskFn>
CUTE_DEVICE void grads_general(S& s, DS& ds, float const* lse2, float const* dsum, Term const& term,
                               float softcap_prescale, float scale_log2, MaskFn&& mask) {
  constexpr int kRows = decltype(size<0>(s))::value;
  constexpr int kCols = decltype(size<1>(s))::value;
  if (softcap_prescale != 0.f) {
    // s = c * tanh(x / c) enters exp2 as t * (c * log2 e) with t = tanh(x / c); ds/dx = 1 - t^2.
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      CUTE_UNROLL
      for (int c = 0; c < kCols; ++c) {
        float const t = tanh_accurate(s(r, c) * softcap_prescale);
        s(r, c) = t;
        ds(r, c) = (ds(r, c) - dsum[term(r, c)]) * (1.f - t * t);
      }
    }
  } else {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      CUTE_UNROLL
      for (int c = 0; c < kCols; ++c) ds(r, c) -= dsum[term(r, c)];
    }
  }
  mask();
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    CUTE_UNROLL
    for (int c = 0; c < kCols; ++c) {
      // -inf scores and +inf lse_log2 both give exp2(-inf) = 0; neither can make NaN here.
      float const pr = exp2f(fmaf(s(r, c), scale_log2, -lse2[term(r, c)]));
      s(r, c) = pr;
      ds(r, c) *= pr;
    }
  }
}

// Tiles every row sees in full, without softcap, in two halves so that P's exponentials can overlap the dP product.
template <class S, class Term>
CUTE_DEVICE void probs_plain(S& s, float const* lse2, Term const& term, float scale_log2) {
  CUTE_UNROLL
  for (int r = 0; r < decltype(size<0>(s))::value; ++r) {
    CUTE_UNROLL
    for (int c = 0; c < decltype(size<1>(s))::value; ++c) s(r, c) = exp2f(fmaf(s(r, c), scale_log2, -lse2[term(r, c)]));
  }
}

template <class DS, class S, class Term>
CUTE_DEVICE void grads_plain(DS& ds, S const& s, float const* dsum, Term const& term) {
  CUTE_UNROLL
  for (int r = 0; r < decltype(size<0>(ds))::value; ++r) {
    CUTE_UNROLL
    for (int c = 0; c < decltype(size<1>(ds))::value; ++c) ds(r, c) = (ds(r, c) - dsum[term(r, c)]) * s(r, c);
  }
}

}  // namespace flashcute
