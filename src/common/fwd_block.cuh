// One forward CTA's share of the work, for every forward kernel family: the query rows of one head of one sequence,
// the key tiles those rows can see, and the order the mainloop visits them in.
#pragma once

#include <cute/tensor.hpp>

#include "common/cute_utils.cuh"
#include "common/kernel_params.h"
#include "common/mask.h"
#include "common/tile_scheduler.cuh"

namespace flashcute {

template <int kBlockM, int kBlockN>
struct FwdBlock {
  int m_block, h, b, h_kv;
  int split;  // split-KV: which chunk of the keys (0 without)
  SeqInfo seq;
  Mask mask;
  int m0, m1;          // query rows [m0, m1) of the sequence
  int group;           // packed GQA: the tile's rows per query row (p.packed_gqa; 1 without, and outside kDecode)
  int qm0, qm1;        // the query rows [qm0, qm1) the mask sees for rows [m0, m1): the same without packed GQA
  int n_min, n_max;    // key tiles [n_min, n_max) hold every key some row may see
  int num_top, num_general, num_tiles;
  int n_plain_lo, n_plain_hi;

  // Tile t of the scheduler (by default this CTA's in launch order, one CTA per tile: the portable kernel); false
  // (and the CTA has nothing to do there) past the end of a shorter varlen sequence. kDecode: the kernels' decode
  // instantiation, which also serves paged K/V (whose sequences use their first seqused_k[b] keys when seqused_k is
  // given) and split-KV (the tile's b counts (sequence, split) pairs).
  template <bool kDecode = false>
  CUTE_DEVICE bool init(FwdKernelParams const& p) {
    return init<kDecode>(p, FwdTileScheduler<kBlockM>::launched());
  }
  template <bool kDecode = false>
  CUTE_DEVICE bool init(FwdKernelParams const& p, FwdTile const t) {
    m_block = t.m_block;
    h = t.h;
    b = t.b;
    split = 0;
    if constexpr (kDecode) {
      if (p.num_splits > 1) split = b % p.num_splits, b /= p.num_splits;
    }
    seq = SeqInfo::make(p, b);
    if constexpr (kDecode) {
      if (p.seqused_k) seq.seqlen_k = min(max(p.seqused_k[b], 0), p.seqlen_k);
    }
    m0 = m_block * kBlockM;
    if (m0 >= seq.seqlen_q) return false;
    m1 = min(m0 + kBlockM, seq.seqlen_q);
    group = 1;
    qm0 = m0, qm1 = m1;
    mask = seq.mask(p);
    if constexpr (kDecode) {
      if (p.packed_gqa > 1) {  // rows i * group + j are query row i of group heads (the C API's packed_gqa)
        group = p.packed_gqa;
        qm0 = m0 / group, qm1 = (m1 - 1) / group + 1;
        mask = Mask::make(seq.seqlen_q / group, seq.seqlen_k, p.causal, p.window_left, p.window_right);
      }
    }
    int const key_lo = mask.block_key_begin(qm0);
    int const key_hi = mask.block_key_end(qm1);
    n_min = key_lo / kBlockN;
    // Tiles wholly outside every row's window are never loaded; an empty range leaves out 0 and lse -inf.
    n_max = key_hi > key_lo ? (key_hi + kBlockN - 1) / kBlockN : n_min;
    if constexpr (kDecode) {
      if (p.num_splits > 1) {  // this split's key tiles only (none: out 0 and lse -inf, which the combine skips)
        int const per = ((seq.seqlen_k + kBlockN - 1) / kBlockN + p.num_splits - 1) / p.num_splits;
        n_min = max(n_min, split * per);
        n_max = max(n_min, min(n_max, (split + 1) * per));
      }
    }
    h_kv = h / p.kv_group;
    return true;
  }

  // Tiles [n_plain_lo, n_plain_hi) are seen in full by every row of the block. Without softcap they take the plain
  // step: no mask and no softcap code. The others (the diagonal band, the window's edges, a partial last tile) take
  // the general one. Online softmax does not care about tile order, so the general tiles go first (top band, then
  // bottom band) and the plain ones after, each kind in one loop of its own: steps [0, num_general) are general,
  // [num_general, num_tiles) plain. Measured in the SASS (hd128, portable kernel): one body with the optional work
  // behind branches was if-converted (the predicated-off softcap and mask instructions cost every tile); both
  // bodies inside one loop, or two loops inside an outer one, cost ~180 register moves per tile; two loops in
  // sequence leave the plain body at FA2's instruction count. The only partial tile (the last) is general and comes
  // first.
  CUTE_DEVICE void plan_tiles(FwdKernelParams const& p) {
    mask.full_key_tiles(qm0, qm1, kBlockN, n_min, n_max, n_plain_lo, n_plain_hi);
    if (p.softcap_prescale != 0.f) n_plain_lo = n_plain_hi = n_min;
    num_top = n_max - n_plain_hi;
    num_general = num_top + (n_plain_lo - n_min);
    num_tiles = n_max - n_min;
  }

  CUTE_DEVICE int tile_of(int i) const {
    if (i < num_top) return n_max - 1 - i;
    if (i < num_general) return n_plain_lo - 1 - (i - num_top);
    return n_plain_hi - 1 - (i - num_general);
  }

  // Row 0 of this block's sequence in each tensor, at its head.
  template <class Element>
  CUTE_DEVICE Element const* q(FwdKernelParams const& p) const {
    return static_cast<Element const*>(p.q) + seq.q_offset(p, b, p.q_batch_stride, p.q_row_stride) +
           h * p.q_head_stride;
  }
  template <class Element>
  CUTE_DEVICE Element const* k(FwdKernelParams const& p) const {
    return static_cast<Element const*>(p.k) + seq.k_offset(p, b, p.k_batch_stride, p.k_row_stride) +
           h_kv * p.k_head_stride;
  }
  template <class Element>
  CUTE_DEVICE Element const* v(FwdKernelParams const& p) const {
    return static_cast<Element const*>(p.v) + seq.k_offset(p, b, p.v_batch_stride, p.v_row_stride) +
           h_kv * p.v_head_stride;
  }
  // Paged K/V: the page-table slot of key j (j / page_size) and the page that slot of this block's sequence names
  // (clamped into the pages).
  CUTE_DEVICE static int page_slot(FwdKernelParams const& p, int j) { return p.page_slots.div(j); }
  CUTE_DEVICE int page_of(FwdKernelParams const& p, int slot) const {
    return min(max(p.page_table[b * p.page_table_batch_stride + slot], 0), p.num_pages - 1);
  }
  // K (v = false) or V tile n into this thread's shared-memory partition dst, rows and columns bounded as
  // copy_tile_zfill bounds them (relative to this thread's first vector, (load_row, load_col)); src: the thread's
  // partition of the tensor's tiles. Paged K/V (kDecode and p.page_table) goes through the page table: key j is row
  // j - slot * page_size of page table[slot] (clamped), slot = j / page_size; row by row where pages are smaller
  // than a tile or do not hold whole tiles.
  // kTilePages: pages that hold whole tiles take one table read per tile (the Hopper producers copy those by TMA
  // and leave it off: its code cost their 64-row decode tile 8 B of spills).
  template <bool kDecode, class Element, int kGatherGroup = 1, bool kTilePages = true, class TiledCopy, class S,
            class D, class C>
  CUTE_DEVICE void load_kv(FwdKernelParams const& p, bool v, TiledCopy const& copy, S const& src, D&& dst,
                           C const& coord, int n, int rows, int cols, int load_row, int load_col) const {
    if (kDecode && p.page_table) {
      Element const* const base = static_cast<Element const*>(v ? p.v : p.k) +
                                  h_kv * (v ? p.v_head_stride : p.k_head_stride) + load_col;
      int64_t const page_stride = v ? p.v_batch_stride : p.k_batch_stride;
      int64_t const row_stride = v ? p.v_row_stride : p.k_row_stride;
      if (kTilePages && p.page_size % kBlockN == 0) {
        // The tile lies in one page (a contiguous cache is one page per sequence): one table read for the tile,
        // and its rows copied as a strided tile.
        int const j0 = n * kBlockN;
        int const slot = page_slot(p, j0);
        Element const* const first =
            base + page_of(p, slot) * page_stride + (j0 - slot * p.page_size + load_row) * row_stride;
        copy_tile_zfill(copy, make_tensor(make_gmem_ptr(first), src(_, _, _, 0).layout()), dst, coord, rows, cols);
        return;
      }
      int const row0 = n * kBlockN + load_row;
      copy_rows_zfill<kGatherGroup>(copy, src(_, _, _, 0), dst, coord, rows, cols, [&](int r) {
        int const j = row0 + r;
        int const slot = page_slot(p, j);
        return base + page_of(p, slot) * page_stride + (j - slot * p.page_size) * row_stride;
      });
    } else {
      copy_tile_zfill(copy, src(_, _, _, n), dst, coord, rows, cols);
    }
  }
  template <class Element>
  CUTE_DEVICE Element* out(FwdKernelParams const& p) const {
    return static_cast<Element*>(p.out) + seq.q_offset(p, b, p.out_batch_stride, p.out_row_stride) +
           h * p.out_head_stride;
  }
};

}  // namespace flashcute
