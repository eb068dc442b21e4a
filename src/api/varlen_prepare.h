// The varlen prepare pass: one small kernel, launched before every varlen call, that turns the caller's offsets
// (cu_seqlens_q/k, seqused_q/k) into the clamped per-sequence table the kernels read (SeqSpan, common/
// kernel_params.h), and optionally reports on the device whether the offsets were consistent (varlen_status).
// No host copy of the offsets, so varlen calls can be captured in CUDA graphs.
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

// Workspace bytes of the table for `batch` sequences, a multiple of 256.
size_t seq_spans_bytes(int64_t batch);

// Writes the table to spans and, when status is not null, the OR of flashcute_varlen_flag bits (0 when the
// offsets agree with the totals and maxima). Returns a cudaError_t.
int launch_varlen_prepare(VarlenOffsets const& v, SeqSpan* spans, int32_t* status, void* stream);

}  // namespace flashcute
