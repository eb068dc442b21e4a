// Deterministic dQ by turns, for the backward tiles that declare it (BwdTraits::kDqTurns): the CTAs (one key tile
// each) that add into one query tile of the float32 dQ accumulator take turns in a fixed order of their key tiles,
// so every float receives its additions in the same order on every run, in the one accumulator the default mode
// uses. The other deterministic scheme, a dQ slot per CTA of a column (src/api/workspace.h), costs no waiting but a
// dQ-sized buffer per slot, whose additions go to memory once the slots outgrow L2. On the H200 (bench/RESULTS.md,
// fourteenth session) turns cost about 0.5-0.7 us per step whatever the head dim (most likely the GPU-scope
// release, MEMBAR.GPU, of each warp's hand-over in every step, and the hand-overs the CTAs of a column queue behind
// at the start of each walk): at hd192 and hd256 they ran at 0.75-0.92x the default mode against the slots'
// 0.54-0.66x. On an H100 (2026-12-06, second session) the hd64 and hd128 tiles' turns ran 1.09-1.44x their slots,
// and at hd128 a writer thread that takes the waits and the release off the MMA warps (src/sm90/bwd_kernel.cuh,
// bwd_ws_kernel) 1.14-1.33x the per-warp turns, 0.83-0.94x the default mode. The writer polls and releases
// word 0 of a query tile's words; the MMA warps of the other kernels one word each.
//
// Turns are kept per (query head, query tile, warp): a warp's dQ fragment covers the same floats in every CTA
// (T::dq_frag_offset depends on the thread alone), so warp w waits only for warp w of the key tile before it. A
// turn word holds 1 + the key tile that added last (0: none yet; the preprocess zeroes the words).
//
// Lanes (p.dq_slots of them, src/api/workspace.h): key tile n adds into dQ slot n % lanes and takes turns with the
// key tiles of its lane alone, each lane with turn words of its own; the dQ conversion sums the slots in order.
// A column's hand-overs at one query tile form a chain as long as its key tiles, so with many key tiles per query
// tile (1k query rows against 16k keys) the chain, not the work, sets the time: 2.6-4.0x the default mode's with
// one lane, 1.1-1.35x with eight (H100, bench/RESULTS.md, 2026-12-06 fourth session, run 1).
//
// Order. With the mask's right side bounded (causal, or a window), a key tile's first visible query tile grows
// with the key tile, so every walk reaches a query tile after the walk of the key tile above it: the highest key
// tile goes first, and no CTA waits in the steady state. Otherwise every walk starts at the first query tile and
// the lowest key tile goes first; the CTAs of a column then settle one hand-over apart. for_each_key_tile gives
// the key tile that goes first the lowest launch index, so a CTA only ever waits for CTAs launched before it,
// which the GPU has started (or finished) already: no wait can deadlock. The key tiles of a column are launched
// one after another, so the CTAs in flight share their Q and dO tiles in L2; launching the columns interleaved
// (the first key tile of every column, then the second, or chunks of 4 or 8 key tiles) shortens the queue of
// hand-overs but loses that sharing, and ran the hd256 tile at 0.5-1.08x this order (H100, 2026-12-06, second
// session).
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

#include "common/kernel_params.h"

namespace flashcute {

struct DqTurns {
  // The turn word of this thread's warp for key tile n's lane and the query tile at row m0 of (batch, head) row
  // block bh.
  CUTE_DEVICE static int64_t lane_words(BwdKernelParams const& p) {
    return (int64_t)p.batch * p.nheads * p.seqlen_q_rounded / kDqTurnRows;
  }
  template <int kBlockM, int kWarps>
  CUTE_DEVICE static int* word(BwdKernelParams const& p, int64_t bh, int m0, int n) {
    static_assert(kWarps * kDqTurnRows <= kBlockM, "more turn words per query tile than the workspace holds");
    return p.dq_turns + (n % p.dq_slots) * lane_words(p) + (bh * p.seqlen_q_rounded + m0) / kBlockM * kWarps +
           (int)threadIdx.x / 32;
  }

  // The key tile of n's lane whose additions come just before key tile n's, if it sees the same query tile.
  CUTE_DEVICE static int before(BwdKernelParams const& p, int n) {
    return p.dq_descending ? n + p.dq_slots : n - p.dq_slots;
  }

  // The value the turn word of query tile m holds once key tile n may add: key tile n's predecessor in the order
  // has added where that key tile sees query tile m (blk: common/bwd_block.cuh), else no key tile has.
  template <class Block>
  CUTE_DEVICE static int awaited(BwdKernelParams const& p, Block const& blk, int m, int n) {
    int const prev = before(p, n);
    return blk.sees(prev, m) ? prev + 1 : 0;
  }

  // Waits for this warp's turn at query tile m of (batch, head) row block bh (awaited()). Returns the word to
  // pass() once this warp's additions are issued.
  template <int kBlockM, int kWarps, class Block>
  CUTE_DEVICE static int* await(BwdKernelParams const& p, Block const& blk, int64_t bh, int m, int n) {
    int* const w = word<kBlockM, kWarps>(p, bh, m * kBlockM, n);
    wait(w, awaited(p, blk, m, n));
    return w;
  }

  // One thread polls until the word says `value`; its later additions are then ordered after those the releasing
  // thread made visible before it.
  CUTE_DEVICE static void poll(int const* word, int value) {
    int seen;
    do {
      asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(seen) : "l"(word) : "memory");
    } while (seen != value);
  }
  // One thread hands the turn on: the release store orders the additions visible to it before the store.
  CUTE_DEVICE static void release(int* word, int value) {
    asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(word), "r"(value) : "memory");
  }

  // The warp's forms: one lane polls, and the warp barrier makes its acquire the warp's.
  CUTE_DEVICE static void wait(int const* word, int value) {
    if (threadIdx.x % 32 == 0) poll(word, value);
    __syncwarp();
  }
  // Hands the turn on once every lane's additions are visible at GPU scope (the release store orders them, the
  // warp barrier makes them the storing lane's).
  CUTE_DEVICE static void pass(int* word, int value) {
    __syncwarp();
    if (threadIdx.x % 32 == 0) release(word, value);
  }
};

}  // namespace flashcute
