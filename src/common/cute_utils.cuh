// Small CuTe building blocks shared by the forward and backward mainloops: accumulator views, type conversion,
// warp-level GEMMs fed from shared memory, and predicated tile copies.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/numeric_types.h>

namespace flashcute {

using namespace cute;

// One 32-bit register into shared memory with st.shared. Through CuTe's UniversalCopy the Hopper backward's dS^T
// stores came out as generic 64-bit stores (SASS ST.E, two address registers each): the compiler could not tell
// that the swizzled addresses point into shared memory.
struct SharedStore32 {
  using SRegisters = uint32_t[1];
  using DRegisters = uint32_t[1];
  CUTE_DEVICE static void copy(uint32_t const& src, uint32_t& dst) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(cast_smem_ptr_to_uint(&dst)), "r"(src) : "memory");
  }
};

// An MMA accumulator seen as (rows, cols). SM80 m16n8: ((2 cols, 2 rows), MMA_M, MMA_N) -> ((2, MMA_M), (2, MMA_N)).
// SM90 wgmma m64nN: ((2 cols, 2 rows, N / 8 col groups), MMA_M, MMA_N) -> ((2, MMA_M), (2, N / 8, MMA_N)). In both,
// the four threads of a quad hold the same rows.
template <class Layout>
CUTE_HOST_DEVICE constexpr auto acc_as_rowcol(Layout const& acc) {
  static_assert(decltype(rank(acc))::value == 3);
  if constexpr (decltype(rank<0>(acc))::value == 3) {
    return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                       make_layout(get<0, 0>(acc), get<0, 2>(acc), get<2>(acc)));
  } else {
    auto l = logical_divide(acc, Shape<_2>{});
    return make_layout(make_layout(get<0, 1>(l), get<1>(l)), make_layout(get<0, 0>(l), get<2>(l)));
  }
}

// A 16-bit accumulator reused as the A operand of the next GEMM (P in P.V). SM80: two n8 atoms form one k16 slice,
// ((4), MMA_M, MMA_N) -> ((4, 2), MMA_M, MMA_N / 2). SM90 (register-A wgmma): two 8-column groups form one k16
// slice, ((2, 2, N / 8), MMA_M, MMA_N) -> ((2, 2, 2), MMA_M, N / 16 * MMA_N).
template <class Layout>
CUTE_HOST_DEVICE constexpr auto acc_as_a_operand(Layout const& acc) {
  static_assert(decltype(rank(acc))::value == 3);
  if constexpr (decltype(rank<0>(acc))::value == 3) {
    auto groups = logical_divide(get<0, 2>(acc), Shape<_2>{});  // ((2, N / 16))
    return make_layout(make_layout(get<0, 0>(acc), get<0, 1>(acc), get<0, 0>(groups)), get<1>(acc),
                       coalesce(make_layout(get<0, 1>(groups), get<2>(acc))));
  } else {
    static_assert(decltype(size<0>(acc))::value == 4);
    auto l = logical_divide(acc, Shape<Underscore, Underscore, _2>{});
    return make_layout(make_layout(get<0>(l), get<2, 0>(l)), get<1>(l), get<2, 1>(l));
  }
}

template <class To, class Engine, class Layout>
CUTE_DEVICE auto convert_to(Tensor<Engine, Layout> const& t) {
  using From = typename Engine::value_type;
  constexpr int N = decltype(size(t))::value;
  cutlass::NumericArrayConverter<To, From, N> convert;
  Tensor out = make_tensor<To>(t.layout());
  *reinterpret_cast<cutlass::Array<To, N>*>(out.data()) =
      convert(*reinterpret_cast<cutlass::Array<From, N> const*>(t.data()));
  return out;
}

// src converted into dst (both register tensors of one size, dst of a 16-bit type), one 32-bit register of two
// elements at a time. Element-wise copies of 16-bit values made ptxas split F2FP's packed pairs apart and join them
// again for the MMA that reads dst (a PRMT and LOP3 per element in the Hopper forward's P conversion, SASS).
template <class SrcEngine, class SrcLayout, class DstEngine, class DstLayout>
CUTE_DEVICE void convert_into(Tensor<SrcEngine, SrcLayout> const& src, Tensor<DstEngine, DstLayout>& dst) {
  using From = typename SrcEngine::value_type;
  using To = typename DstEngine::value_type;
  static_assert(sizeof(To) == 2 && decltype(size(src))::value == decltype(size(dst))::value);
  constexpr int kPairs = decltype(size(src))::value / 2;
  cutlass::NumericArrayConverter<To, From, 2> convert;
  auto const* from = reinterpret_cast<cutlass::Array<From, 2> const*>(src.data());
  auto* to = reinterpret_cast<uint32_t*>(dst.data());
  CUTE_UNROLL
  for (int i = 0; i < kPairs; ++i) {
    cutlass::Array<To, 2> const pair = convert(from[i]);
    to[i] = reinterpret_cast<uint32_t const&>(pair);
  }
}

// How far ahead of its MMAs the B operand of a GEMM is loaded from shared memory: a whole k-slice, or one
// ldmatrix copy (two n-tiles). A copy ahead holds fewer operand registers: the choice is per kernel config, by
// measured spills (see FwdTraits::kStreamB).
enum class Prefetch { kSlice, kCopy };

// acc += A * B over the k-slices, load(k) bringing slice k of whichever operands are streamed into registers one
// slice ahead of the MMAs.
template <class Acc, class RA, class RB, class TiledMma, class Load>
CUTE_DEVICE void gemm_slices_ahead(Acc& acc, RA const& rA, RB const& rB, TiledMma const& mma, Load&& load) {
  constexpr int kSlices = decltype(size<2>(rA))::value;
  load(_0{});
  CUTE_UNROLL
  for (int k = 0; k < kSlices; ++k) {
    if (k + 1 < kSlices) load(k + 1);
    cute::gemm(mma, rA(_, _, k), rB(_, _, k), acc);
  }
}

// acc += A * B, B streamed from shared memory by copy_b; load_a(k) brings A's k-slice into registers (a no-op when
// A is already there), one slice ahead of the MMAs.
template <Prefetch kB, class Acc, class RA, class RB, class SB, class TiledMma, class CopyB, class LoadA>
CUTE_DEVICE void gemm_b_streamed(Acc& acc, RA const& rA, RB& rB, SB const& sB, TiledMma const& mma,
                                 CopyB const& copy_b, LoadA&& load_a) {
  auto rB_view = copy_b.get_slice(threadIdx.x).retile_D(rB);
  CUTE_STATIC_ASSERT_V(size<1>(sB) == size<1>(rB_view));  // N
  if constexpr (kB == Prefetch::kSlice) {
    gemm_slices_ahead(acc, rA, rB, mma, [&](auto k) {
      load_a(k);
      cute::copy(copy_b, sB(_, _, k), rB_view(_, _, k));
    });
  } else {
    constexpr int kSlices = decltype(size<2>(rA))::value;
    load_a(_0{});
    constexpr int kCopies = decltype(size<1>(rB_view))::value;
    constexpr int kPerCopy = decltype(size<1>(rB))::value / kCopies;  // n-tiles one copy fills
    // Copy c of a slice fills n-tiles [c * kPerCopy, (c + 1) * kPerCopy) of it.
    CUTE_STATIC_ASSERT_V(rB_view.layout()(_0{}, _1{}, _0{}) == rB.layout()(_0{}, Int<kPerCopy>{}, _0{}));
    cute::copy(copy_b, sB(_, _0{}, _0{}), rB_view(_, _0{}, _0{}));
    CUTE_UNROLL
    for (int k = 0; k < kSlices; ++k) {
      cute::for_each(make_int_sequence<kCopies>{}, [&](auto c) {
        if constexpr (c + 1 < kCopies) {
          cute::copy(copy_b, sB(_, c + 1, k), rB_view(_, c + 1, k));
        } else if (k + 1 < kSlices) {
          load_a(k + 1);
          cute::copy(copy_b, sB(_, _0{}, k + 1), rB_view(_, _0{}, k + 1));
        }
        CUTE_UNROLL
        for (int j = c * kPerCopy; j < (c + 1) * kPerCopy; ++j) {
          CUTE_UNROLL
          for (int m = 0; m < size<1>(rA); ++m) {
            cute::gemm(mma, acc(_, m, j), rA(_, m, k), rB(_, j, k), acc(_, m, j));
          }
        }
      });
    }
  }
}

// acc += A * B with both operands streamed from shared memory.
template <Prefetch kB = Prefetch::kSlice, class Acc, class RA, class RB, class SA, class SB, class TiledMma,
          class CopyA, class CopyB>
CUTE_DEVICE void gemm_ss(Acc& acc, RA& rA, RB& rB, SA const& sA, SB const& sB, TiledMma const& mma,
                         CopyA const& copy_a, CopyB const& copy_b) {
  auto rA_view = copy_a.get_slice(threadIdx.x).retile_D(rA);
  CUTE_STATIC_ASSERT_V(size<1>(sA) == size<1>(rA_view));  // M
  gemm_b_streamed<kB>(acc, rA, rB, sB, mma, copy_b, [&](auto k) { cute::copy(copy_a, sA(_, _, k), rA_view(_, _, k)); });
}

// acc += A * B with A already in registers (e.g. P) and B streamed from shared memory.
template <Prefetch kB = Prefetch::kSlice, class Acc, class RA, class RB, class SB, class TiledMma, class CopyB>
CUTE_DEVICE void gemm_rs(Acc& acc, RA const& rA, RB& rB, SB const& sB, TiledMma const& mma, CopyB const& copy_b) {
  gemm_b_streamed<kB>(acc, rA, rB, sB, mma, copy_b, [](auto) {});
}

// acc += A * B with B already in registers (V, held across the portable backward's key tile) and A streamed from
// shared memory one k-slice ahead of the MMAs.
template <class Acc, class RA, class RB, class SA, class TiledMma, class CopyA>
CUTE_DEVICE void gemm_sr(Acc& acc, RA& rA, RB const& rB, SA const& sA, TiledMma const& mma, CopyA const& copy_a) {
  auto rA_view = copy_a.get_slice(threadIdx.x).retile_D(rA);
  CUTE_STATIC_ASSERT_V(size<1>(sA) == size<1>(rA_view));  // M
  gemm_slices_ahead(acc, rA, rB, mma, [&](auto k) { cute::copy(copy_a, sA(_, _, k), rA_view(_, _, k)); });
}

// Global <-> shared tile copies in 16-byte vectors: each row chunk of kRowChunk columns (64, or 32 when the head
// dim is no multiple of 64) is covered by kRowChunk / 8 threads, the rest of the threads take further rows.
template <class Element, int kHeadDim, int kThreads>
struct GmemCopies {
  static constexpr int kRowChunk = kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kVec = 16 / sizeof(Element);
  static constexpr int kGmemThreadsPerRow = kRowChunk / kVec;
  static_assert(kThreads % kGmemThreadsPerRow == 0);
  using GmemThreads = Layout<Shape<Int<kThreads / kGmemThreadsPerRow>, Int<kGmemThreadsPerRow>>,
                             Stride<Int<kGmemThreadsPerRow>, _1>>;
  using GmemLoad = decltype(make_tiled_copy(Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>, Element>{},
                                            GmemThreads{}, Layout<Shape<_1, Int<kVec>>>{}));
  using GmemStore = decltype(make_tiled_copy(Copy_Atom<UniversalCopy<cute::uint128_t>, Element>{}, GmemThreads{},
                                             Layout<Shape<_1, Int<kVec>>>{}));
};

// Coordinates for the predicates of copy_tile_zfill / copy_tile_bounded, split as TileCoords splits the MMA tiles'
// (common/mask_apply.cuh): copy_offsets is thread 0's partition of the tile (compile-time coordinates), and
// copy_base this thread's first vector (row, col), which callers subtract from the bounds. Partitioning with the
// real thread index instead keeps every vector's coordinates in registers across the mainloop.
template <class TiledCopy, class Shape>
CUTE_DEVICE auto copy_offsets(TiledCopy const& copy, Shape shape) {
  return copy.get_thread_slice(_0{}).partition_S(make_identity_tensor(shape));  // (CPY, CPY_ROW, CPY_COL)
}

template <class ThrCopy, class Shape>
CUTE_DEVICE void copy_base(ThrCopy const& thr, Shape shape, int& row, int& col) {
  auto const mine = thr.partition_S(make_identity_tensor(shape));
  row = get<0>(mine(0));
  col = get<1>(mine(0));
}

// Global -> shared tile copy with a zero-filling cp.async atom, predicated on rows < max_row and columns < max_col:
// elements outside read nothing and land as zeros, so padded head dims and rows past the sequence contribute exact
// zeros (never NaN) to MMAs. One predicated instruction per vector, no branches or separate clears.
template <class TiledCopy, class S, class D, class C>
CUTE_DEVICE void copy_tile_zfill(TiledCopy const& copy, S const& src, D&& dst, C const& coord, int max_row,
                                 int max_col) {
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    bool const row_ok = get<0>(coord(0, m, 0)) < max_row;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(src); ++k) {
      cute::copy(copy.with(row_ok && get<1>(coord(0, m, k)) < max_col), src(_, m, k), dst(_, m, k));
    }
  }
}

// copy_tile_zfill for a tile whose rows lie anywhere (paged K/V): row_ptr(r) is the global address of the tile's
// row r, asked only for the rows < max_row; src_rows is the thread's partition of any tile with the same row
// layout (its row strides are not used). Rows counted as copy_offsets counts them (thread 0's), and so is max_row.
// kGroup rows at a time (0: all; a group size that does not divide the rows: 1): their addresses computed first
// (a paged caller's page-table reads in flight together), then their copies. A group holds its addresses in
// registers, so callers at their register limit (the mainloops that inline this) take 1.
template <int kGroup = 1, class TiledCopy, class S, class D, class C, class RowPtr>
CUTE_DEVICE void copy_rows_zfill(TiledCopy const& copy, S const& src_rows, D&& dst, C const& coord, int max_row,
                                 int max_col, RowPtr const& row_ptr) {
  constexpr int kRows = decltype(size<1>(src_rows))::value;
  constexpr int G = kGroup <= 0 ? kRows : kRows % kGroup == 0 ? kGroup : 1;
  using Ptr = decltype(row_ptr(0));
#pragma unroll 1
  for (int m0 = 0; m0 < kRows; m0 += G) {
    Ptr rows[G];
    CUTE_UNROLL
    for (int g = 0; g < G; ++g) {
      int const r = get<0>(coord(0, m0 + g, 0));
      rows[g] = r < max_row ? row_ptr(r) : src_rows(_, m0 + g, _).data().get();  // read nothing past max_row
    }
    CUTE_UNROLL
    for (int g = 0; g < G; ++g) {
      bool const row_ok = get<0>(coord(0, m0 + g, 0)) < max_row;
      Tensor src = make_tensor(make_gmem_ptr(rows[g]), src_rows(_, m0 + g, _).layout());  // (CPY, CPY_COL)
      CUTE_UNROLL
      for (int k = 0; k < size<2>(src_rows); ++k) {
        cute::copy(copy.with(row_ok && get<1>(coord(0, m0 + g, k)) < max_col), src(_, k), dst(_, m0 + g, k));
      }
    }
  }
}

// Shared/register -> global copy of the rows < max_row and columns < max_col only.
template <class TiledCopy, class S, class D, class C>
CUTE_DEVICE void copy_tile_bounded(TiledCopy const& copy, S const& src, D& dst, C const& coord, int max_row,
                                   int max_col) {
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    if (get<0>(coord(0, m, 0)) < max_row) {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(src); ++k) {
        if (get<1>(coord(0, m, k)) < max_col) cute::copy(copy, src(_, m, k), dst(_, m, k));
      }
    }
  }
}

// Shared -> global copy of a whole tile through registers, with the gmem store's vectors, writing only the rows <
// max_row and columns < max_col (epilogues: O, dK, dV, dQ); `thread` indexes the copy's threads.
template <class TiledCopy, class S, class G, class Shape>
CUTE_DEVICE void store_tile(TiledCopy const& copy, S const& smem, G gmem, Shape shape, int max_row, int max_col,
                            int thread = int(threadIdx.x)) {
  auto thr = copy.get_thread_slice(thread);
  Tensor src = thr.partition_S(smem);
  Tensor dst = thr.partition_D(gmem);
  Tensor regs = make_fragment_like(src);
  cute::copy(copy, src, regs);
  copy_tile_bounded(copy, regs, dst, thr.partition_D(make_identity_tensor(shape)), max_row, max_col);
}

// tanh for the softcap, from one exp2 (~1e-7 relative), in the forward and the backward alike: the backward
// recomputes P against the forward's lse, so both must round the capped scores the same way. tanh.approx.f32
// (~5e-4) in the backward pushed the fp16 softcap dq error past 2x plain PyTorch's. The forward once used
// tanh.approx because the exp2 form made the no-softcap forward 12-15% slower through if-conversion; softcap now
// lives only in the general step (src/sm80/fwd_kernel.cuh), so the plain tiles pay nothing for it.
CUTE_DEVICE float tanh_accurate(float x) {
  float const e = exp2f(x * 2.8853900817779268f);  // exp(2x)
  return 1.f - __fdividef(2.f, e + 1.f);
}

}  // namespace flashcute

namespace cute {
template <>
struct Copy_Traits<flashcute::SharedStore32> {
  using ThrID = Layout<_1>;
  using SrcLayout = Layout<Shape<_1, _32>>;  // (thread, bit)
  using DstLayout = Layout<Shape<_1, _32>>;
  using RefLayout = SrcLayout;
};
}  // namespace cute
