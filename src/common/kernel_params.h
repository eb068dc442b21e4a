// What a kernel receives: the validated API params reduced to what device code reads (int sizes, folded scales).
#pragma once

#include <cstdint>

#include "common/hostdevice.h"
#include "common/mask.h"

namespace flashcute {

// Split-KV's largest num_splits: the C API refuses more, and fwd_combine_kernel keeps a weight per split.
constexpr int kMaxSplits = 256;

// Query rows per turn word of the deterministic dQ order (common/bwd_dq_order.cuh, src/api/workspace.h).
constexpr int kDqTurnRows = 4;

// exp(x) = exp2(x * log2(e)): scores, lse and sinks enter the kernels' exp2 in these units.
constexpr float kLog2e = 1.4426950408889634f;

// One varlen sequence as the kernels see it. The prepare pass derives it from cu_seqlens_q/k and seqused_k without
// trusting them: the rows lie inside the packed tensors (total_q / total_k) and number at most the declared maxima
// (seqlen_q / seqlen_k), which size the grids and the backward's workspace; consistent offsets pass unchanged.
// Reading a ready table costs the kernels no more than reading the offsets did: the clamping arithmetic inside the
// mainloop kernels made ptxas spill (bench/RESULTS.md, seventh session).
struct SeqSpan {
  int q_row0;    // first packed row of the sequence's queries
  int seqlen_q;  // its query rows (seqused_q when given: the rows past it are padding)
  int k_row0;    // first packed row of its keys
  int key_rows;  // the key rows it owns (each gets a gradient)
  int seqlen_k;  // the keys that take part: min(seqused_k, key_rows) when seqused_k is given
};

// Division of 0 <= j < 2^31 by a divisor d >= 1 fixed on the host, by a high product and a shift (Granlund and
// Montgomery's unsigned division by a constant): shift = ceil(log2 d), magic = floor(2^32 (2^shift - d) / d) + 1
// < 2^32, j / d = (umulhi(j, magic) + j) >> shift; powers of two give magic 1 and j >> shift after the high product
// (0 for j < 2^31). The kernels divide by it where an integer division by a runtime value would compile to some
// twenty instructions: page slots, the forward's tile order (common/tile_scheduler.cuh).
struct IntDivisor {
  int d = 1;
  uint32_t magic = 1;
  int shift = 0;
  static IntDivisor make(int d) {
    IntDivisor v;
    v.d = d > 1 ? d : 1;
    while ((int64_t(1) << v.shift) < v.d) ++v.shift;
    v.magic = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << v.shift) - uint64_t(v.d))) / uint64_t(v.d) + 1);
    return v;
  }
  FLASHCUTE_HD int div(int j) const {
#if defined(__CUDA_ARCH__)
    uint32_t const hi = __umulhi(uint32_t(j), magic);
#else
    uint32_t const hi = uint32_t((uint64_t(uint32_t(j)) * magic) >> 32);
#endif
    return int((hi + uint32_t(j)) >> shift);
  }
};

struct FwdKernelParams {
  void const* q;
  void const* k;
  void const* v;
  void* out;
  float* lse;  // may be null
  float const* learnable_sink;  // may be null: one logit per query head in every row's softmax denominator

  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t out_batch_stride, out_row_stride, out_head_stride;
  int64_t lse_batch_stride, lse_head_stride;

  int batch, seqlen_q, seqlen_k, nheads, nheads_kv, head_dim, head_dim_v;
  int kv_group;  // nheads / nheads_kv

  // Scores enter exp2 as s * log2(e): without softcap s = scale * qk, so the scale folds into one multiplier.
  // With softcap c, s = c * tanh(qk * scale / c): the kernel multiplies by softcap_prescale before tanh and by
  // scale_log2 = c * log2(e) after it.
  float scale_log2;
  float softcap_prescale;  // 0: no softcap
  float softmax_scale;     // for the backward's dQ/dK scaling

  bool causal;
  long long window_left, window_right;

  // Varlen: where each sequence lives, clamped from the caller's offsets by the prepare pass
  // (src/api/varlen_prepare.cu); null for the fixed-length batch.
  SeqSpan const* seq_spans;
  // Varlen without seqused_q / seqused_k: the packed tensors' rows (total_q, total_k), which bound the Hopper
  // kernels' TMA copies; 0 otherwise. A tile copy then reads past the end of a sequence into the next one's rows
  // (or rows after the last sequence), which the kernels treat as rows past a fixed-length sequence: keys masked,
  // query rows with an lse of +inf (P = 0, dS = 0), outputs stored only for the sequence's rows; only Inf or NaN
  // there would reach the results (0 * NaN), which the C API's contract rules out (include/flashcute/flashcute.h).
  // Padding rows (seqused) may hold anything: those batches load with cp.async, zeros past the used rows.
  int packed_rows_q, packed_rows_k;

  // Paged K/V (the fixed-length forward; null otherwise): key j of sequence b is row j % page_size of page
  // page_table[b * page_table_batch_stride + j / page_size], a page starting k_batch_stride (v_batch_stride)
  // elements after the previous one. Entries are device data the host never saw: the kernels clamp them to
  // [0, num_pages), so a bad table reads the wrong page, never outside k or v. j / page_size is page_slots.div(j)
  // (no division in the mainloop). seqused_k (may be null): sequence b's first seqused_k[b] keys take part
  // (clamped to [0, seqlen_k]).
  int const* page_table;
  int64_t page_table_batch_stride;
  int page_size, num_pages;
  IntDivisor page_slots;  // by page_size
  int const* seqused_k;

  // Split-KV (num_splits > 1): blockIdx.z counts (sequence, split) pairs; the CTAs of split s take key tiles
  // [s * per, (s + 1) * per) of their sequence (per = ceil(its key tiles / num_splits)) and write their normalised
  // O and lse in float32 to o_partial / lse_partial, which fwd_combine_kernel merges. Element (s, h, g, c) lives at
  // ((s * nheads + h) * partial_rows + g) * head_dim_v + c, g being the row's slot: b * seqlen_q + row, or its
  // packed row for varlen (partial_rows: batch * seqlen_q, or total_q).
  int num_splits;  // at most kMaxSplits
  // Packed GQA (the C API's packed_gqa; 1: none): row r of a query tile is query row r / packed_gqa for the mask.
  int packed_gqa;
  float* o_partial;
  float* lse_partial;
  int64_t partial_rows;

  // Host only: dynamic shared memory the launcher requests for the mainloop kernel when more than the kernel's
  // own (FLASHCUTE_ARCH emulation pads it so the CTAs per SM match the emulated profile; arch::emulated_smem_request).
  int smem_request;

  // The persistent grid's tile counter (one int in the workspace, zeroed by the launcher before each launch; the
  // Hopper forward outside the decode instantiation): null runs one CTA per tile (common/tile_scheduler.cuh).
  int* tile_counter;
  // Rows ((head, sequence) pairs) per section of the forward's tile order (common/tile_scheduler.cuh); 0 or 1:
  // one row after the other.
  int section_heads;
};

// Whether a forward call takes the kernels' decode instantiation (paged K/V, split-KV, packed GQA), which both
// families launch in place of the plain one so that the plain one keeps its registers.
inline bool uses_decode_kernel(FwdKernelParams const& p) {
  return p.page_table || p.num_splits > 1 || p.packed_gqa > 1;
}

// The dynamic shared memory a launcher requests for a mainloop kernel of kernel_smem bytes: its own, or more where
// FLASHCUTE_ARCH emulation padded it (smem_request).
inline int launch_smem(FwdKernelParams const& p, int kernel_smem) {
  return p.smem_request > kernel_smem ? p.smem_request : kernel_smem;
}

struct BwdKernelParams : FwdKernelParams {
  void const* dout;
  int64_t dout_batch_stride, dout_row_stride, dout_head_stride;
  float const* dlse;  // may be null
  float* dsink;       // may be null (needs learnable_sink): the sink's gradient, (nheads) float32

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
  int dq_slots;           // 1; deterministic mode: CTAs per grid column, or lanes of turns (src/api/workspace.h)
  int64_t dq_slot_elems;  // float32 elements of one dq_accum slot
  bool deterministic;
  // Deterministic mode of a config that orders its dQ additions by turns (common/bwd_dq_order.cuh); null otherwise.
  bool dq_descending;     // the highest key tile adds first (the mask's right side is bounded)
  int* dq_turns;          // one word per kDqTurnRows rows of (batch, nheads, seqlen_q_rounded)
};

// Per-sequence view: offsets and lengths of sequence `b`, for both the fixed-length batch and varlen.
struct SeqInfo {
  int64_t q_row0;  // first packed row of this sequence (varlen) or 0
  int64_t k_row0;
  int seqlen_q;
  int seqlen_k;  // keys that take part

  template <class P>
  FLASHCUTE_HD static SeqInfo make(P const& p, int b) {
    SeqInfo s;
    if (p.seq_spans) {
      SeqSpan const& span = p.seq_spans[b];
      s.q_row0 = span.q_row0, s.seqlen_q = span.seqlen_q;
      s.k_row0 = span.k_row0, s.seqlen_k = span.seqlen_k;
    } else {
      s.q_row0 = s.k_row0 = 0;
      s.seqlen_q = p.seqlen_q, s.seqlen_k = p.seqlen_k;
    }
    return s;
  }

  // Every key row sequence b owns (rows past seqused_k included, which get zero gradients).
  template <class P>
  FLASHCUTE_HD static int key_rows(P const& p, int b) {
    return p.seq_spans ? p.seq_spans[b].key_rows : p.seqlen_k;
  }

  // Element offset of row 0 of this sequence for a tensor with the given batch and row strides.
  template <class P>
  FLASHCUTE_HD int64_t q_offset(P const& p, int b, int64_t batch_stride, int64_t row_stride) const {
    return p.seq_spans ? q_row0 * row_stride : (int64_t)b * batch_stride;
  }
  template <class P>
  FLASHCUTE_HD int64_t k_offset(P const& p, int b, int64_t batch_stride, int64_t row_stride) const {
    return p.seq_spans ? k_row0 * row_stride : (int64_t)b * batch_stride;
  }
  // lse is (B, H, Sq) for the batch and (H, total_q) for varlen.
  template <class P>
  FLASHCUTE_HD int64_t lse_offset(P const& p, int b, int h) const {
    return p.seq_spans ? (int64_t)h * p.lse_head_stride + q_row0
                       : (int64_t)b * p.lse_batch_stride + (int64_t)h * p.lse_head_stride;
  }

  template <class P>
  FLASHCUTE_HD Mask mask(P const& p) const {
    return Mask::make(seqlen_q, seqlen_k, p.causal, p.window_left, p.window_right);
  }
};

}  // namespace flashcute
