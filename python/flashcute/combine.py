"""flash_attn_combine: FlashAttention-4's merge of split attention partials (out, lse per split) into the attention
over all their keys, in float32 with torch operations (the library's own split-KV calls merge in its combine
kernel)."""
import torch
from torch import Tensor


def _used_rows(shape, cu_seqlens, seqused, device):
    """Which rows of the combined result a call covers: (batch, seqlen) or (total_q,) booleans, or None for all."""
    if cu_seqlens is None and seqused is None:
        return None
    for name, t in (("cu_seqlens", cu_seqlens), ("seqused", seqused)):
        if t is not None and (not isinstance(t, Tensor) or t.dim() != 1 or t.dtype != torch.int32 or
                              t.device != device):
            raise ValueError(f"{name} must be a 1-D int32 tensor on {device}")
    if len(shape) == 2:  # batched: (batch, seqlen); cu_seqlens means nothing here
        if cu_seqlens is not None:
            raise ValueError("cu_seqlens applies to the packed form (out_partial of 4 dimensions)")
        batch, seqlen = shape
        if seqused.numel() != batch:
            raise ValueError(f"seqused must hold batch = {batch} entries, got {seqused.numel()}")
        return torch.arange(seqlen, device=device)[None, :] < seqused[:, None]
    if cu_seqlens is None:
        raise ValueError("seqused of a packed out_partial needs cu_seqlens")
    if seqused is not None and seqused.numel() != cu_seqlens.numel() - 1:
        raise ValueError(f"seqused must hold batch = {cu_seqlens.numel() - 1} entries, got {seqused.numel()}")
    if cu_seqlens.numel() < 2:  # no sequence
        return torch.zeros(shape, dtype=torch.bool, device=device)
    rows = torch.arange(shape[0], device=device, dtype=torch.int32)
    starts, ends = cu_seqlens[:-1].long(), cu_seqlens[1:].long()
    seq = torch.searchsorted(cu_seqlens[1:].contiguous(), rows, right=True).clamp(max=starts.numel() - 1)
    inside = (rows >= starts[seq]) & (rows < ends[seq])
    if seqused is not None:
        inside &= rows - starts[seq] < seqused.long()[seq]
    return inside


def flash_attn_combine(out_partial, lse_partial, out=None, out_dtype=None, cu_seqlens=None, seqused=None,
                       return_lse=True):
    """Merges num_splits partial attentions over disjoint key sets.

    out_partial (num_splits, batch, seqlen, heads, dim) or packed (num_splits, total_q, heads, dim); lse_partial the
    same without dim (natural log; -inf for a split that saw no key). Returns (out, lse): out (batch, seqlen, heads,
    dim) or (total_q, heads, dim) in out_dtype (out_partial's by default; into out= when given), and lse (batch,
    seqlen, heads) or (total_q, heads) in float32 (float64 for float64 partials), or None with return_lse=False.
    Rows every split left at -inf give out 0 and lse -inf. cu_seqlens (packed) and seqused restrict the rows
    written: the others are left as they are in out= (zero in a new out) and -inf in lse.
    """
    if not isinstance(out_partial, Tensor) or out_partial.dim() not in (4, 5):
        raise ValueError("out_partial must be a (num_splits, batch, seqlen, heads, dim) or (num_splits, total_q, "
                         "heads, dim) tensor")
    if not isinstance(lse_partial, Tensor) or tuple(lse_partial.shape) != tuple(out_partial.shape[:-1]):
        raise ValueError(f"lse_partial must have shape {tuple(out_partial.shape[:-1])}, got "
                         f"{tuple(getattr(lse_partial, 'shape', ()))}")
    if lse_partial.device != out_partial.device:
        raise ValueError(f"lse_partial is on {lse_partial.device} but out_partial is on {out_partial.device}")
    if not (out_partial.dtype.is_floating_point and lse_partial.dtype.is_floating_point):
        raise ValueError("out_partial and lse_partial must be floating tensors")
    if out_partial.shape[0] < 1:
        raise ValueError("out_partial must hold at least one split")
    out_dtype = out_partial.dtype if out_dtype is None else out_dtype
    if out is not None and (not isinstance(out, Tensor) or tuple(out.shape) != tuple(out_partial.shape[1:])
                            or out.dtype != out_dtype or out.device != out_partial.device):
        raise ValueError(f"out must be a {out_dtype} tensor of shape {tuple(out_partial.shape[1:])} on "
                         f"{out_partial.device}")
    acc = torch.promote_types(out_partial.dtype, torch.float32)
    parts = lse_partial.to(acc)
    lse = torch.logsumexp(parts, dim=0)
    # Rows no split saw: subtract 0 instead of -inf, so their weights are exp(-inf) = 0 rather than NaN.
    weights = torch.exp(parts - torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)[None])[..., None]
    # A split with weight 0 adds nothing, whatever its partial holds (it may be unwritten).
    merged = torch.where(weights > 0, weights * out_partial.to(acc), torch.zeros((), dtype=acc,
                                                                                 device=out_partial.device)).sum(0)
    used = _used_rows(tuple(out_partial.shape[1:-2]), cu_seqlens, seqused, out_partial.device)
    if used is not None:
        merged = torch.where(used[..., None, None], merged, torch.zeros((), dtype=acc, device=merged.device)
                             if out is None else out.to(acc))
        lse = torch.where(used[..., None], lse, torch.full((), float("-inf"), dtype=acc, device=lse.device))
    if out is None:
        out = merged.to(out_dtype)
    else:
        out.copy_(merged)
    return out, (lse if return_lse else None)
