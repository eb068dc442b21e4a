"""Decode-shaped attention (a few query rows against a long cache) through the varlen kernels, arranged so that the
GPU has enough independent work and reads each K/V head once:

- pack GQA: the g query heads that share a K/V head become g query rows of one head (row i * g + j is query row i
  of query head hk * g + j), so one tile reads that K/V head for all of them;
- split KV: the cache of each sequence is cut into num_splits chunks, each an independent varlen sequence with the
  same (packed) query rows; the partial outputs are then combined in float32 by their log-sum-exps (with the
  learnable sink, which must count once, joining the combine instead of the kernels).

Both change which rows a mask sees as the diagonal, so they serve calls whose masks do not depend on the row: one
query row (causal bottom-right then sees every key) or no mask, and no sliding window. The partial outputs pass
through the output dtype before the combine (one extra rounding of each partial).

A contiguous cache runs as varlen sequences (one per chunk); a paged one as a batch of chunks whose page-table
rows are slices of the caller's (the C API's paged forward), each chunk a whole number of pages. Chunks fall on
the same rows in both layouts when ceil(capacity / splits) is a multiple of the page size, which the automatic
choice ensures for page sizes dividing 256: the results are then bit-identical."""
import math

import torch


def applies(seqlen_q, causal, window_size):
    """Whether pack/split keep the call's meaning (see the module docstring)."""
    return tuple(window_size) == (None, None) and (seqlen_q == 1 or not causal)


def choose_splits(num_splits, batch, heads_kv, rows, capacity, device):
    """num_splits as given (at most one per key), or for 0 enough chunks of >= 1024 keys, each a multiple of 256
    keys, that the grid has about two tiles per SM (one on the CPU)."""
    if num_splits > 0:
        return max(1, min(num_splits, capacity))
    if device.type != "cuda" or capacity < 2048:
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    tiles = batch * heads_kv * math.ceil(rows / 128)
    splits = max(1, min(math.ceil(2 * sms / max(tiles, 1)), capacity // 1024, 64))
    chunk = -(-math.ceil(capacity / splits) // 256) * 256
    return math.ceil(capacity / chunk)


def chunk_rows(capacity, splits, page_size=1):
    """Keys per chunk: ceil(capacity / splits), rounded up to whole pages."""
    chunk = math.ceil(capacity / splits)
    return -(-chunk // page_size) * page_size


def decode_attention(q, cache, used, capacity, softmax_scale, softcap, learnable_sink, splits):
    """q (batch, seqlen_q, nheads, D); cache: ("rows", keys, values) with keys / values (batch * capacity,
    nheads_kv, D), sequence b being rows [b * capacity, (b + 1) * capacity); or ("pages", k_pages, v_pages,
    page_table) as flash_attn_with_kvcache takes them. Sequence b's first used[b] (int32 (batch,)) keys take part.
    Returns out (batch, seqlen_q, nheads, Dv) in q's dtype and lse (batch, nheads, seqlen_q), as flash_attn_func.
    splits: from choose_splits."""
    from . import ops
    from . import flash_attn_varlen_func  # the package's public entry (this module is imported by it)

    paged = cache[0] == "pages"
    batch, seqlen_q, nheads, d = q.shape
    heads_kv = cache[1].shape[-2]
    group = nheads // heads_kv
    rows = seqlen_q * group
    device = q.device
    page_size = cache[1].shape[1] if paged else 1
    chunk = chunk_rows(capacity, splits, page_size) if capacity else 0
    splits = math.ceil(capacity / chunk) if capacity else 1

    # Packed queries, one copy per chunk: sequence (b, s) holds rows (i, j) -> i * group + j.
    packed = q.reshape(batch, seqlen_q, heads_kv, group, d).transpose(2, 3).reshape(batch, rows, heads_kv, d)
    queries = packed[:, None].expand(batch, splits, rows, heads_kv, d)
    # Chunk s of sequence b: its keys [s * chunk, (s + 1) * chunk), of which those below used[b].
    first = torch.arange(splits, device=device, dtype=torch.int64) * chunk
    used_s = (used.to(torch.int64)[:, None] - first[None, :]).clamp(min=0, max=chunk).reshape(-1).to(torch.int32)
    if paged:
        _, k_pages, v_pages, table = cache
        per = chunk // page_size  # pages per chunk; the table padded to whole chunks (entries past used: unread)
        table = torch.nn.functional.pad(table, (0, splits * per - table.shape[1]))
        unbounded = ops.window_side(None)
        out_s, lse_s = ops.paged_fwd(queries.reshape(batch * splits, rows, heads_kv, d), k_pages, v_pages,
                                     table.reshape(batch * splits, per), used_s, softmax_scale, False, unbounded,
                                     unbounded, softcap)
        lse_p = lse_s.reshape(batch, splits, heads_kv, rows).transpose(2, 3)  # (b, s, rows, hkv)
    else:
        _, keys, values = cache
        cu_q = torch.arange(batch * splits + 1, device=device, dtype=torch.int32) * rows
        starts = (torch.arange(batch, device=device, dtype=torch.int64)[:, None] * capacity + first[None, :])
        cu_k = torch.cat((starts.reshape(-1), torch.full((1,), batch * capacity, device=device,
                                                         dtype=torch.int64))).to(torch.int32)
        out_s, lse_s = flash_attn_varlen_func(queries.reshape(batch * splits * rows, heads_kv, d), keys, values,
                                              cu_q, cu_k, softmax_scale=softmax_scale, causal=False, softcap=softcap,
                                              seqused_k=used_s, max_seqlen_q=rows, max_seqlen_k=chunk)
        lse_p = lse_s.reshape(heads_kv, batch, splits, rows).permute(1, 2, 3, 0)  # (b, s, rows, hkv)
    dv = out_s.shape[-1]
    out_p = out_s.reshape(batch, splits, rows, heads_kv, dv)

    if splits == 1 and learnable_sink is None:  # the kernel's own results, unpacked
        out, lse = out_p[:, 0], lse_p[:, 0]  # (batch, rows, hkv, dv), (batch, rows, hkv)
    else:
        acc = torch.promote_types(lse_p.dtype, torch.float32)
        lse_p = lse_p.to(acc)
        top = lse_p.max(dim=1).values  # (b, rows, hkv)
        sink = None
        if learnable_sink is not None:  # per packed row: row i * group + j of K/V head hk is query head hk*g + j
            per_head = learnable_sink.to(device=device, dtype=acc).reshape(heads_kv, group).t()  # (group, hkv)
            sink = per_head.repeat(seqlen_q, 1)[None]  # (1, rows, hkv)
            top = torch.maximum(top, sink)
        finite_top = torch.where(torch.isinf(top) & (top < 0), torch.zeros_like(top), top)
        weights = torch.exp(lse_p - finite_top[:, None])  # 0 for chunks that saw no key
        total = weights.sum(dim=1)
        if sink is not None:
            total = total + torch.exp(sink - finite_top)
        out = (weights[..., None] * out_p.to(acc)).sum(dim=1) / total.clamp(min=torch.finfo(acc).tiny)[..., None]
        out = out.to(q.dtype)
        lse = torch.where(total > 0, finite_top + torch.log(total), torch.full_like(total, -math.inf))
    # Unpack rows (i, j) back to query row i of head hk * group + j.
    out = out.reshape(batch, seqlen_q, group, heads_kv, dv).transpose(2, 3).reshape(batch, seqlen_q, nheads, dv)
    lse = lse.reshape(batch, seqlen_q, group, heads_kv).permute(0, 3, 2, 1).reshape(batch, nheads, seqlen_q)
    return out, lse.contiguous()
