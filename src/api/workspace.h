// Layout of the backward's float32 workspace, shared by the size query and the launch code.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flashcute {

struct BwdWorkspace {
  static constexpr int kRowAlign = 128;  // every block_m/block_n of the backward divides this
  // Deterministic mode: key tile n adds its dQ into slot n % slots, and the key tiles of one slot take turns on each
  // query tile. More slots make the chain of turns shorter (a key tile waits for the one `slots` below it, not
  // the one just below) at the price of one more dQ-sized float32 buffer each; the postprocess sums the slots
  // in a fixed order.
  static constexpr int kDeterministicDqSlots = 4;

  int64_t seqlen_q_rounded, seqlen_k_rounded, head_dim_rounded;
  int dq_slots;
  int64_t dq_slot_elems;  // float32 elements of one slot
  size_t dq_accum, dsoftmax_sum, lse_log2, dk_accum, dv_accum, dq_semaphore;  // byte offsets
  size_t total;

  // Varlen sequences each get a region of the rounded maximum length, indexed by sequence number.
  static BwdWorkspace make(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t nheads, int64_t nheads_kv,
                           int64_t tile_head_dim, int block_m, int block_n, bool deterministic) {
    auto round = [](int64_t x, int64_t a) { return (x + a - 1) / a * a; };
    auto align = [](size_t x) { return (x + 255) / 256 * 256; };
    BwdWorkspace w{};
    w.seqlen_q_rounded = round(seqlen_q, kRowAlign);
    w.seqlen_k_rounded = round(seqlen_k, kRowAlign);
    w.head_dim_rounded = tile_head_dim;
    int64_t const key_tiles = (seqlen_k + block_n - 1) / block_n;
    w.dq_slots = deterministic ? (int)(key_tiles < kDeterministicDqSlots ? (key_tiles > 0 ? key_tiles : 1)
                                                                         : kDeterministicDqSlots)
                               : 1;
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
    w.dq_semaphore = off;
    off = align(off + (deterministic ? sizeof(int) * w.dq_slots * batch * nheads * (w.seqlen_q_rounded / block_m) : 0));
    w.total = off;
    return w;
  }
};

}  // namespace flashcute
