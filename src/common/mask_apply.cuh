// Applies the shared Mask policy (common/mask.h) and the softcap to a score tile held in SM80 or SM90 accumulators.
#pragma once

#include "common/cute_utils.cuh"
#include "common/mask.h"

#include <utility>

namespace flashcute {

// Element coordinates are split into this thread's base (two integers) plus per-element offsets taken from thread
// 0's partition, which fold to constants. Partitioning the identity tensor with the real thread index instead
// made ptxas hoist every coordinate out of the mainloop and spill (measured: 255 registers + 124 B of spills at
// hd128 128x64, against 220 and none without the mask).
template <class TiledMma, class Shape>
struct TileCoords {
  int row_base;
  int col_base;
  CUTE_DEVICE TileCoords(TiledMma const& mma, Shape shape) {
    auto mine = mma.get_thread_slice(threadIdx.x).partition_C(make_identity_tensor(shape));
    row_base = get<0>(mine(0));
    col_base = get<1>(mine(0));
  }
  CUTE_DEVICE static auto offsets(TiledMma const& mma, Shape shape) {
    auto lane0 = mma.get_thread_slice(_0{}).partition_C(make_identity_tensor(shape));
    return make_tensor(lane0.data(), acc_as_rowcol(lane0.layout()));  // (rows, cols) of thread 0
  }
};

// Column pattern of one row of an accumulator partition (thread 0's offsets): pairs of adjacent columns every
// kStride columns, the same in every row. Every MMA layout flashcute builds has it (kStride 8 or 16 in its tiles);
// 0 for any other pattern, which apply_mask then tests element by element.
template <class Off, int kStride, int kRow, int... K>
constexpr bool row_in_pairs(std::integer_sequence<int, K...>) {
  return ((decltype(get<1>(std::declval<Off>()(Int<kRow>{}, Int<K>{})))::value == kStride * (K / 2) + K % 2) && ...);
}
template <class Off, int kStride, class Cols, int... R>
constexpr bool rows_in_pairs(std::integer_sequence<int, R...>, Cols cols) {
  return (row_in_pairs<Off, kStride, R>(cols) && ...);
}
template <class Off, int kRows, int kCols>
constexpr int column_pair_stride() {
  if constexpr (kCols < 4) {
    return 0;
  } else {
    constexpr int stride = decltype(get<1>(std::declval<Off>()(_0{}, Int<2>{})))::value;
    if constexpr (stride < 2 || (stride & (stride - 1)) != 0) return 0;
    else
      return rows_in_pairs<Off, stride>(std::make_integer_sequence<int, kRows>{},
                                        std::make_integer_sequence<int, kCols>{})
                 ? stride
                 : 0;
  }
}

// How many of a row's columns, at offsets kStride * (k / 2) + k % 2 (k < kCols), lie below x.
template <int kStride, int kCols>
CUTE_DEVICE int columns_below(int x) {
  constexpr int kShift = cute::log_2(static_cast<unsigned>(kStride));
  int const n = 2 * (x >> kShift) + min(x & (kStride - 1), 2);
  return min(max(n, 0), kCols);
}

// The low n bits set, for 0 <= n <= 32 (funnel shifts clamp the count at 32).
CUTE_DEVICE uint32_t low_bits(int n) { return __funnelshift_lc(0xffffffffu, 0u, uint32_t(n)); }

// m0 (first query) and n0 (first key) place the tile in the sequence; every element outside the Mask's window
// becomes -inf. Rows are queries and columns keys; kTransposed swaps them (the Hopper backward's S^T): key j is seen
// by queries [query_begin(j), query_end(j + 1)), keys past the sequence by none. kPacked (the forward's packed GQA):
// tile row r is query row r / group. A row's visible columns are one range, so where the columns follow the pair
// pattern (column_pair_stride) the range becomes a bit mask per 32 columns, one bit per element, instead of two
// compares per element.
template <bool kTransposed = false, bool kPacked = false, class Acc, class TiledMma, class Shape>
CUTE_DEVICE void apply_mask(Acc& acc, TiledMma const& mma, Shape shape, Mask const& mask, int m0, int n0,
                            int group = 1) {
  Tensor s = make_tensor(acc.data(), acc_as_rowcol(acc.layout()));
  TileCoords<TiledMma, Shape> const base(mma, shape);
  auto const off = TileCoords<TiledMma, Shape>::offsets(mma, shape);
  constexpr int kRows = decltype(size<0>(s))::value;
  constexpr int kCols = decltype(size<1>(s))::value;
  constexpr int kStride = column_pair_stride<decltype(off), kRows, kCols>();
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    int begin, end;  // this row's visible columns, relative to its first column
    if constexpr (kTransposed) {
      int const j = n0 + base.row_base + get<0>(off(r, 0));
      begin = mask.query_begin(j) - m0 - base.col_base;
      end = (j < mask.seqlen_k ? mask.query_end(j + 1) : 0) - m0 - base.col_base;
    } else {
      int i = m0 + base.row_base + get<0>(off(r, 0));
      if constexpr (kPacked) i /= group;
      begin = mask.key_begin(i) - n0 - base.col_base;
      end = mask.key_end(i) - n0 - base.col_base;
    }
    if constexpr (kStride > 0) {
      int const lo = columns_below<kStride, kCols>(begin), hi = columns_below<kStride, kCols>(end);
      CUTE_UNROLL
      for (int w = 0; w < (kCols + 31) / 32; ++w) {
        uint32_t const keep = low_bits(max(hi - 32 * w, 0)) & ~low_bits(max(lo - 32 * w, 0));
        CUTE_UNROLL
        for (int k = 32 * w; k < kCols && k < 32 * w + 32; ++k)
          if (!(keep & (1u << (k - 32 * w)))) s(r, k) = -INFINITY;
      }
    } else {
      CUTE_UNROLL
      for (int k = 0; k < kCols; ++k) {
        int const c = get<1>(off(r, k));
        if (c < begin || c >= end) s(r, k) = -INFINITY;
      }
    }
  }
}

template <class Acc>
CUTE_DEVICE void apply_softcap(Acc& acc, float prescale) {
  CUTE_UNROLL
  for (int i = 0; i < size(acc); ++i) acc(i) = tanh_accurate(acc(i) * prescale);
}

}  // namespace flashcute
