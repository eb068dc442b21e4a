// Definition of the Hopper forward launcher; instantiated once per config by the generated .cu files, which are
// compiled for sm_90a only.
#pragma once

#include "sm90/tma_driver.h"  // first: it redirects CuTe's TMA descriptor calls

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "common/fwd_combine.cuh"
#include "sm90/fwd_kernel.cuh"
#include "sm90/tma.cuh"

namespace flashcute::sm90 {

// Whether TMA serves K and V, with strides tma_strides_ok accepts: fixed-length batches, varlen ones without
// padded rows (packed_rows_k: K and V as one sequence of total_k rows) and paged caches. Paged K/V by the (pages,
// page rows, heads) dimensions, and either key tiles that never straddle two pages (page_size a multiple of
// block_n, or one page holding every key) or pages that tile a key tile in copies of page_rows rows.
inline bool tma_serves(FwdKernelParams const& p, int block_n, int page_rows) {
  bool const paged = p.page_table != nullptr;
  if (p.seq_spans && (paged || p.packed_rows_k <= 0)) return false;
  if (paged) {
    bool const tile_in_page = p.page_size >= block_n && (p.page_size % block_n == 0 || p.page_size >= p.seqlen_k);
    bool const pages_in_tile = p.page_size < block_n && block_n % p.page_size == 0 && p.page_size % page_rows == 0;
    if (!tile_in_page && !pages_in_tile) return false;
  }
  int64_t const sizes[3] = {tma_batches(p), tma_rows_k(p), p.nheads_kv};
  return tma_strides_ok(sizes, {p.k_batch_stride, p.k_row_stride, p.k_head_stride}) &&
         tma_strides_ok(sizes, {p.v_batch_stride, p.v_row_stride, p.v_head_stride});
}

// The persistent grid's CTA count (one per SM) where the tiles take more than one wave, or 0 for one CTA per tile:
// always without a tile counter and for the decode instantiation. FLASHCUTE_FWD_GRID (A/B timing, tests) overrides
// the choice: "tiles" for one CTA per tile, "persistent" for one per SM (at most one per tile) at any size, a number
// n for n CTAs walking every tile.
inline int persistent_ctas(FwdKernelParams const& p, int64_t tiles) {
  if (!p.tile_counter || uses_decode_kernel(p) || tiles >= (int64_t(1) << 30)) return 0;
  char const* grid = std::getenv("FLASHCUTE_FWD_GRID");
  std::string const force = grid ? grid : "";
  if (force == "tiles") return 0;
  if (int const n = std::atoi(force.c_str()); n > 0) return int(std::min<int64_t>(n, tiles));
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return 0;
  if (force == "persistent") return int(std::min<int64_t>(sms, tiles));
  return tiles > sms ? sms : 0;
}

template <class T>
int run_fwd(FwdKernelParams const& p, void* stream) {
  using Element = typename T::Element;
  auto kernel = uses_decode_kernel(p) ? &fwd_kernel<T, true> : &fwd_kernel<T, false>;
  int const smem = launch_smem(p, T::kSmemBytes);
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  FwdParams<T> params{};
  params.p = p;
  params.order = FwdTileScheduler<T::kBlockM>::order(p);
  params.use_tma = p.seqlen_k > 0 && tma_serves(p, T::kBlockN, T::kPageRows);
  if (params.use_tma) {  // K and V as (rows, head_dim, heads, batches), or (page rows, head_dim, heads, pages)
    TmaEncodeCheck encoded;
    int const rows = tma_rows_k(p);
    int const outer = tma_batches(p);
    if (p.page_table && p.page_size < T::kBlockN) {  // pages shorter than a key tile: kPageRows rows a copy
      params.tma_k_rows = make_rows_tma<Element, typename T::SmemLayoutKVRows, T::kPageRows, T::kHeadDim>(
          p.k, rows, p.head_dim, p.nheads_kv, outer, p.k_row_stride, p.k_head_stride, p.k_batch_stride);
      params.tma_v_rows = make_rows_tma<Element, typename T::SmemLayoutVRows, T::kPageRows, T::kHeadDimV>(
          p.v, rows, p.head_dim_v, p.nheads_kv, outer, p.v_row_stride, p.v_head_stride, p.v_batch_stride);
    } else {
      params.tma_k = make_rows_tma<Element, decltype(take<0, 2>(typename T::SmemLayoutKV{})), T::kBlockN,
                                   T::kHeadDim>(p.k, rows, p.head_dim, p.nheads_kv, outer, p.k_row_stride, p.k_head_stride, p.k_batch_stride);
      params.tma_v = make_rows_tma<Element, decltype(take<0, 2>(typename T::SmemLayoutV{})), T::kBlockN,
                                   T::kHeadDimV>(p.v, rows, p.head_dim_v, p.nheads_kv, outer, p.v_row_stride, p.v_head_stride, p.v_batch_stride);
    }
    params.use_tma = encoded.ok();  // else cp.async: the driver refused a descriptor
  }
  dim3 grid = FwdTileScheduler<T::kBlockM>::grid(p);
  int const ctas = persistent_ctas(p, FwdTileScheduler<T::kBlockM>::count(p));
  if (ctas) {
    grid = dim3(ctas);
    err = cudaMemsetAsync(p.tile_counter, 0, sizeof(int), static_cast<cudaStream_t>(stream));
    if (err != cudaSuccess) return err;
  } else {
    params.p.tile_counter = nullptr;
  }
  kernel<<<grid, T::kThreads, smem, static_cast<cudaStream_t>(stream)>>>(params);
  if (p.num_splits > 1) {
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    return launch_fwd_combine<typename T::Element>(p, static_cast<cudaStream_t>(stream));
  }
  return cudaGetLastError();
}

}  // namespace flashcute::sm90
