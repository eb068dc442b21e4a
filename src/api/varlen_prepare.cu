#include "api/varlen_prepare.h"

#include <cuda_runtime.h>

#include "flashcute/flashcute.h"

namespace flashcute {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// CTAs that write unowned rows: each warp takes one row at a time, the rows strided over the grid.
constexpr int kMaxFillCtas = 512;

__device__ __forceinline__ int clamp_to(int x, int lo, int hi) { return min(max(x, lo), hi); }

// Rows [start, end) that sequence b owns on one side (queries: its used query rows; keys: its key rows), clamped as
// the table clamps them.
struct Side {
  int32_t const* cu;
  int32_t const* used;  // may be null
  int total, max_len;
  __device__ int start(int b) const { return clamp_to(cu[b], 0, total); }
  __device__ int end(int b) const {
    int const s = start(b);
    int const len = min(clamp_to(cu[b + 1], s, total) - s, max_len);
    return s + (used ? clamp_to(used[b], 0, len) : len);
  }
  // Whether a sequence owns row r: the last sequence starting at or before r (offsets ascending, so a binary
  // search; for offsets that are not, some sequence's bounds, which is still safe, see VarlenFill).
  __device__ bool owns(int batch, int r) const {
    int lo = 0, hi = batch - 1, b = -1;
    while (lo <= hi) {
      int const mid = (lo + hi) / 2;
      if (start(mid) <= r) b = mid, lo = mid + 1;
      else hi = mid - 1;
    }
    return b >= 0 && r < end(b);
  }
};

// Zeroes row r of tensor t, the warp's lanes striding over 16-byte pieces where the row's heads are 16-byte
// aligned, else over 2-byte elements.
__device__ void zero_row(VarlenFill::Tensor const& t, int r, int lane) {
  char* const row = t.base + (int64_t)r * t.row_bytes;
  bool const wide = ((reinterpret_cast<uintptr_t>(row) | (uintptr_t)t.head_bytes | (uintptr_t)t.width_bytes) & 15) == 0;
  int const piece = wide ? 16 : 2;
  int const pieces = t.width_bytes / piece;
  for (int i = lane; i < t.heads * pieces; i += 32) {
    char* const at = row + (int64_t)(i / pieces) * t.head_bytes + (int64_t)(i % pieces) * piece;
    if (wide) *reinterpret_cast<uint4*>(at) = make_uint4(0, 0, 0, 0);
    else *reinterpret_cast<uint16_t*>(at) = 0;
  }
}

// CTA 0 walks every sequence (a few iterations per thread for any batch the grid allows) and writes the table. The
// flags are ORed in shared memory and written once, so the status word needs no clearing between calls. The other
// CTAs write the unowned rows.
__global__ void __launch_bounds__(kThreads) varlen_prepare_kernel(VarlenOffsets const v, VarlenFill const fill,
                                                                  SeqSpan* spans, int32_t* status) {
  if (blockIdx.x > 0) {
    Side const queries{v.cu_seqlens_q, v.seqused_q, v.total_q, v.max_seqlen_q};
    Side const keys{v.cu_seqlens_k, nullptr, v.total_k, v.max_seqlen_k};
    int const lane = threadIdx.x % 32;
    bool query_side = fill.lse != nullptr, key_side = false;
    for (int t = 0; t < fill.count; ++t) (fill.tensors[t].key_rows ? key_side : query_side) = true;
    // Rows i < total_q are query rows, the others key rows; only the sides that have tensors are walked.
    int const first = query_side ? 0 : v.total_q, last = key_side ? v.total_q + v.total_k : v.total_q;
    for (int i = first + (blockIdx.x - 1) * kWarps + threadIdx.x / 32; i < last; i += (gridDim.x - 1) * kWarps) {
      bool const key_row = i >= v.total_q;
      int const r = key_row ? i - v.total_q : i;
      if ((key_row ? keys : queries).owns(v.batch, r)) continue;
      for (int t = 0; t < fill.count; ++t)
        if (fill.tensors[t].key_rows == key_row) zero_row(fill.tensors[t], r, lane);
      if (fill.lse && !key_row)
        for (int h = lane; h < fill.lse_heads; h += 32) fill.lse[h * fill.lse_head_stride + r] = __int_as_float(0xff800000);  // -inf
    }
    return;
  }
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

int launch_varlen_prepare(VarlenOffsets const& v, VarlenFill const& fill, SeqSpan* spans, int32_t* status,
                          void* stream) {
  long long const rows = (fill.count || fill.lse) ? (long long)v.total_q + v.total_k : 0;
  long long const ctas = (rows + kWarps - 1) / kWarps;
  int const fill_ctas = (int)(ctas < kMaxFillCtas ? ctas : kMaxFillCtas);
  varlen_prepare_kernel<<<1 + fill_ctas, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(v, fill, spans, status);
  return cudaGetLastError();
}

}  // namespace flashcute
