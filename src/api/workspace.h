// Layout of the backward's float32 workspace, shared by the size query and the launch code.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>

#include "common/kernel_params.h"

namespace flashcute {

struct BwdWorkspace {
  static constexpr int kRowAlign = 128;  // every block_m and (but 96) block_n of the backward divides this
  // How the CTAs add into dQ. kShared: all into one accumulator with atomics, in any order (the default mode).
  // Deterministic mode, by config (orders_dq_by_turns, BwdTraits::kDqTurns): kTurns, the same accumulator, the CTAs
  // of a query tile taking turns in key-tile order (common/bwd_dq_order.cuh; one int per kDqTurnRows query rows); or
  // kSlots, dq_slots CTAs per (batch, head) grid column, CTA s walking key tiles s, s + slots, ... and adding only
  // into accumulator slot s, so every slot sees its additions in one program order and no CTA ever waits for
  // another; the dQ conversion kernel sums the slots in a fixed order. choose_dq_slots() picks the count that
  // keeps the GPU busiest; each slot costs one dQ-sized float32 buffer, so at most kMaxDqSlots. Every CTA walks its
  // column's whole dQ once per key tile, so once the CTAs in flight walk more than L2 holds the additions go to
  // memory (ncu on an H100, hd128 16k: 39 GB of DRAM traffic against 1 GB in the default mode, 0.49x its speed;
  // bench/RESULTS.md, 2026-12-06 second session): the Hopper tiles take turns instead, the portable ones below hd256
  // keep slots.
  // kTurns in lanes: key tile n adds into accumulator slot n % lanes, in turns with the key tiles of its lane
  // alone (common/bwd_dq_order.cuh), so the chain of hand-overs at a query tile is key tiles / lanes long;
  // choose_dq_lanes() picks the count. dq_slots holds the slots in both schemes.
  enum class Dq { kShared, kSlots, kTurns };
  static constexpr int kMaxDqSlots = 16;
  static constexpr int kMaxDqLanes = 8;

  // Lanes for kTurns: one while the key tiles of a column are no more than its query tiles, else their ratio, at
  // most kMaxDqLanes. Each lane costs a dQ-sized float32 slot, and the additions of neighbouring key tiles, which
  // run side by side, then go to different slots, so more lanes than the chain needs cost L2: on an H100 (bf16,
  // bench/RESULTS.md, 2026-12-06 fourth session, run 1) 1k query rows against 16k keys ran 2.1-3.0x faster with 8
  // lanes than with one, while at equal lengths (1k-16k) 2 lanes ran 0.61-1.05x one.
  static int choose_dq_lanes(int64_t key_tiles, int64_t query_tiles) {
    if (query_tiles <= 0) return 1;
    return (int)std::max<int64_t>(1, std::min<int64_t>(key_tiles / query_tiles, kMaxDqLanes));
  }

  // The slot count s in [1, min(key tiles, kMaxDqSlots)] that wastes least: columns * s CTAs run in whole waves
  // of sm_count, and each walks ceil(key_tiles / s) tiles. Measured on the H200: 5 slots for 32 columns (160
  // CTAs, 1.2 waves) ran at 0.5x FA2 where 4 (one full wave) ran at 0.85x. Ties go to fewer slots.
  static int choose_dq_slots(int64_t key_tiles, int64_t columns, int64_t sm_count) {
    int best = 1;
    double best_use = -1.0;
    for (int64_t s = 1; s <= key_tiles && s <= kMaxDqSlots; ++s) {
      double const ctas = double(columns * s);
      double const waves = std::ceil(ctas / double(sm_count));
      double const use = ctas / (waves * double(sm_count)) * (double(key_tiles) / double(s)) /
                         std::ceil(double(key_tiles) / double(s));
      if (use > best_use + 1e-9) best = (int)s, best_use = use;
    }
    return best;
  }

  int64_t seqlen_q_rounded, seqlen_k_rounded, head_dim_rounded;
  Dq dq;
  int dq_slots;
  int64_t dq_slot_elems;  // float32 elements of one slot
  size_t seq_spans, dq_accum, dq_turns, dsoftmax_sum, lse_log2, dk_accum, dv_accum;  // byte offsets
  size_t total;

  // Varlen sequences each get a region of the rounded maximum length, indexed by sequence number; span_bytes is
  // the varlen prepare pass's table (0 for the fixed-length batch).
  static BwdWorkspace make(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t nheads, int64_t nheads_kv,
                           int64_t tile_head_dim, int block_m, int block_n, Dq dq, int grid_columns, int sm_count,
                           size_t span_bytes) {
    auto round = [](int64_t x, int64_t a) { return (x + a - 1) / a * a; };
    auto align = [](size_t x) { return (x + 255) / 256 * 256; };
    BwdWorkspace w{};
    w.seqlen_q_rounded = round(seqlen_q, kRowAlign);
    // Key tiles of 96 (the Hopper hd192 tile, kSwapKV) do not divide kRowAlign: their last tile's rows must
    // still lie in the sequence's rounded rows (GQA's float32 dK/dV accumulators).
    w.seqlen_k_rounded = round(seqlen_k, std::lcm<int64_t>(kRowAlign, block_n));
    w.head_dim_rounded = tile_head_dim;
    w.dq = dq;
    int64_t const key_tiles = (seqlen_k + block_n - 1) / block_n;
    int64_t const columns = grid_columns > 0 ? grid_columns : 1;
    int64_t const query_tiles = (seqlen_q + block_m - 1) / block_m;
    w.dq_slots = dq == Dq::kSlots   ? choose_dq_slots(key_tiles, columns, sm_count > 0 ? sm_count : 1)
                 : dq == Dq::kTurns ? choose_dq_lanes(key_tiles, query_tiles)
                                    : 1;
    w.dq_slot_elems = batch * nheads * w.seqlen_q_rounded * w.head_dim_rounded;
    size_t off = 0;
    w.seq_spans = off;
    off = align(off + span_bytes);
    w.dq_accum = off;
    off = align(off + sizeof(float) * w.dq_slots * w.dq_slot_elems);
    w.dq_turns = off;
    off = align(off + (dq == Dq::kTurns ? sizeof(int) * w.dq_slots * batch * nheads * w.seqlen_q_rounded / kDqTurnRows
                                        : 0));
    w.dsoftmax_sum = off;
    off = align(off + sizeof(float) * batch * nheads * w.seqlen_q_rounded);
    w.lse_log2 = off;
    off = align(off + sizeof(float) * batch * nheads * w.seqlen_q_rounded);
    bool const gqa = nheads != nheads_kv;
    size_t const kv_bytes = gqa ? sizeof(float) * batch * w.seqlen_k_rounded * nheads_kv * w.head_dim_rounded : 0;
    w.dk_accum = off;
    off = align(off + kv_bytes);
    w.dv_accum = off;
    off = align(off + kv_bytes);
    w.total = off;
    return w;
  }
};

}  // namespace flashcute
