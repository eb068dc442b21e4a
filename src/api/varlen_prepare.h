// The varlen prepare pass: one small kernel, launched before every varlen call, that turns the caller's offsets
// (cu_seqlens_q/k, seqused_q/k) into the clamped per-sequence table the kernels read (SeqSpan, common/
// kernel_params.h), optionally reports on the device whether the offsets were consistent (varlen_status), and
// writes the output rows no sequence owns (VarlenFill). No host copy of the offsets, so varlen calls can be
// captured in CUDA graphs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/kernel_params.h"

namespace flashcute {

struct VarlenOffsets {
  int32_t const* cu_seqlens_q;
  int32_t const* cu_seqlens_k;
  int32_t const* seqused_q;  // may be null
  int32_t const* seqused_k;  // may be null
  int batch, total_q, total_k, max_seqlen_q, max_seqlen_k;
};

// Outputs whose rows no sequence owns the pass zeroes (lse: sets to -inf) before the attention kernels run: query
// rows before the first sequence, after the last, past a sequence's seqused_q or its seqlen_q; key rows likewise
// (past key_rows). The kernels, launched after it on the stream, write every row a sequence owns, so a row the pass
// takes for unowned by mistake (inconsistent offsets) still ends with the kernels' value.
struct VarlenFill {
  static constexpr int kMaxTensors = 3;
  struct Tensor {
    char* base;                          // 16-bit elements
    int64_t row_bytes, head_bytes;       // strides
    int heads, width_bytes;              // heads x width_bytes per row
    bool key_rows;                       // rows of k / v (dk, dv), else of q (out, dq)
  } tensors[kMaxTensors];
  int count;
  float* lse;  // may be null: (heads, total_q) with lse_head_stride
  int64_t lse_head_stride;
  int lse_heads;
};

// Workspace bytes of the table for `batch` sequences, a multiple of 256.
size_t seq_spans_bytes(int64_t batch);

// Writes the table to spans, the unowned rows of fill's tensors and, when status is not null, the OR of
// flashcute_varlen_flag bits (0 when the offsets agree with the totals and maxima). Returns a cudaError_t.
int launch_varlen_prepare(VarlenOffsets const& v, VarlenFill const& fill, SeqSpan* spans, int32_t* status,
                          void* stream);

}  // namespace flashcute
