#include "api/varlen_prepare.h"

#include <cuda_runtime.h>

#include "flashcute/flashcute.h"

namespace flashcute {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ int clamp_to(int x, int lo, int hi) { return min(max(x, lo), hi); }

// One CTA walks every sequence (a few iterations per thread for any batch the grid allows). The flags are ORed in
// shared memory and written once, so the status word needs no clearing between calls.
__global__ void __launch_bounds__(kThreads) varlen_prepare_kernel(VarlenOffsets const v, SeqSpan* spans,
                                                                  int32_t* status) {
  __shared__ int flags;
  if (threadIdx.x == 0) flags = 0;
  __syncthreads();
  int mine = 0;
  for (int b = threadIdx.x; b <= v.batch; b += kThreads) {
    int const q0 = v.cu_seqlens_q[b], k0 = v.cu_seqlens_k[b];
    if (q0 < 0 || q0 > v.total_q) mine |= FLASHCUTE_VARLEN_BAD_CU_SEQLENS_Q;
    if (k0 < 0 || k0 > v.total_k) mine |= FLASHCUTE_VARLEN_BAD_CU_SEQLENS_K;
    if (b == v.batch) break;
    int const q1 = v.cu_seqlens_q[b + 1], k1 = v.cu_seqlens_k[b + 1];
    long long const q_len = (long long)q1 - q0, k_len = (long long)k1 - k0;
    if (q_len < 0) mine |= FLASHCUTE_VARLEN_BAD_CU_SEQLENS_Q;
    if (k_len < 0) mine |= FLASHCUTE_VARLEN_BAD_CU_SEQLENS_K;
    if (q_len > v.max_seqlen_q) mine |= FLASHCUTE_VARLEN_SEQLEN_Q;
    if (k_len > v.max_seqlen_k) mine |= FLASHCUTE_VARLEN_SEQLEN_K;
    if (v.seqused_k && (v.seqused_k[b] < 0 || v.seqused_k[b] > k_len)) mine |= FLASHCUTE_VARLEN_SEQUSED_K;
    if (v.seqused_q && (v.seqused_q[b] < 0 || v.seqused_q[b] > q_len)) mine |= FLASHCUTE_VARLEN_SEQUSED_Q;
    // The sequence the kernels see: start inside the rows, end between the start and the rows' end, length at most
    // the declared maximum. Consistent offsets come out unchanged.
    SeqSpan s;
    s.q_row0 = clamp_to(q0, 0, v.total_q);
    s.seqlen_q = min(clamp_to(q1, s.q_row0, v.total_q) - s.q_row0, v.max_seqlen_q);
    if (v.seqused_q) s.seqlen_q = clamp_to(v.seqused_q[b], 0, s.seqlen_q);
    s.k_row0 = clamp_to(k0, 0, v.total_k);
    s.key_rows = min(clamp_to(k1, s.k_row0, v.total_k) - s.k_row0, v.max_seqlen_k);
    s.seqlen_k = v.seqused_k ? clamp_to(v.seqused_k[b], 0, s.key_rows) : s.key_rows;
    spans[b] = s;
  }
  if (mine) atomicOr(&flags, mine);
  __syncthreads();
  if (threadIdx.x == 0 && status) *status = flags;
}

}  // namespace

size_t seq_spans_bytes(int64_t batch) { return (sizeof(SeqSpan) * (size_t)batch + 255) / 256 * 256; }

int launch_varlen_prepare(VarlenOffsets const& v, SeqSpan* spans, int32_t* status, void* stream) {
  varlen_prepare_kernel<<<1, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(v, spans, status);
  return cudaGetLastError();
}

}  // namespace flashcute
