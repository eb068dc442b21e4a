// Split-KV's second pass, for both forward families: each query row's partial results over the chunks of its keys
// (normalised O_s and lse_s in float32, kernel_params.h) become out = sum_s exp(lse_s - lse) O_s and
// lse = log(sum_s exp(lse_s) + exp(sink)), the learnable sink joining here (the split CTAs run without it). One
// warp per (row, head): its lanes share the splits' weights (shared memory), then each takes four adjacent columns
// of head_dim_v at a time and loads them from every split before adding any, so a decode call (a few rows, 16-64
// splits) waits for memory about twice, not once per split. Rows are each sequence's own (SeqInfo), so the padding
// rows of a varlen batch stay as the caller left them. A chunk that saw no key has lse_s = -inf and adds nothing.
#pragma once

#include <cuda_runtime.h>

#include <cute/tensor.hpp>

#include "common/kernel_params.h"

namespace flashcute {

constexpr int kCombineWarps = 4;
constexpr int kCombineBatch = 8;  // splits whose columns are loaded before the first of them is added

template <class Element>
__global__ void __launch_bounds__(32 * kCombineWarps) fwd_combine_kernel(__grid_constant__ FwdKernelParams const p) {
  __shared__ float weights[kCombineWarps][kMaxSplits];  // exp(lse_s - top) of each split, 0 where it saw no key
  int const b = blockIdx.z, h = blockIdx.y;
  SeqInfo const seq = SeqInfo::make(p, b);
  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int const row = blockIdx.x * kCombineWarps + warp;
  if (row >= seq.seqlen_q) return;
  int64_t const split_stride = (int64_t)p.nheads * p.partial_rows;
  int64_t const slot = (int64_t)h * p.partial_rows + (p.seq_spans ? seq.q_row0 : (int64_t)b * p.seqlen_q) + row;
  float const sink = p.learnable_sink ? p.learnable_sink[h] : -INFINITY;
  float top = sink;
  for (int s = lane; s < p.num_splits; s += 32) top = fmaxf(top, p.lse_partial[s * split_stride + slot]);
  for (int o = 16; o > 0; o /= 2) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, o));
  Element* out = static_cast<Element*>(p.out) + seq.q_offset(p, b, p.out_batch_stride, p.out_row_stride) +
                 (int64_t)row * p.out_row_stride + (int64_t)h * p.out_head_stride;
  float lse = -INFINITY;
  if (top == -INFINITY) {  // no key in any chunk, and no sink
    for (int c = lane; c < p.head_dim_v; c += 32) out[c] = Element(0.f);
  } else {
    float total = 0.f;
    for (int s = lane; s < p.num_splits; s += 32) {
      float const w = expf(p.lse_partial[s * split_stride + slot] - top);
      weights[warp][s] = w;
      total += w;
    }
    for (int o = 16; o > 0; o /= 2) total += __shfl_xor_sync(0xffffffffu, total, o);
    total += expf(sink - top);  // 0 without a sink
    __syncwarp();
    float const inv = 1.f / total;
    // head_dim_v is a multiple of 8 and every row of o_partial starts 16-byte aligned (a multiple of 4 floats
    // from the workspace's aligned base), so each lane's four columns are one float4.
    float4 const* o_split0 = reinterpret_cast<float4 const*>(p.o_partial + slot * p.head_dim_v);
    int64_t const split_step = split_stride * p.head_dim_v / 4;
    for (int c4 = lane; c4 < p.head_dim_v / 4; c4 += 32) {
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int s0 = 0; s0 < p.num_splits; s0 += kCombineBatch) {
        float4 part[kCombineBatch];
        CUTE_UNROLL
        for (int i = 0; i < kCombineBatch; ++i)
          if (s0 + i < p.num_splits) part[i] = o_split0[(s0 + i) * split_step + c4];
        CUTE_UNROLL
        for (int i = 0; i < kCombineBatch; ++i) {
          if (s0 + i >= p.num_splits) break;
          float const w = weights[warp][s0 + i];
          if (w > 0.f) {  // a chunk without keys may hold anything in its O
            acc.x += w * part[i].x;
            acc.y += w * part[i].y;
            acc.z += w * part[i].z;
            acc.w += w * part[i].w;
          }
        }
      }
      Element* dst = out + 4 * c4;
      dst[0] = Element(acc.x * inv);
      dst[1] = Element(acc.y * inv);
      dst[2] = Element(acc.z * inv);
      dst[3] = Element(acc.w * inv);
    }
    lse = top + logf(total);
  }
  if (lane == 0 && p.lse) p.lse[seq.lse_offset(p, b, h) + row] = lse;
}

// After a split forward's main kernel, on the same stream.
template <class Element>
cudaError_t launch_fwd_combine(FwdKernelParams const& p, cudaStream_t stream) {
  dim3 const grid((p.seqlen_q + kCombineWarps - 1) / kCombineWarps, p.nheads, p.batch);
  fwd_combine_kernel<Element><<<grid, 32 * kCombineWarps, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace flashcute
