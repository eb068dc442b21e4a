// Backward postprocess: converts the float32 accumulators of the workspace into the caller's gradients.
//   dq = softmax_scale * dq_accum                       (always; deterministic mode sums its slots first)
//   dk = softmax_scale * dk_accum, dv = dv_accum        (GQA without determinism only; otherwise the main kernel
//                                                         writes dk/dv itself)
// The accumulators hold unscaled sums, so the softmax scale is applied exactly once, here or in the main kernel's
// dK epilogue. Stores are bounded by each sequence's rows and by head_dim / head_dim_v.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

#include "common/kernel_params.h"
#include "sm80/bwd_preprocess.cuh"  // BwdRowKernel

namespace flashcute::sm80 {

// rows x cols (cols < the accumulator's width, a multiple of 8) of a float32 tile, times scale, into Element
// rows; one 16-byte store per 8 elements. With slots > 1 the tile is the sum of `slots` tiles slot_stride apart,
// added in slot order (deterministic mode's dQ).
template <class Element>
__device__ __forceinline__ void convert_rows(Element* dst, int64_t dst_row_stride, float const* src,
                                             int64_t src_row_stride, int rows, int cols, float scale,
                                             int slots = 1, int64_t slot_stride = 0) {
  int const vecs = cols / 8;
  cutlass::NumericArrayConverter<Element, float, 8> convert;
  for (int i = threadIdx.x; i < rows * vecs; i += blockDim.x) {
    int const r = i / vecs, c = (i % vecs) * 8;
    float const* s = src + r * src_row_stride + c;
    float4 lo = *reinterpret_cast<float4 const*>(s);
    float4 hi = *reinterpret_cast<float4 const*>(s + 4);
    for (int slot = 1; slot < slots; ++slot) {
      float4 const l = *reinterpret_cast<float4 const*>(s + slot * slot_stride);
      float4 const h = *reinterpret_cast<float4 const*>(s + slot * slot_stride + 4);
      lo.x += l.x, lo.y += l.y, lo.z += l.z, lo.w += l.w;
      hi.x += h.x, hi.y += h.y, hi.z += h.z, hi.w += h.w;
    }
    cutlass::Array<float, 8> f;
    f[0] = lo.x * scale, f[1] = lo.y * scale, f[2] = lo.z * scale, f[3] = lo.w * scale;
    f[4] = hi.x * scale, f[5] = hi.y * scale, f[6] = hi.z * scale, f[7] = hi.w * scale;
    cutlass::Array<Element, 8> const e = convert(f);
    *reinterpret_cast<uint4*>(dst + r * dst_row_stride + c) = *reinterpret_cast<uint4 const*>(&e);
  }
}

// Grid: (ceil(max(seqlen_q, seqlen_k) / kRows), nheads, batch).
template <class Element>
__global__ void __launch_bounds__(BwdRowKernel::kThreads)
    bwd_postprocess_kernel(__grid_constant__ BwdKernelParams const p) {
  constexpr int kRows = BwdRowKernel::kRows;
  int const h = blockIdx.y;
  int const b = blockIdx.z;
  int const row0 = blockIdx.x * kRows;
  SeqInfo const seq = SeqInfo::make(p, b);

  if (row0 < seq.seqlen_q) {
    int64_t const bh = (int64_t)b * p.nheads + h;
    Element* dq = static_cast<Element*>(p.dq) + seq.q_offset(p, b, p.dq_batch_stride, p.dq_row_stride) +
                  h * p.dq_head_stride + (int64_t)row0 * p.dq_row_stride;
    float const* acc = p.dq_accum + (bh * p.seqlen_q_rounded + row0) * p.head_dim_rounded;
    convert_rows(dq, p.dq_row_stride, acc, p.head_dim_rounded, min(kRows, seq.seqlen_q - row0), p.head_dim,
                 p.softmax_scale, p.dq_slots, p.dq_slot_elems);
  }

  bool const kv_accum = p.nheads != p.nheads_kv && !p.deterministic;
  if (kv_accum && h < p.nheads_kv) {
    // Every row the sequence owns, also those past seqused_k, whose accumulators stayed zero.
    int const key_rows = p.cu_seqlens_k ? p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b] : p.seqlen_k;
    if (row0 < key_rows) {
      int const rows = min(kRows, key_rows - row0);
      int64_t const acc_stride = (int64_t)p.nheads_kv * p.head_dim_rounded;
      int64_t const acc_off = ((int64_t)b * p.seqlen_k_rounded + row0) * acc_stride + (int64_t)h * p.head_dim_rounded;
      Element* dk = static_cast<Element*>(p.dk) + seq.k_offset(p, b, p.dk_batch_stride, p.dk_row_stride) +
                    h * p.dk_head_stride + (int64_t)row0 * p.dk_row_stride;
      Element* dv = static_cast<Element*>(p.dv) + seq.k_offset(p, b, p.dv_batch_stride, p.dv_row_stride) +
                    h * p.dv_head_stride + (int64_t)row0 * p.dv_row_stride;
      convert_rows(dk, p.dk_row_stride, p.dk_accum + acc_off, acc_stride, rows, p.head_dim, p.softmax_scale);
      convert_rows(dv, p.dv_row_stride, p.dv_accum + acc_off, acc_stride, rows, p.head_dim_v, 1.f);
    }
  }
}

}  // namespace flashcute::sm80
