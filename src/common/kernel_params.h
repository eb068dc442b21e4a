// What a kernel receives: the validated API params reduced to what device code reads (int sizes, folded scales).
#pragma once

#include <cstdint>

#include "common/hostdevice.h"
#include "common/mask.h"

namespace flashcute {

struct FwdKernelParams {
  void const* q;
  void const* k;
  void const* v;
  void* out;
  float* lse;  // may be null

  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t out_batch_stride, out_row_stride, out_head_stride;
  int64_t lse_batch_stride, lse_head_stride;

  int batch, seqlen_q, seqlen_k, nheads, nheads_kv, head_dim, head_dim_v;
  int kv_group;          // nheads / nheads_kv
  int total_q, total_k;  // varlen: packed rows of q/out and k/v, the bounds every sequence is clamped to

  // Scores enter exp2 as s * log2(e): without softcap s = scale * qk, so the scale folds into one multiplier.
  // With softcap c, s = c * tanh(qk * scale / c): the kernel multiplies by softcap_prescale before tanh and by
  // scale_log2 = c * log2(e) after it.
  float scale_log2;
  float softcap_prescale;  // 0: no softcap
  float softmax_scale;     // for the backward's dQ/dK scaling

  bool causal;
  long long window_left, window_right;

  int const* cu_seqlens_q;
  int const* cu_seqlens_k;
  int const* seqused_k;
};

struct BwdKernelParams : FwdKernelParams {
  void const* dout;
  int64_t dout_batch_stride, dout_row_stride, dout_head_stride;
  float const* dlse;  // may be null

  void* dq;
  void* dk;
  void* dv;
  int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
  int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
  int64_t dv_batch_stride, dv_row_stride, dv_head_stride;

  // Workspace carved by the launch code (see src/api/workspace).
  float* dq_accum;      // (slots, batch, nheads, seqlen_q_rounded * head_dim_rounded), tiles in fragment order
  float* dsoftmax_sum;  // D_i = rowsum(dO * O)_i - dlse_i, (batch, nheads, seqlen_q_rounded)
  float* lse_log2;      // lse * log2(e) with -inf rows mapped to +inf so exp2 gives 0, same layout as dsoftmax_sum
  float* dk_accum;      // GQA only: (batch, seqlen_k_rounded, nheads_kv, head_dim_rounded) float32
  float* dv_accum;      // GQA only
  int seqlen_q_rounded, seqlen_k_rounded, head_dim_rounded;
  int dq_slots;           // 1, or in deterministic mode the CTAs per grid column (see src/api/workspace.h)
  int64_t dq_slot_elems;  // float32 elements of one dq_accum slot
  bool deterministic;
};

// Per-sequence view: offsets and lengths of sequence `b`, for both the fixed-length batch and varlen.
// Varlen offsets are clamped, never trusted: whatever cu_seqlens and seqused_k hold, a sequence stays inside the
// packed rows (total_q / total_k) and within the declared maxima (seqlen_q / seqlen_k), which size the grids and
// the backward's workspace. Consistent offsets pass through unchanged; the API's optional check reports the rest.
struct SeqInfo {
  int64_t q_row0;  // first packed row of this sequence (varlen) or 0
  int64_t k_row0;
  int seqlen_q;
  int seqlen_k;  // keys that take part: seqused_k when given

  // Rows [row0, row0 + length) of sequence b in `total` packed rows: the start clamped into [0, total], the end
  // into [start, total], the length to max_len.
  FLASHCUTE_HD static int span(int const* cu, int b, int total, int max_len, int64_t& row0) {
    int const lo = Mask::imin(Mask::imax(cu[b], 0), total);
    int const hi = Mask::imin(Mask::imax(cu[b + 1], lo), total);
    row0 = lo;
    return Mask::imin(hi - lo, max_len);
  }

  // Every key row sequence b owns (rows past seqused_k included, which get zero gradients).
  template <class P>
  FLASHCUTE_HD static int key_rows(P const& p, int b) {
    int64_t row0;
    return p.cu_seqlens_k ? span(p.cu_seqlens_k, b, p.total_k, p.seqlen_k, row0) : p.seqlen_k;
  }

  template <class P>
  FLASHCUTE_HD static SeqInfo make(P const& p, int b) {
    SeqInfo s;
    s.q_row0 = s.k_row0 = 0;
    s.seqlen_q = p.cu_seqlens_q ? span(p.cu_seqlens_q, b, p.total_q, p.seqlen_q, s.q_row0) : p.seqlen_q;
    s.seqlen_k = p.cu_seqlens_k ? span(p.cu_seqlens_k, b, p.total_k, p.seqlen_k, s.k_row0) : p.seqlen_k;
    if (p.seqused_k) s.seqlen_k = Mask::imin(Mask::imax(p.seqused_k[b], 0), s.seqlen_k);
    return s;
  }

  // Element offset of row 0 of this sequence for a tensor with the given batch and row strides.
  template <class P>
  FLASHCUTE_HD int64_t q_offset(P const& p, int b, int64_t batch_stride, int64_t row_stride) const {
    return p.cu_seqlens_q ? q_row0 * row_stride : (int64_t)b * batch_stride;
  }
  template <class P>
  FLASHCUTE_HD int64_t k_offset(P const& p, int b, int64_t batch_stride, int64_t row_stride) const {
    return p.cu_seqlens_k ? k_row0 * row_stride : (int64_t)b * batch_stride;
  }
  // lse is (B, H, Sq) for the batch and (H, total_q) for varlen.
  template <class P>
  FLASHCUTE_HD int64_t lse_offset(P const& p, int b, int h) const {
    return p.cu_seqlens_q ? (int64_t)h * p.lse_head_stride + q_row0
                          : (int64_t)b * p.lse_batch_stride + (int64_t)h * p.lse_head_stride;
  }

  template <class P>
  FLASHCUTE_HD Mask mask(P const& p) const {
    return Mask::make(seqlen_q, seqlen_k, p.causal, p.window_left, p.window_right);
  }
};

}  // namespace flashcute
