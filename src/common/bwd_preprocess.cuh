// Backward preprocess: per (sequence, head, row) the row terms the main kernel reads, and a zeroed workspace.
//   dsoftmax_sum[b, h, i] = rowsum(dO * O)_i - dlse_i     (D of DESIGN.md section 2)
//   lse_log2[b, h, i]     = lse_i * log2(e), with -inf (a row that saw no key) mapped to +inf
// Rows in [seqlen_q, seqlen_q_rounded) get D = 0 and lse_log2 = +inf, so the main kernel's padded query rows give
// P = exp2(s - inf) = 0 without a row test. Varlen sequences use their own region of the rounded maximum length.
#pragma once

#include <cmath>
#include <cstdint>

#include <cuda_runtime.h>
#include <cutlass/numeric_conversion.h>

#include "common/bwd_dq_order.cuh"  // DqTurns::lane_words
#include "common/kernel_params.h"

namespace flashcute {

struct BwdRowKernel {
  static constexpr int kThreads = 256;
  static constexpr int kRows = 128;        // rows per CTA: the workspace's row rounding, so row ranges stay whole
  static constexpr int kLanesPerRow = 8;   // each lane takes 16-byte vectors, 8 apart
  static constexpr int kVec = 8;           // 16-bit elements per 16-byte vector
};

// Sum of a*b over 8 packed 16-bit elements, in float32.
template <class Element>
__device__ __forceinline__ float dot8(uint4 const& a, uint4 const& b) {
  auto const& ea = *reinterpret_cast<cutlass::Array<Element, 8> const*>(&a);
  auto const& eb = *reinterpret_cast<cutlass::Array<Element, 8> const*>(&b);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) s = fmaf(float(ea[i]), float(eb[i]), s);
  return s;
}

// Zeroes `rows` rows of `cols` floats (cols a multiple of 4) with the given row stride, the whole CTA helping.
__device__ __forceinline__ void zero_rows_f32(float* base, int64_t row_stride, int rows, int cols) {
  int const vecs = cols / 4;
  for (int i = threadIdx.x; i < rows * vecs; i += blockDim.x) {
    int const r = i / vecs, c = (i % vecs) * 4;
    *reinterpret_cast<float4*>(base + r * row_stride + c) = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// Grid: (ceil(max(seqlen_q_rounded, seqlen_k_rounded) / kRows), nheads, batch).
template <class Element>
__global__ void __launch_bounds__(BwdRowKernel::kThreads)
    bwd_preprocess_kernel(__grid_constant__ BwdKernelParams const p) {
  using K = BwdRowKernel;
  int const h = blockIdx.y;
  int const b = blockIdx.z;
  int const row0 = blockIdx.x * K::kRows;
  SeqInfo const seq = SeqInfo::make(p, b);
  int64_t const bh = (int64_t)b * p.nheads + h;

  if (row0 < p.seqlen_q_rounded) {
    Element const* do_ptr = static_cast<Element const*>(p.dout) +
                            seq.q_offset(p, b, p.dout_batch_stride, p.dout_row_stride) + h * p.dout_head_stride;
    Element const* o_ptr = static_cast<Element const*>(p.out) +
                           seq.q_offset(p, b, p.out_batch_stride, p.out_row_stride) + h * p.out_head_stride;
    int64_t const lse_off = seq.lse_offset(p, b, h);
    int const lane = threadIdx.x % K::kLanesPerRow;
    constexpr int kRowsPerPass = K::kThreads / K::kLanesPerRow;
    // Every lane runs every pass (rows past the sequence just add nothing), so the shuffles see full warps.
#pragma unroll 1
    for (int pass = 0; pass < K::kRows / kRowsPerPass; ++pass) {
      int const row = row0 + pass * kRowsPerPass + threadIdx.x / K::kLanesPerRow;
      bool const valid = row < seq.seqlen_q;
      float dot = 0.f;
      if (valid) {
        Element const* dor = do_ptr + (int64_t)row * p.dout_row_stride;
        Element const* orr = o_ptr + (int64_t)row * p.out_row_stride;
        for (int c = lane * K::kVec; c < p.head_dim_v; c += K::kLanesPerRow * K::kVec)
          dot += dot8<Element>(*reinterpret_cast<uint4 const*>(dor + c), *reinterpret_cast<uint4 const*>(orr + c));
      }
#pragma unroll
      for (int o = 1; o < K::kLanesPerRow; o *= 2) dot += __shfl_xor_sync(0xffffffffu, dot, o);
      if (lane == 0) {
        float d = 0.f, lse2 = INFINITY;
        if (valid) {
          float const lse = p.lse[lse_off + row];
          d = dot - (p.dlse ? p.dlse[lse_off + row] : 0.f);
          // exp2(s * scale_log2 - lse_log2) must be 0 on a row that saw no key: (-inf) - (-inf) would be NaN.
          lse2 = lse == -INFINITY ? INFINITY : lse * kLog2e;
        }
        p.dsoftmax_sum[bh * p.seqlen_q_rounded + row] = d;
        p.lse_log2[bh * p.seqlen_q_rounded + row] = lse2;
      }
    }
    for (int slot = 0; slot < p.dq_slots; ++slot)
      zero_rows_f32(p.dq_accum + slot * p.dq_slot_elems + (bh * p.seqlen_q_rounded + row0) * p.head_dim_rounded,
                    p.head_dim_rounded, K::kRows, p.head_dim_rounded);
    if (p.dq_turns && threadIdx.x < K::kRows / kDqTurnRows) {
      for (int lane = 0; lane < p.dq_slots; ++lane)
        p.dq_turns[lane * DqTurns::lane_words(p) + (bh * p.seqlen_q_rounded + row0) / kDqTurnRows + threadIdx.x] = 0;
    }
  }

  // GQA without determinism: the query heads of a group add dK/dV into float32 accumulators.
  bool const kv_accum = p.nheads != p.nheads_kv && !p.deterministic;
  if (kv_accum && h < p.nheads_kv && row0 < p.seqlen_k_rounded) {
    int64_t const row_stride = (int64_t)p.nheads_kv * p.head_dim_rounded;
    int64_t const off = ((int64_t)b * p.seqlen_k_rounded + row0) * row_stride + (int64_t)h * p.head_dim_rounded;
    zero_rows_f32(p.dk_accum + off, row_stride, K::kRows, p.head_dim_rounded);
    zero_rows_f32(p.dv_accum + off, row_stride, K::kRows, p.head_dim_rounded);
  }
}

// The learnable sink's gradient, as reference/reference.cpp derives it: dsink[h] = -sum_i exp(sink_h - lse_i) D_i
// over the query rows of head h in every sequence, from the row terms the preprocess wrote (padded rows, and rows
// without keys or sink, hold lse_log2 = +inf and add 0). One CTA per query head, each thread a fixed stride of
// rows, then a fixed-order reduction: the same bits on every run. (A template, as the other passes, so that every
// translation unit may hold it.)
template <int kThreads>
__global__ void __launch_bounds__(kThreads) bwd_dsink_kernel(__grid_constant__ BwdKernelParams const p) {
  constexpr int kWarps = kThreads / 32;
  __shared__ float warp_sums[kWarps];
  int const h = blockIdx.x;
  float const sink_log2 = p.learnable_sink[h] * kLog2e;
  float sum = 0.f;
  for (int b = 0; b < p.batch; ++b) {
    int64_t const base = ((int64_t)b * p.nheads + h) * p.seqlen_q_rounded;
    for (int i = threadIdx.x; i < p.seqlen_q_rounded; i += kThreads)
      sum += exp2f(sink_log2 - p.lse_log2[base + i]) * p.dsoftmax_sum[base + i];
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += warp_sums[w];
    p.dsink[h] = -total;
  }
}

}  // namespace flashcute
