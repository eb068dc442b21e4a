// Layout of the backward's float32 workspace, shared by the size query and the launch code.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flashcute {

struct BwdWorkspace {
  static constexpr int kRowAlign = 128;  // every block_m/block_n of the backward divides this
  // Deterministic mode: dq_slots CTAs per (batch, head) grid column; CTA s walks key tiles s, s + slots, ... and
  // adds dQ only into accumulator slot s, so every slot sees its additions in one program order and no CTA ever
  // waits for another. The postprocess sums the slots in a fixed order. Enough slots to fill the GPU (at least
  // kMinDqSlots, for balance when there are many heads), never more than there are key tiles; each costs one
  // dQ-sized float32 buffer.
  static constexpr int kMinDqSlots = 4;

  int64_t seqlen_q_rounded, seqlen_k_rounded, head_dim_rounded;
  int dq_slots;
  int64_t dq_slot_elems;  // float32 elements of one slot
  size_t dq_accum, dsoftmax_sum, lse_log2, dk_accum, dv_accum;  // byte offsets
  size_t total;

  // Varlen sequences each get a region of the rounded maximum length, indexed by sequence number.
  static BwdWorkspace make(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t nheads, int64_t nheads_kv,
                           int64_t tile_head_dim, int block_n, bool deterministic, int grid_columns,
                           int sm_count) {
    auto round = [](int64_t x, int64_t a) { return (x + a - 1) / a * a; };
    auto align = [](size_t x) { return (x + 255) / 256 * 256; };
    BwdWorkspace w{};
    w.seqlen_q_rounded = round(seqlen_q, kRowAlign);
    w.seqlen_k_rounded = round(seqlen_k, kRowAlign);
    w.head_dim_rounded = tile_head_dim;
    int64_t const key_tiles = (seqlen_k + block_n - 1) / block_n;
    int64_t const columns = grid_columns > 0 ? grid_columns : 1;
    int64_t const fill = (sm_count + columns - 1) / columns;
    int64_t const slots = fill > kMinDqSlots ? fill : kMinDqSlots;
    w.dq_slots = deterministic ? (int)(slots < key_tiles ? slots : (key_tiles > 0 ? key_tiles : 1)) : 1;
    w.dq_slot_elems = batch * nheads * w.seqlen_q_rounded * w.head_dim_rounded;
    size_t off = 0;
    w.dq_accum = off;
    off = align(off + sizeof(float) * w.dq_slots * w.dq_slot_elems);
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
