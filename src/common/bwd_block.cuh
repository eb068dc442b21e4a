// One backward CTA's share of the work, for every backward kernel family: one key tile of one K/V head of one
// sequence, the (query head, query tile) pairs that can see it, and the order the mainloop visits them in.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/fast_math.h>

#include "common/kernel_params.h"
#include "common/mask.h"

namespace flashcute {

template <int kBlockM, int kBlockN>
struct BwdBlock {
  int b, n_block, n0;
  SeqInfo seq;
  Mask mask;
  // GQA: nondeterministic CTAs take one query head each and add dK/dV into float32 accumulators; deterministic
  // ones take the whole group in order, so dK/dV are summed in registers and need no ordering of their own.
  bool gqa, group_in_cta;
  int h_kv, h_first, num_heads;
  int m_begin, num_m, m_plain_lo, m_plain_hi;
  int num_general, num_iters;
  cutlass::FastDivmod per_head_general, per_head_plain;

  // Returns false when key tile n_block lies past this sequence's keys (the CTA has nothing to write).
  CUTE_DEVICE bool init(BwdKernelParams const& p, int n) {
    b = blockIdx.z;
    n_block = n;
    seq = SeqInfo::make(p, b);
    n0 = n_block * kBlockN;
    if (n0 >= key_rows(p)) return false;
    gqa = p.nheads != p.nheads_kv;
    group_in_cta = gqa && p.deterministic;
    h_kv = group_in_cta ? blockIdx.y : blockIdx.y / p.kv_group;
    h_first = group_in_cta ? blockIdx.y * p.kv_group : blockIdx.y;
    num_heads = group_in_cta ? p.kv_group : 1;

    mask = seq.mask(p);
    query_tiles(n0, m_begin, num_m);
    // Query tiles [m_plain_lo, m_plain_hi) see every key of this tile. Without softcap they take the plain step
    // (no mask, no softcap code) in a loop of their own after the general ones, as in the forward (see
    // common/fwd_block.cuh for the measurements behind two loops in sequence). The order of query tiles changes no
    // bits: in deterministic mode each dQ float still receives its additions in key-tile order.
    m_plain_lo = m_plain_hi = m_begin;
    if (p.softcap_prescale == 0.f)
      mask.full_query_tiles(n0, n0 + kBlockN, kBlockM, m_begin, m_begin + num_m, m_plain_lo, m_plain_hi);
    int const num_m_plain = m_plain_hi - m_plain_lo;
    int const num_m_general = num_m - num_m_plain;
    // One flat walk over (head, query tile) pairs, so the Q/dO prefetch crosses head boundaries like tile ones:
    // the general tiles of every head (those below the plain range, then those above it), then the plain ones.
    num_general = num_m_general * num_heads;
    num_iters = num_m * num_heads;
    per_head_general = cutlass::FastDivmod(max(num_m_general, 1));
    per_head_plain = cutlass::FastDivmod(max(num_m_plain, 1));
    return true;
  }

  // The query tiles [m_lo, m_lo + count) that can see the key tile starting at key k0 >= 0 of this sequence (none
  // past its keys): the walk's range, also asked of a neighbouring key tile n by the deterministic dQ order
  // (sees(), common/bwd_dq_order.cuh).
  // (Computed in locals, written once: the outputs may be this block's own members.)
  CUTE_DEVICE void query_tiles(int k0, int& m_lo, int& count) const {
    int lo = 0, num = 0;
    if (k0 < seq.seqlen_k) {
      int const q_lo = mask.query_begin(k0);
      int const q_hi = mask.query_end(min(k0 + kBlockN, seq.seqlen_k));
      if (q_hi > q_lo) lo = q_lo / kBlockM, num = (q_hi + kBlockM - 1) / kBlockM - lo;
    }
    m_lo = lo, count = num;
  }
  CUTE_DEVICE bool sees(int n, int m) const {
    if (n < 0) return false;
    int m_lo, count;
    query_tiles(n * kBlockN, m_lo, count);
    return m >= m_lo && m < m_lo + count;
  }

  // Every key row the sequence owns gets a gradient; rows past seqused_k (seq.seqlen_k) get zeros. Recomputed where
  // needed rather than kept: held across the mainloop, it was what ptxas spilled (hd256 64x16 on sm_80). Not
  // SeqInfo::key_rows (the same value): reading p.seqlen_k instead of seq.seqlen_k made the Hopper hd128 backward
  // spill 380 B (bench/RESULTS.md, seventh session).
  CUTE_DEVICE int key_rows(BwdKernelParams const& p) const {
    return p.seq_spans ? p.seq_spans[b].key_rows : seq.seqlen_k;
  }

  // Flat iteration -> (query head, query tile).
  CUTE_DEVICE void tile_of(int it, int& h, int& m) const {
    bool const general = it < num_general;
    int const j = general ? it : it - num_general;
    int dh, k;
    if (general)
      per_head_general(dh, k, j);
    else
      per_head_plain(dh, k, j);
    h = h_first + dh;
    m = !general ? m_plain_lo + k : k < m_plain_lo - m_begin ? m_begin + k : m_plain_hi + (k - (m_plain_lo - m_begin));
  }

  // Row 0 of this block's sequence in each tensor; K, V, dK and dV at this CTA's K/V head, Q and dO at head 0.
  template <class Element>
  CUTE_DEVICE Element const* k(BwdKernelParams const& p) const {
    return static_cast<Element const*>(p.k) + seq.k_offset(p, b, p.k_batch_stride, p.k_row_stride) +
           h_kv * p.k_head_stride;
  }
  template <class Element>
  CUTE_DEVICE Element const* v(BwdKernelParams const& p) const {
    return static_cast<Element const*>(p.v) + seq.k_offset(p, b, p.v_batch_stride, p.v_row_stride) +
           h_kv * p.v_head_stride;
  }
  template <class Element>
  CUTE_DEVICE Element const* q(BwdKernelParams const& p) const {
    return static_cast<Element const*>(p.q) + seq.q_offset(p, b, p.q_batch_stride, p.q_row_stride);
  }
  template <class Element>
  CUTE_DEVICE Element const* dout(BwdKernelParams const& p) const {
    return static_cast<Element const*>(p.dout) + seq.q_offset(p, b, p.dout_batch_stride, p.dout_row_stride);
  }
  template <class Element>
  CUTE_DEVICE Element* dk(BwdKernelParams const& p) const {
    return static_cast<Element*>(p.dk) + seq.k_offset(p, b, p.dk_batch_stride, p.dk_row_stride) +
           h_kv * p.dk_head_stride;
  }
  template <class Element>
  CUTE_DEVICE Element* dv(BwdKernelParams const& p) const {
    return static_cast<Element*>(p.dv) + seq.k_offset(p, b, p.dv_batch_stride, p.dv_row_stride) +
           h_kv * p.dv_head_stride;
  }
  // First float of the GQA dK/dV accumulators at this CTA's K/V head, rows of nheads_kv * head_dim_rounded.
  CUTE_DEVICE int64_t kv_accum_offset(BwdKernelParams const& p) const {
    return (int64_t)b * p.seqlen_k_rounded * p.nheads_kv * p.head_dim_rounded + (int64_t)h_kv * p.head_dim_rounded;
  }
};

}  // namespace flashcute
