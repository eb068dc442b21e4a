// TMA copies of the (rows, columns, heads, batch) tensors the Hopper kernels load (Q, K, V, dO as the API lays them
// out: int64 strides, 16-byte aligned rows), a kRows x kCols box at a time into SmemLayout; rows past `rows` and
// columns past `cols` arrive as zeros. Made on the host (the launchers) inside a TmaEncodeCheck (sm90/tma_driver.h),
// which says whether the driver accepted them; used on the device.
#pragma once

#ifndef FLASHCUTE_SM90_TMA_DRIVER
#error "include sm90/tma_driver.h before any CUTLASS or CuTe header (the Hopper launchers do, first)"
#endif

#include <cstdint>

#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/tensor.hpp>

namespace flashcute::sm90 {

using namespace cute;

// Dimensions of size 1 address nothing, and the API gives them stride 0 (src/api/validate.h): they get the compact
// stride instead (columns rounded up to 16 bytes, then rows, then heads), so that TMA sees a tensor whose rows do
// not overlap, as it requires.
template <class Element, class SmemLayout, int kRows, int kCols>
auto make_rows_tma(void const* ptr, int rows, int cols, int heads, int batch, int64_t row_stride, int64_t head_stride,
                   int64_t batch_stride) {
  constexpr int64_t kAlign = 16 / sizeof(Element);
  if (rows == 1) row_stride = (cols + kAlign - 1) / kAlign * kAlign;
  if (heads == 1) head_stride = rows * row_stride;
  if (batch == 1) batch_stride = heads * head_stride;
  Tensor t = make_tensor(make_gmem_ptr(static_cast<Element const*>(ptr)), make_shape(rows, cols, heads, batch),
                         make_stride(row_stride, _1{}, head_stride, batch_stride));
  return make_tma_copy(SM90_TMA_LOAD{}, t, SmemLayout{}, Shape<Int<kRows>, Int<kCols>>{}, _1{});
}

template <class Element, class SmemLayout, int kRows, int kCols>
using RowsTma = decltype(make_rows_tma<Element, SmemLayout, kRows, kCols>(nullptr, 0, 0, 0, 0, 0, 0, 0));

// The rows and batches of the TMA view of K and V: (seqlen_k, batch), a varlen batch's packed rows as one batch
// (total_k, 1), or a paged cache's (page_size, num_pages); of Q and dO (the backward): (seqlen_q, batch) or
// (total_q, 1).
template <class P>
CUTE_HOST_DEVICE int tma_rows_k(P const& p) {
  return p.page_table ? p.page_size : p.seq_spans ? p.packed_rows_k : p.seqlen_k;
}
template <class P>
CUTE_HOST_DEVICE int tma_rows_q(P const& p) {
  return p.seq_spans ? p.packed_rows_q : p.seqlen_q;
}
template <class P>
CUTE_HOST_DEVICE int tma_batches(P const& p) {
  return p.page_table ? p.num_pages : p.seq_spans ? 1 : p.batch;
}

// Head h of sequence b in a TMA coordinate tensor (rows, columns, heads, batches) as a (rows, columns) tensor whose
// row 0 is the sequence's first: batch b, or for varlen the packed rows from row0 on.
template <class P, class TmaTensor>
CUTE_DEVICE auto tma_sequence(P const& p, TmaTensor const& t, int h, int b, int64_t row0) {
  return domain_offset(make_coord(static_cast<int>(row0), _0{}), t(_, _, h, p.seq_spans ? 0 : b));
}

// Whether TMA can address a tensor with these (outer, rows, heads) sizes and strides in 16-bit elements: every
// stride below 2^40 bytes, and none 0 on a dimension of more than one element (an expanded view: the API lets
// inputs repeat along batch, heads or rows).
inline bool tma_strides_ok(int64_t const (&sizes)[3], int64_t const (&strides)[3]) {
  int64_t const limit = (int64_t(1) << 39) / 2;  // elements of 2 bytes, with a factor 2 to spare
  for (int i = 0; i < 3; ++i)
    if (strides[i] < 0 || strides[i] >= limit || (strides[i] == 0 && sizes[i] > 1)) return false;
  return true;
}

}  // namespace flashcute::sm90
