"""flash_attn_with_kvcache: attention of new queries against a KV cache, contiguous or paged, with the new keys and
values appended first (optionally rotated). One call of the C library's paged forward: the kernels read the pages
in place through the page table (a contiguous cache is one page of capacity rows per sequence), sequence b's
first cache_seqlens[b] + new keys taking part, so every kernel family, mask, softcap, GQA and learnable sink serve
it, paged and contiguous caches give the same bits, and it is CUDA-graph capturable (no host read unless a check
needs one outside capture). Decode-shaped calls pack GQA and split the keys (decode.py). Varlen queries run the
varlen kernels instead, a paged cache gathered into the contiguous layout first."""
import numbers

import torch
from torch import Tensor

from . import decode, ops


def _int32_vector(x, name, batch, device):
    """cache_seqlens as an int32 (batch,) tensor on device: from a tensor of that shape or one integer."""
    if isinstance(x, Tensor):
        if x.dim() != 1 or x.numel() != batch or x.dtype != torch.int32:
            raise ValueError(f"{name} must be a (batch = {batch},) int32 tensor, got {x.dtype} {tuple(x.shape)}")
        if x.device != device:
            raise ValueError(f"{name} is on {x.device} but q is on {device}")
        return x
    if isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < 0:
        raise ValueError(f"{name} must be a non-negative integer or an int32 tensor, got {x!r}")
    return torch.full((batch,), int(x), dtype=torch.int32, device=device)


_CONTIGUOUS_TABLES = {}


def _contiguous_table(batch, device):
    """The page table of a contiguous cache, sequence b being page b: (batch, 1) int32, kept per (device, batch) so
    that a decode step does not launch a kernel to make it (a graph node of about 1.5 us beside a 13-17 us step at
    4k keys). torch.compile traces its own; a capture uses the kept one, or makes one it does not keep (it would be
    filled only when the graph runs). Kept tables are complete before they are handed out (one sync, once)."""
    table = None if torch.compiler.is_compiling() else _CONTIGUOUS_TABLES.get((device, batch))
    if table is None:
        table = torch.arange(batch, device=device, dtype=torch.int32)[:, None]
        if _host_checks_allowed(device):
            if device.type == "cuda":  # once: complete before any stream reads it
                torch.cuda.current_stream(device).synchronize()
            _CONTIGUOUS_TABLES[(device, batch)] = table
    return table


def _host_checks_allowed(device):
    """Checks that read device values on the host: everywhere except under CUDA graph capture and torch.compile
    tracing (where they would break the graph)."""
    if torch.compiler.is_compiling():
        return False
    return device.type != "cuda" or not torch.cuda.is_current_stream_capturing()


def _rotate(x, cos, sin, positions, interleaved):
    """Rotary embedding of the first 2 * cos.shape[1] channels of x (B, S, H, D) at positions (B, S): interleaved
    (pairs 2i, 2i+1) or half-split (i, i + rotary_dim / 2), computed in float32 (float64 for float64 x)."""
    half = cos.shape[1]
    acc = torch.promote_types(x.dtype, torch.float32)
    c = cos[positions][:, :, None, :].to(acc)
    s = sin[positions][:, :, None, :].to(acc)
    r = x[..., : 2 * half].to(acc)
    if interleaved:
        x1, x2 = r[..., 0::2], r[..., 1::2]
        rotated = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:
        x1, x2 = r[..., :half], r[..., half:]
        rotated = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    return torch.cat((rotated.to(x.dtype), x[..., 2 * half:]), dim=-1)


def _check_cache(q, k_cache, v_cache, k, v, page_table, cu_seqlens_q):
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor ((batch or pages), rows, nheads_kv, head_dim)")
        if t.device != q.device or t.dtype != q.dtype:
            raise ValueError(f"{name} must be on q's device with q's dtype ({q.device}, {q.dtype}), got "
                             f"{t.device}, {t.dtype}")
    if k_cache.shape[:3] != v_cache.shape[:3]:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must agree in all but "
                         "the head dim")
    if q.dim() != (3 if cu_seqlens_q is not None else 4):
        raise ValueError("q must be (batch, seqlen_q, nheads, head_dim), or (total_q, nheads, head_dim) with "
                         f"cu_seqlens_q; got {tuple(q.shape)}")
    if q.shape[-1] != k_cache.shape[3]:
        raise ValueError(f"q's head dim {q.shape[-1]} differs from k_cache's {k_cache.shape[3]}")
    if (k is None) != (v is None):
        raise ValueError("k and v (the new keys and values) must be given together")
    if k is not None:
        if cu_seqlens_q is not None:
            raise ValueError("k and v (appending) need fixed-length queries, not cu_seqlens_q")
        for name, t, cache in (("k", k, k_cache), ("v", v, v_cache)):
            if not isinstance(t, Tensor) or t.dim() != 4 or t.shape[0] != q.shape[0] or t.shape[2:] != cache.shape[2:]:
                raise ValueError(f"{name} must be (batch = {q.shape[0]}, seqlen_new, {cache.shape[2]}, "
                                 f"{cache.shape[3]}), got {tuple(t.shape) if isinstance(t, Tensor) else t!r}")
            if t.dtype != q.dtype or t.device != q.device:
                raise ValueError(f"{name} must be on q's device with q's dtype")
        if k.shape[1] != v.shape[1]:
            raise ValueError(f"k and v must hold as many new rows, got {k.shape[1]} and {v.shape[1]}")
    if page_table is not None:
        if not isinstance(page_table, Tensor) or page_table.dim() != 2 or page_table.dtype != torch.int32:
            raise ValueError("page_table must be a (batch, max_pages) int32 tensor")
        if page_table.device != q.device:
            raise ValueError(f"page_table is on {page_table.device} but q is on {q.device}")


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, page_table=None,
                            cu_seqlens_q=None, softmax_scale=None, causal=False, window_size=(None, None),
                            softcap=0.0, num_splits=0, learnable_sink=None, rotary_cos=None, rotary_sin=None,
                            rotary_interleaved=False, max_seqlen_q=None):
    """Attention of q against a KV cache; returns (out, lse) as flash_attn_func (or flash_attn_varlen_func with
    cu_seqlens_q) does.

    k_cache, v_cache: (batch, max_seqlen_k, nheads_kv, head_dim), or with page_table (batch, max_pages) int32 the
    pages (num_pages, page_size, nheads_kv, head_dim), any page_size >= 1: row j of sequence b is row j % page_size
    of page page_table[b, j // page_size]. cache_seqlens (int32 (batch,) or an int; None: the whole cache) counts
    the valid rows of each sequence before the append (checked against the cache on the host when appending or on
    the CPU; on the GPU without appending the kernels clamp it, with no synchronisation). k, v (batch, seqlen_new,
    nheads_kv, head_dim), if given, are written into the cache in place at rows cache_seqlens[b] ... before
    attention, and sequence b then attends to its first cache_seqlens[b] + seqlen_new keys (causal and local masks
    align to its last key, bottom-right).
    rotary_cos / rotary_sin (seqlen_ro, rotary_dim / 2), with k given: k is rotated at its cache positions and q at
    cache_seqlens[b] + i (causal or local) or cache_seqlens[b] (otherwise), interleaved or half-split pairs.
    q: (batch, seqlen_q, nheads, head_dim), or (total_q, nheads, head_dim) with cu_seqlens_q (int32 (batch + 1,);
    max_seqlen_q to stay off the host). num_splits: how many chunks of whole key tiles each sequence's keys are
    cut into, computed side by side, their partial results combined in float32 (at most 256; not with
    cu_seqlens_q); 0 picks from the SM count and the work for decode-shaped calls (1 on the CPU, whose reference
    computes the same attention unsplit). learnable_sink, softcap, window_size as flash_attn_func.
    """
    from . import _arguments, flash_attn_varlen_func  # the package's entries, imported late: it imports this module

    _check_cache(q, k_cache, v_cache, k, v, page_table, cu_seqlens_q)
    ops.count(num_splits, "num_splits")
    device = q.device
    varlen_q = cu_seqlens_q is not None
    if varlen_q:
        if not isinstance(cu_seqlens_q, Tensor) or cu_seqlens_q.dim() != 1 or cu_seqlens_q.dtype != torch.int32:
            raise ValueError("cu_seqlens_q must be a 1-D int32 tensor of batch + 1 offsets")
        batch = cu_seqlens_q.numel() - 1
    else:
        batch = q.shape[0]
    paged = page_table is not None
    if paged:
        if page_table.shape[0] != batch:
            raise ValueError(f"page_table must have batch = {batch} rows, got {page_table.shape[0]}")
        page_size = k_cache.shape[1]
        capacity = page_table.shape[1] * page_size
    else:
        if k_cache.shape[0] < batch:
            raise ValueError(f"k_cache holds {k_cache.shape[0]} sequences, fewer than the batch of {batch}")
        capacity = k_cache.shape[1]
    new = 0 if k is None else k.shape[1]
    if cache_seqlens is None:
        if k is not None:
            raise ValueError("appending k and v needs cache_seqlens (where each sequence's new rows go)")
        seqlens = torch.full((batch,), capacity, dtype=torch.int32, device=device)
    else:
        seqlens = _int32_vector(cache_seqlens, "cache_seqlens", batch, device)
    # Read on the host (a synchronisation) only where it guards a write: appending; on the GPU the kernels clamp each
    # sequence's keys to the cache otherwise. On CPU tensors always.
    if _host_checks_allowed(device) and batch > 0 and (k is not None or device.type != "cuda"):
        longest = int(seqlens.max())
        if longest + new > capacity:
            raise ValueError(f"cache_seqlens + seqlen_new reaches {longest + new} rows, more than the cache holds "
                             f"({capacity})")
    rotary = rotary_cos is not None or rotary_sin is not None
    if rotary:
        if k is None:
            raise ValueError("rotary_cos / rotary_sin apply with k and v only (they rotate q and the new keys)")
        if not (isinstance(rotary_cos, Tensor) and isinstance(rotary_sin, Tensor) and rotary_cos.dim() == 2
                and rotary_cos.shape == rotary_sin.shape and 2 * rotary_cos.shape[1] <= q.shape[-1]):
            raise ValueError("rotary_cos and rotary_sin must both be (seqlen_ro, rotary_dim / 2) with rotary_dim <= "
                             "head_dim")
        if _host_checks_allowed(device) and batch > 0 and longest + max(new, q.shape[1]) > rotary_cos.shape[0]:
            raise ValueError(f"rotary_cos / rotary_sin hold {rotary_cos.shape[0]} positions, fewer than the cache "
                             "positions rotated")

    if k is not None:
        positions = seqlens.long()[:, None] + torch.arange(new, device=device)[None, :]  # (batch, new)
        if rotary:
            k = _rotate(k, rotary_cos, rotary_sin, positions, rotary_interleaved)
            local = causal or tuple(window_size) != (None, None)
            q_pos = seqlens.long()[:, None] + (torch.arange(q.shape[1], device=device)[None, :] if local else 0)
            q = _rotate(q, rotary_cos, rotary_sin, q_pos.expand(batch, q.shape[1]), rotary_interleaved)
        if paged:
            pages = page_table.long().gather(1, positions // page_size)
            k_cache[pages, positions % page_size] = k
            v_cache[pages, positions % page_size] = v
        else:
            rows = torch.arange(batch, device=device)[:, None]
            k_cache[rows, positions] = k
            v_cache[rows, positions] = v
    used = seqlens + new if new else seqlens
    scale, causal, window_left, window_right, softcap, _ = _arguments(q, softmax_scale, causal, window_size, softcap,
                                                                      False)

    if varlen_q:  # one row block per sequence; pages gathered into it (the paged kernels take fixed-length queries)
        if paged:  # entries past a sequence's pages may hold anything: clamped, unread
            table = page_table.long().clamp(0, k_cache.shape[0] - 1)
            keys, values = (c[table].reshape(batch * capacity, *c.shape[2:]) for c in (k_cache, v_cache))
        else:
            keys, values = (c[:batch].reshape(batch * capacity, *c.shape[2:]) for c in (k_cache, v_cache))
        cu_k = torch.arange(batch + 1, device=device, dtype=torch.int32) * capacity
        return flash_attn_varlen_func(q, keys, values, cu_seqlens_q, cu_k, softmax_scale=scale, causal=causal,
                                      window_size=window_size, softcap=softcap, seqused_k=used,
                                      max_seqlen_q=max_seqlen_q,
                                      max_seqlen_k=None if max_seqlen_q is None else capacity,
                                      learnable_sink=learnable_sink)
    seqlen_q = q.shape[1]
    if not paged:  # one page of capacity rows per sequence: the same kernels as a paged cache (decode.py)
        page_table = _contiguous_table(batch, device)
    group = q.shape[2] // k_cache.shape[2]
    pack = decode.packs(learnable_sink, group, seqlen_q)
    return decode.attention(q, k_cache, v_cache, page_table, used, (scale, causal, window_left, window_right, softcap),
                            learnable_sink, decode.limit_splits(num_splits, batch), pack)
