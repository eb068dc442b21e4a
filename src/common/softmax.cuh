// Online softmax over MMA accumulator fragments (SM80 and SM90 alike, through acc_as_rowcol), in the log2 domain
// with the softmax scale folded into one FFMA per score. Rows of a fragment are spread over the 4 threads of a
// quad, so row reductions are two shuffles.
#pragma once

#include <cmath>

#include "common/cute_utils.cuh"

namespace flashcute {

template <class Op>
CUTE_DEVICE float quad_allreduce(float x, Op op) {
  x = op(x, __shfl_xor_sync(0xffffffff, x, 1));
  x = op(x, __shfl_xor_sync(0xffffffff, x, 2));
  return x;
}

struct MaxOp {
  CUTE_DEVICE float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  CUTE_DEVICE float operator()(float a, float b) const { return a + b; }
};

// A row whose running max is still -inf (no visible key yet) subtracts 0 instead, so exp2 gives 0, not NaN.
CUTE_DEVICE float finite_or_zero(float m) { return m == -INFINITY ? 0.f : m; }

// kChains: a row's max and sum over this thread's columns as that many interleaved chains, combined at the end, so
// that consecutive FMNMX / FADD do not each wait for the one before.
template <int kRows, int kChains = 1>
struct OnlineSoftmax {
  float row_max[kRows];
  float row_sum[kRows];

  CUTE_DEVICE OnlineSoftmax() {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) row_max[r] = -INFINITY, row_sum[r] = 0.f;
  }

  // scores (raw, masked with -inf) become unnormalised probabilities exp2(s * scale_log2 - max); acc_o is
  // rescaled by how much each row's max moved.
  template <class AccS, class AccO>
  CUTE_DEVICE void update(AccS& acc_s, AccO& acc_o, float scale_log2) {
    float correction[kRows];
    scores(acc_s, scale_log2, correction);
    rescale(acc_o, correction);
  }

  // update() in two halves, for kernels whose P.V MMA still reads acc_o while the next scores are turned into
  // probabilities: scores() leaves in correction[] what rescale() must later multiply each row of acc_o by.
  template <class AccS>
  CUTE_DEVICE void scores(AccS& acc_s, float scale_log2, float (&correction)[kRows]) {
    Tensor s = make_tensor(acc_s.data(), acc_as_rowcol(acc_s.layout()));  // (rows, cols)
    static_assert(decltype(size<0>(s))::value == kRows);
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float m = row_reduce(s, r, MaxOp{}, row_max[r]);
      m = quad_allreduce(m, MaxOp{});
      correction[r] = exp2f((row_max[r] - finite_or_zero(m)) * scale_log2);
      row_max[r] = m;
      float const max_scaled = finite_or_zero(m) * scale_log2;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(s); ++c) s(r, c) = exp2f(s(r, c) * scale_log2 - max_scaled);
      float const sum = row_reduce(s, r, SumOp{}, 0.f);
      // The sum stays thread-local until finish: one reduction per row instead of one per tile.
      row_sum[r] = row_sum[r] * correction[r] + sum;
    }
  }

  // op over init and row r's columns, in kChains interleaved chains (one chain: the columns in order).
  template <class S, class Op>
  CUTE_DEVICE static float row_reduce(S const& s, int r, Op op, float init) {
    constexpr int kCols = decltype(size<1>(s))::value;
    constexpr int kN = kChains < kCols ? kChains : kCols;
    float part[kN];
    CUTE_UNROLL
    for (int k = 0; k < kN; ++k) part[k] = k == 0 ? op(init, s(r, 0)) : s(r, k);
    CUTE_UNROLL
    for (int c = kN; c < kCols; ++c) part[c % kN] = op(part[c % kN], s(r, c));
    CUTE_UNROLL
    for (int w = 1; w < kN; w *= 2) {
      CUTE_UNROLL
      for (int k = 0; k + w < kN; k += 2 * w) part[k] = op(part[k], part[k + w]);
    }
    return part[0];
  }

  // rescale(), skipped by a warp none of whose rows' max moved (every correction exactly 1: the same bits). Warp-
  // uniform, so that a warp's lanes do not diverge.
  template <class AccO>
  CUTE_DEVICE static void rescale_if_moved(AccO& acc_o, float const (&correction)[kRows]) {
    bool moved = false;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) moved |= correction[r] != 1.f;
    if (__any_sync(0xffffffffu, moved)) rescale(acc_o, correction);
  }

  template <class AccO>
  CUTE_DEVICE static void rescale(AccO& acc_o, float const (&correction)[kRows]) {
    Tensor o = make_tensor(acc_o.data(), acc_as_rowcol(acc_o.layout()));  // (rows, head_dim cols)
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      CUTE_UNROLL
      for (int c = 0; c < size<1>(o); ++c) o(r, c) *= correction[r];
    }
  }

  // Each row's normaliser (0 for a row that saw no key) and lse (natural log; -inf for such rows), for kernels
  // that scale O as they store it. A learnable sink (sink_log2 = its logit * log2(e); -inf: none) joins every
  // row's denominator as one more logit without a value row: the row's scale then moves to the larger of its
  // max score and the sink, and a row that saw no key gets out 0 and lse = the sink (flashcute.h).
  CUTE_DEVICE void finish(float scale_log2, float (&inv)[kRows], float (&lse)[kRows],
                          float sink_log2 = -INFINITY) const {
    constexpr float kLn2 = 0.6931471805599453f;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float const sum = quad_allreduce(row_sum[r], SumOp{});
      bool const empty = sum == 0.f || sum != sum;
      if (sink_log2 == -INFINITY) {
        inv[r] = empty ? 0.f : 1.f / sum;
        lse[r] = empty ? -INFINITY : (row_max[r] * scale_log2 + __log2f(sum)) * kLn2;
      } else {
        // O and sum are relative to the row max (scaled): rescale both to top = max(row max, sink) first.
        float const row_top = empty ? -INFINITY : row_max[r] * scale_log2;
        float const top = fmaxf(row_top, sink_log2);
        float const keep = exp2f(row_top - top);  // 0 for an empty row
        float const total = (empty ? 0.f : sum) * keep + exp2f(sink_log2 - top);
        inv[r] = keep / total;
        lse[r] = (top + __log2f(total)) * kLn2;
      }
    }
  }

  // Normalise acc_o and return each row's lse (natural log); rows that saw no key give out 0, lse -inf (or the
  // sink's logit, see finish).
  template <class AccO>
  CUTE_DEVICE void finalize(AccO& acc_o, float scale_log2, float (&lse)[kRows], float sink_log2 = -INFINITY) const {
    float inv[kRows];
    finish(scale_log2, inv, lse, sink_log2);
    rescale(acc_o, inv);
  }
};

}  // namespace flashcute
