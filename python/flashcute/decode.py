"""How flash_attn_with_kvcache arranges a call over a KV cache (contiguous or paged) for the C library's paged
forward, so that decode-shaped calls (a few query rows against a long cache) keep the GPU busy and read each K/V
head once:

- pack GQA: the g query heads that share a K/V head become g query rows of one head (row i * g + j is query row i
  of query head hk * g + j), so one tile reads that K/V head for all of them; the C API's packed_gqa tells the
  kernels, whose masks then see query row i, so every mask serves (causal, window), but not the learnable sink
  (one logit per query head);
- split KV (the C API's num_splits): each sequence's keys in chunks of whole key tiles computed side by side, their
  float32 partials combined by the library, where the learnable sink joins.

A contiguous cache is passed as pages too, one page of capacity rows per sequence, so both layouts run the same
kernels over the same key chunks: their results are bit-identical."""
import math


def packs(learnable_sink, group, seqlen_q):
    """Whether the query heads of a K/V head share one tile (see the module docstring): where packed rows fill the
    128-row query tiles clearly better than each head's own rows do (decode). Where both fill them, packing only
    multiplies the CTAs by the group and costs the copies of q and out: a causal prefill of 1k-8k rows (GQA 32/8,
    hd128, H200) ran 1.03-2.0x slower packed (bench/RESULTS.md, fifteenth session, run 2)."""
    def filled(rows):
        return rows / (-(-rows // 128) * 128)
    return group > 1 and learnable_sink is None and filled(seqlen_q) < 0.9 * filled(seqlen_q * group)


def limit_splits(num_splits, batch):
    """A given num_splits within the C API's limits (at most 256, and 65535 CTAs along the batch); 0 stays 0, which
    the GPU op resolves with choose_splits and the CPU reference takes as unsplit."""
    return min(num_splits, 256, max(1, 65535 // max(batch, 1))) if num_splits > 0 else 0


def choose_splits(batch, heads, rows, capacity, wave):
    """num_splits = 0 on the GPU: as many chunks of >= 512 keys as one wave holds, for decode-shaped calls only (one
    query tile per head). heads: the call's (the K/V heads when packed), rows: each head's query rows, wave: the
    CTAs that run at once (SMs x the CTAs per SM of the tile dispatch picks, flashcute_fwd_occupancy), a number or
    a function giving it (asked only for calls that may split).
    One wave beat two full ones on the Hopper tile (one CTA per SM): batch 1 against 128k keys (8 K/V heads) read
    the cache at 95% of the copy ceiling in 16 chunks, 92% in 32 and 77% in 128 (bench/RESULTS.md, nineteenth
    session, run 2, with a combine whose cost no longer grows with the chunks); the portable 64-row tiles hold two
    CTAs per SM, and at batch 1 read at 80% in their one wave (32 chunks) against 59% in 16 (twentieth session, run
    5). Prefill rows against their own cache are not split: a causal 1k prefill at batch 1 ran 2.5x slower in two
    chunks than flash_attn_func (fifteenth session, run 3)."""
    if capacity < 1024 or rows > 128:
        return 1
    tiles = batch * heads * math.ceil(rows / 128)
    slots = wave() if callable(wave) else wave
    return max(1, min(slots // max(tiles, 1), capacity // 512, 64))


def attention(q, k_pages, v_pages, page_table, used, args, learnable_sink, num_splits, pack):
    """q (batch, seqlen_q, nheads, D); k_pages / v_pages (pages, page_size, nheads_kv, D) with page_table (batch,
    max_pages) int32; sequence b's first used[b] keys take part. args: (scale, causal, window_left, window_right,
    softcap) as the C API takes them; pack: from packs(). Returns (out, lse) as flash_attn_func."""
    from . import ops

    batch, seqlen_q, nheads, d = q.shape
    heads_kv = k_pages.shape[2]
    if not pack:
        return ops.call(ops.paged_fwd, q, k_pages, v_pages, page_table, used, *args, learnable_sink, num_splits)
    group = nheads // heads_kv
    rows = seqlen_q * group
    packed = q.reshape(batch, seqlen_q, heads_kv, group, d).transpose(2, 3).reshape(batch, rows, heads_kv, d)
    out, lse = ops.call(ops.paged_fwd, packed, k_pages, v_pages, page_table, used, *args, None, num_splits, group)
    dv = out.shape[-1]
    # Unpack rows (i, j) back to query row i of head hk * group + j (a view where seqlen_q is 1: ops._paged_out).
    out = out.reshape(batch, seqlen_q, group, heads_kv, dv).transpose(2, 3).reshape(batch, seqlen_q, nheads, dv)
    lse = lse.reshape(batch, heads_kv, seqlen_q, group).transpose(2, 3).reshape(batch, nheads, seqlen_q)
    return out, lse
