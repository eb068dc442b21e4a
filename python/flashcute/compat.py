"""FlashAttention-4's calling conventions on flashcute's entries, so code (and test suites) written against
flash_attn.cute.interface run unchanged:

- its tuning arguments (num_splits, pack_gqa, min_seqlen_k) are checked and taken as hints; the features flashcute
  lacks (qv, MLA's extra query term; gather_kv_indices; scheduler_metadata, FA4's own precomputed schedule) are
  taken as None only; return_lse=False returns lse without a gradient path, as FA4's backward then ignores it;
- flash_attn_varlen_func without cu_seqlens_q (or cu_seqlens_k): that side is a padded batch (batch, seqlen, heads,
  dim) whose seqused_q (seqused_k) counts each sequence's rows; flashcute runs it as packed rows of seqlen each,
  which is the same attention, and returns out and lse in the batch layout;
- flash_attn_varlen_func with page_table: k and v are a paged KV cache, as flash_attn_with_kvcache takes it;
- max_seqlen_q / max_seqlen_k as one-element integer tensors (read on the host once, outside graph capture).
"""
import numbers

import torch
from torch import Tensor

from . import ops


_NOT_SUPPORTED = {
    "qv": "FlashAttention-4's MLA query-value term",
    "gather_kv_indices": "FlashAttention-4's sparse K/V gather",
    "scheduler_metadata": "FlashAttention-4's precomputed schedule (flashcute schedules each call itself)",
}


def check_hints(num_splits, pack_gqa, min_seqlen_k=None, **absent):
    """FlashAttention-4's num_splits (0: chosen, 1: none, n: n chunks), pack_gqa (None, True, False) and min_seqlen_k
    (None or a non-negative integer): checked like every argument. absent: arguments of _NOT_SUPPORTED, only None."""
    ops.count(num_splits, "num_splits")
    if pack_gqa is not None and not isinstance(pack_gqa, bool):
        raise ValueError(f"pack_gqa must be None, True or False, got {pack_gqa!r}")
    if min_seqlen_k is not None and (isinstance(min_seqlen_k, bool) or
                                     not isinstance(min_seqlen_k, (numbers.Integral, Tensor))):
        raise ValueError(f"min_seqlen_k must be None or an integer, got {min_seqlen_k!r}")
    for name, value in absent.items():
        if value is not None:
            raise ValueError(f"{name} ({_NOT_SUPPORTED[name]}) is not supported by flashcute; pass {name}=None")


def with_lse_grad(result, return_lse):
    """return_lse=False: lse still comes back, detached (FlashAttention-4 then drops its gradient); True: as is."""
    if return_lse is True:
        return result
    if return_lse is not False:
        raise ValueError(f"return_lse must be a bool, got {return_lse!r}")
    out, lse = result
    return out, lse.detach()


def max_seqlen(value, name):
    """A max_seqlen argument as an int (or None): Python integers, or a one-element integer tensor read on the host."""
    if not isinstance(value, Tensor):
        return value
    if value.numel() != 1 or value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer or a one-element integer tensor, got {value.dtype} "
                         f"{tuple(value.shape)}")
    if value.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise ValueError(f"{name} as a CUDA tensor cannot be read under CUDA graph capture: pass a Python int")
    return int(value.item())


def as_packed(x, name, side):
    """A padded batch x (batch, seqlen, heads, dim) as packed rows (batch * seqlen, heads, dim) and the int32 offsets
    0, seqlen, 2 * seqlen, ... of its sequences (a view where x's batch and row strides allow, else a copy)."""
    if not isinstance(x, Tensor) or x.dim() != 4:
        raise ValueError(f"{name} must be a 4-D tensor (batch, seqlen, nheads, head_dim) when cu_seqlens_{side} is "
                         f"None, got {tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
    batch, seqlen = x.shape[:2]
    offsets = torch.arange(batch + 1, dtype=torch.int32, device=x.device) * seqlen
    return x.reshape(batch * seqlen, *x.shape[2:]), offsets


def batched_varlen(call, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out, lse):
    """flash_attn_varlen_func where cu_seqlens_q and/or cu_seqlens_k is None (see the module docstring). call(q, k,
    v, cu_q, cu_k, max_q, max_k) runs the packed call and returns (out, lse); caller buffers out= (batch, seqlen_q,
    heads, head_dim_v) and lse= (batch, heads, seqlen_q) receive the result in the batch layout."""
    q_batched = cu_seqlens_q is None
    if q_batched:
        padded_q = q
        q, cu_seqlens_q = as_packed(padded_q, "q", "q")
        batch_q, seqlen_q = padded_q.shape[:2]
    if cu_seqlens_k is None:
        if not isinstance(v, Tensor) or not isinstance(k, Tensor) or v.shape[:2] != k.shape[:2]:
            raise ValueError("k and v must share their (batch, seqlen) when cu_seqlens_k is None, got "
                             f"{tuple(getattr(k, 'shape', ()))} and {tuple(getattr(v, 'shape', ()))}")
        if max_seqlen_q is None and max_seqlen_k is None and q_batched:
            max_seqlen_q, max_seqlen_k = seqlen_q, k.shape[1]  # both padded: no offsets to read on the host
        k, cu_seqlens_k = as_packed(k, "k", "k")
        v, _ = as_packed(v, "v", "k")
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(cu, Tensor) or cu.dim() != 1:
            raise ValueError(f"{name} must be a 1-D int32 tensor of batch + 1 offsets, or None")
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(f"q and k must hold the same sequences: {cu_seqlens_q.numel() - 1} against "
                         f"{cu_seqlens_k.numel() - 1} (a padded side counts its batch)")
    if not q_batched:
        return call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out, lse)
    result_out, result_lse = call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, None, None)
    heads = result_lse.shape[0]
    result_out = result_out.reshape(batch_q, seqlen_q, *result_out.shape[1:])
    result_lse = result_lse.view(heads, batch_q, seqlen_q).permute(1, 0, 2)  # (batch, heads, seqlen_q)
    if out is None and lse is None:
        return result_out, result_lse
    for name, buf, value in (("out", out, result_out), ("lse", lse, result_lse)):
        if buf is not None:
            if not isinstance(buf, Tensor) or buf.shape != value.shape or buf.dtype != value.dtype:
                raise ValueError(f"{name} must be a {value.dtype} tensor of shape {tuple(value.shape)}, got "
                                 f"{getattr(buf, 'dtype', type(buf).__name__)} {tuple(getattr(buf, 'shape', ()))}")
            buf.copy_(value)
    return (result_out if out is None else out), (result_lse if lse is None else lse)
