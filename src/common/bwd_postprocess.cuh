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

#include "common/cute_utils.cuh"
#include "common/kernel_params.h"
#include "common/bwd_preprocess.cuh"  // BwdRowKernel

namespace flashcute {

// rows x cols (cols < the accumulator's width, a multiple of 8) of a row-major float32 tile, times scale, into
// Element rows; one 16-byte store per 8 elements.
template <class Element>
__device__ __forceinline__ void convert_rows(Element* dst, int64_t dst_row_stride, float const* src,
                                             int64_t src_row_stride, int rows, int cols, float scale) {
  int const vecs = cols / 8;
  cutlass::NumericArrayConverter<Element, float, 8> convert;
  for (int i = threadIdx.x; i < rows * vecs; i += blockDim.x) {
    int const r = i / vecs, c = (i % vecs) * 8;
    float const* s = src + r * src_row_stride + c;
    float4 const lo = *reinterpret_cast<float4 const*>(s);
    float4 const hi = *reinterpret_cast<float4 const*>(s + 4);
    cutlass::Array<float, 8> f;
    f[0] = lo.x * scale, f[1] = lo.y * scale, f[2] = lo.z * scale, f[3] = lo.w * scale;
    f[4] = hi.x * scale, f[5] = hi.y * scale, f[6] = hi.z * scale, f[7] = hi.w * scale;
    cutlass::Array<Element, 8> const e = convert(f);
    *reinterpret_cast<uint4*>(dst + r * dst_row_stride + c) = *reinterpret_cast<uint4 const*>(&e);
  }
}

// dq of one (kBlockM, D) query tile per CTA: the accumulator is read in the main kernel's fragment order
// (T::dq_frag_offset; T is either family's BwdTraits), the slots summed in slot order, and the tile goes through
// shared memory so the stores are 16-byte vectors along rows. Grid: (ceil(seqlen_q / kBlockM), nheads, batch),
// T::kThreads threads.
template <class T>
__global__ void __launch_bounds__(T::kThreads) bwd_convert_dq_kernel(__grid_constant__ BwdKernelParams const p) {
  using Element = typename T::Element;
  constexpr int kBlockM = T::kBlockM;
  constexpr int kHeadDim = T::kHeadDim;
  __shared__ __align__(128) char smem_raw[sizeof(Element) * cosize_v<typename T::SmemLayoutQ>];
  int const h = blockIdx.y;
  int const b = blockIdx.z;
  int const m0 = blockIdx.x * kBlockM;
  SeqInfo const seq = SeqInfo::make(p, b);
  if (m0 >= seq.seqlen_q) return;
  int const tid = threadIdx.x;
  float const* const tile = p.dq_accum + ((int64_t)(b * p.nheads + h) * p.seqlen_q_rounded + m0) * kHeadDim;

  typename T::TiledMmaQ mma_q;
  auto sts = make_tiled_copy_C(typename T::SmemStoreC{}, mma_q);
  auto sts_thr = sts.get_thread_slice(tid);
  Tensor sdQ = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem_raw)), typename T::SmemLayoutQ{});
  auto tile_dq = Shape<Int<kBlockM>, Int<T::kDqCols>>{};
  CUTE_NO_UNROLL
  for (int c = 0; c < T::kDqChunks; ++c) {
    Tensor acc = partition_fragment_C(mma_q, tile_dq);  // (MMA, MMA_M, MMA_Dc)
    float const* const chunk = tile + c * kBlockM * T::kDqCols;
    CUTE_UNROLL
    for (int i = 0; i < size(acc); i += 2) {
      int const off = T::dq_frag_offset(i, tid);
      float2 sum = *reinterpret_cast<float2 const*>(chunk + off);
      for (int slot = 1; slot < p.dq_slots; ++slot) {
        float2 const more = *reinterpret_cast<float2 const*>(chunk + slot * p.dq_slot_elems + off);
        sum.x += more.x, sum.y += more.y;
      }
      acc(i) = sum.x * p.softmax_scale;
      acc(i + 1) = sum.y * p.softmax_scale;
    }
    Tensor r = convert_to<Element>(acc);
    cute::copy(sts, sts_thr.retile_S(r), sts_thr.partition_D(local_tile(sdQ, tile_dq, make_coord(0, c))));
  }
  __syncthreads();

  Element* const dq = static_cast<Element*>(p.dq) + seq.q_offset(p, b, p.dq_batch_stride, p.dq_row_stride) +
                      h * p.dq_head_stride;
  auto tile_q = Shape<Int<kBlockM>, Int<kHeadDim>>{};
  Tensor mdQ = make_tensor(make_gmem_ptr(dq), make_shape(seq.seqlen_q, Int<kHeadDim>{}),
                           make_stride(p.dq_row_stride, _1{}));  // (Sq, D)
  store_tile(typename T::GmemStore{}, sdQ, local_tile(mdQ, tile_q, make_coord(blockIdx.x, 0)), tile_q,
             seq.seqlen_q - m0, p.head_dim);
}

// dk, dv of GQA without determinism. Grid: (ceil(seqlen_k / kRows), nheads_kv, batch).
template <class Element>
__global__ void __launch_bounds__(BwdRowKernel::kThreads)
    bwd_postprocess_kernel(__grid_constant__ BwdKernelParams const p) {
  constexpr int kRows = BwdRowKernel::kRows;
  int const h = blockIdx.y;
  int const b = blockIdx.z;
  int const row0 = blockIdx.x * kRows;
  SeqInfo const seq = SeqInfo::make(p, b);
  // Every row the sequence owns, also those past seqused_k, whose accumulators stayed zero.
  int const key_rows = SeqInfo::key_rows(p, b);
  if (row0 >= key_rows) return;
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

}  // namespace flashcute
