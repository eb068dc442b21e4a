#include "api/varlen_check.h"

#include <cuda_runtime.h>

#include "flashcute/flashcute.h"

namespace flashcute {

namespace {

constexpr int kThreads = 256;

// One CTA walks every sequence; the flags are ORed in shared memory and written once, so the status word needs no
// clearing between calls.
__global__ void __launch_bounds__(kThreads) varlen_check_kernel(__grid_constant__ FwdKernelParams const p,
                                                                int32_t* status) {
  __shared__ int flags;
  if (threadIdx.x == 0) flags = 0;
  __syncthreads();
  int mine = 0;
  for (int b = threadIdx.x; b <= p.batch; b += kThreads) {
    int const q = p.cu_seqlens_q[b], k = p.cu_seqlens_k[b];
    if (q < 0 || q > p.total_q) mine |= FLASHCUTE_VARLEN_BAD_CU_SEQLENS_Q;
    if (k < 0 || k > p.total_k) mine |= FLASHCUTE_VARLEN_BAD_CU_SEQLENS_K;
    if (b == p.batch) break;
    long long const q_len = (long long)p.cu_seqlens_q[b + 1] - q, k_len = (long long)p.cu_seqlens_k[b + 1] - k;
    if (q_len < 0) mine |= FLASHCUTE_VARLEN_BAD_CU_SEQLENS_Q;
    if (k_len < 0) mine |= FLASHCUTE_VARLEN_BAD_CU_SEQLENS_K;
    if (q_len > p.seqlen_q) mine |= FLASHCUTE_VARLEN_SEQLEN_Q;
    if (k_len > p.seqlen_k) mine |= FLASHCUTE_VARLEN_SEQLEN_K;
    if (p.seqused_k && (p.seqused_k[b] < 0 || p.seqused_k[b] > k_len)) mine |= FLASHCUTE_VARLEN_SEQUSED_K;
  }
  if (mine) atomicOr(&flags, mine);
  __syncthreads();
  if (threadIdx.x == 0) *status = flags;
}

}  // namespace

int launch_varlen_check(FwdKernelParams const& p, int32_t* status, void* stream) {
  varlen_check_kernel<<<1, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p, status);
  return cudaGetLastError();
}

}  // namespace flashcute
