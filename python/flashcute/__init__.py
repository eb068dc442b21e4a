"""flashcute: exact attention (FlashAttention) forward and backward, a thin layer over the C library."""

from ._capi import FlashCuteError, build_info, version

try:
    import torch as _torch
except ModuleNotFoundError:  # the ctypes layer and `python -m flashcute.info` work without torch
    _torch = None
else:  # (as _torch: the name flashcute.torch belongs to the PyTorch provider submodule)
    from . import compat as _compat, ops as _ops
    from .combine import flash_attn_combine
    from .kvcache import flash_attn_with_kvcache
if _torch is None:
    def flash_attn_with_kvcache(*args, **kwargs):
        raise ModuleNotFoundError("flash_attn_with_kvcache needs torch")

    def flash_attn_combine(*args, **kwargs):
        raise ModuleNotFoundError("flash_attn_combine needs torch")

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache", "flash_attn_combine",
           "flash_attn_backward", "version", "build_info", "FlashCuteError"]


def _arguments(q, softmax_scale, causal, window_size, softcap, deterministic):
    """The scalar arguments checked as the C library will take them (named errors, nothing silently coerced)."""
    scale = _ops.default_scale(q) if softmax_scale is None else _ops.real(softmax_scale, "softmax_scale")
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise ValueError(f"window_size must be a (left, right) pair, got {window_size!r}") from None
    return (scale, _ops.flag(causal, "causal"), _ops.window_side(left), _ops.window_side(right),
            _ops.real(softcap, "softcap"), _ops.flag(deterministic, "deterministic"))


def _no_autograd(name, tensors):
    """Caller buffers (out=, lse=) are written in place, which autograd cannot follow."""
    if _torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        raise ValueError(f"{name} writes into caller buffers, which autograd cannot track: call it under "
                         "torch.no_grad() or with inputs that do not require grad")


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_size=(None, None), softcap=0.0,
                    deterministic=False, out=None, lse=None, learnable_sink=None, *, num_splits=1, pack_gqa=None,
                    qv=None, gather_kv_indices=None, return_lse=True):
    """Attention over q (B, Sq, H, D), k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv); returns (out, lse).

    out is (B, Sq, H, Dv) in q's dtype; lse is (B, H, Sq) float32 (float64 for float64 inputs), natural log.
    window_size = (left, right): query i sees keys i + (Sk - Sq) - left ... i + (Sk - Sq) + right; None means
    unbounded, and negative sides are offsets too (FlashAttention-4's convention: (None, -5) shows keys at least 5
    before the diagonal); causal sets right = 0.
    Differentiable through both out and lse. Empty inputs (B = 0, Sq = 0) give empty outputs; Sk = 0 gives
    rows that see no key (out 0, lse -inf).

    out= and lse= (either or both) are buffers of those shapes and dtypes to write into, returned as the result;
    any strides. Without autograd only (flash_attn_backward takes the gradient buffers).

    learnable_sink (H,): a logit per query head that joins every row's softmax denominator (GPT-OSS's attention
    sinks); lse includes it, a row that sees no key gives out 0 and lse = sink, and it gets a gradient. CPU tensors
    run the float64 reference; the GPU kernels of both families take it in float32.

    FlashAttention-4's keywords (flashcute.compat): num_splits and pack_gqa are checked and left to flashcute's
    dispatch here (the same attention; flash_attn_with_kvcache splits), qv and gather_kv_indices must be None, and
    return_lse=False returns lse detached from autograd (FA4's backward then ignores its gradient).
    """
    if _torch is None:
        raise ModuleNotFoundError("flash_attn_func needs torch")
    _compat.check_hints(num_splits, pack_gqa, qv=qv, gather_kv_indices=gather_kv_indices)
    args = _arguments(q, softmax_scale, causal, window_size, softcap, deterministic)
    if out is None and lse is None:
        return _compat.with_lse_grad(_ops.call(_ops.fwd, q, k, v, *args, learnable_sink), return_lse)
    _no_autograd("flash_attn_func(out=, lse=)", (q, k, v))
    _ops._check_inputs(q, k, v)
    if out is None:
        out = q.new_empty((*q.shape[:3], v.shape[3]))
    if lse is None:
        lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=_ops._lse_dtype(q.dtype))
    _ops.fwd_into(q, k, v, out, lse, *args[:-1], learnable_sink)
    return out, lse


def flash_attn_backward(dout, q, k, v, out, lse, dlse=None, softmax_scale=None, causal=False,
                        window_size=(None, None), softcap=0.0, deterministic=False, dq=None, dk=None, dv=None,
                        learnable_sink=None, dsink=None):
    """The gradients of flash_attn_func's (out, lse) with respect to q, k, v, given dout (and dlse, None for
    zero), without autograd: returns (dq, dk, dv), written into dq=, dk=, dv= where given (any strides; shapes and
    dtypes of q, k, v). The other arguments must be those of the forward call that gave out and lse.
    With the forward's learnable_sink it returns (dq, dk, dv, dsink), the sink's gradient written into dsink= where
    given (the sink's shape and dtype).
    """
    if _torch is None:
        raise ModuleNotFoundError("flash_attn_backward needs torch")
    args = _arguments(q, softmax_scale, causal, window_size, softcap, deterministic)
    _ops._check_bwd(dout, dlse, q, k, v, out, lse)
    _ops._check_sink(q, learnable_sink, q.shape[2])
    dq, dk, dv = (_torch.empty_like(t) if g is None else g for g, t in ((dq, q), (dk, k), (dv, v)))
    if learnable_sink is not None and dsink is None:
        dsink = _torch.empty_like(learnable_sink)
    deterministic = args[-1] or _torch.are_deterministic_algorithms_enabled()
    with _torch.no_grad():
        _ops.bwd_into(dout, dlse, q, k, v, out, lse, dq, dk, dv, *args[:-1], deterministic, learnable_sink, dsink)
    return (dq, dk, dv) if learnable_sink is None else (dq, dk, dv, dsink)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, softmax_scale=None, causal=False,
                           window_size=(None, None), softcap=0.0, deterministic=False, seqused_k=None,
                           max_seqlen_q=None, max_seqlen_k=None, seqused_q=None, out=None, lse=None,
                           learnable_sink=None, *, page_table=None, num_splits=0, pack_gqa=None, min_seqlen_k=None,
                           qv=None, gather_kv_indices=None, scheduler_metadata=None, return_lse=True):
    """Attention over sequences packed along the rows: q (total_q, H, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv).

    cu_seqlens_q / cu_seqlens_k are int32 (batch + 1) offsets of each sequence's first row (sequence b is rows
    cu[b] .. cu[b + 1]); seqused_k (int32, batch), if given, limits sequence b to its first seqused_k[b] keys, and
    seqused_q to its first seqused_q[b] queries (the causal diagonal aligns to them; the rest are padding).
    Returns out (total_q, H, Dv) and lse (H, total_q), differentiable through both; rows past cu_seqlens_q[-1] or seqused_q
    (padding) get out 0, lse -inf and zero gradients. Masks and the other arguments are those of flash_attn_func,
    applied per sequence.

    max_seqlen_q / max_seqlen_k (the longest sequences) are what CUDA graphs need: given, the call reads nothing
    on the host and the kernels clamp each sequence to them and to the packed rows (offsets that disagree give
    clamped sequences, never an out-of-bounds access). Left out, the offsets are copied to the host (one small
    copy per call, not allowed under graph capture), checked against the tensors (ValueError), and their maxima
    taken.

    out= and lse= are buffers to write into, as for flash_attn_func (without autograd); learnable_sink as there.

    FlashAttention-4's forms (flashcute.compat): cu_seqlens_q=None takes q as a padded batch (B, Sq, H, D) whose
    seqused_q counts each sequence's queries, and returns out (B, Sq, H, Dv) and lse (B, H, Sq); cu_seqlens_k=None
    likewise for k and v with seqused_k. page_table (batch, max_pages) int32 takes k and v as a paged KV cache
    (num_pages, page_size, Hkv, D) with seqused_k its lengths: flash_attn_with_kvcache's call, forward only, where
    num_splits (0: chosen) splits the keys; elsewhere num_splits, pack_gqa and min_seqlen_k are hints. qv,
    gather_kv_indices and scheduler_metadata must be None; return_lse as flash_attn_func's; max_seqlen_q /
    max_seqlen_k may be one-element integer tensors.
    """
    if _torch is None:
        raise ModuleNotFoundError("flash_attn_varlen_func needs torch")
    _compat.check_hints(num_splits, pack_gqa, min_seqlen_k, qv=qv, gather_kv_indices=gather_kv_indices,
                        scheduler_metadata=scheduler_metadata)
    max_seqlen_q = _compat.max_seqlen(max_seqlen_q, "max_seqlen_q")
    max_seqlen_k = _compat.max_seqlen(max_seqlen_k, "max_seqlen_k")
    if page_table is not None:
        if cu_seqlens_k is not None or seqused_q is not None or out is not None or lse is not None:
            raise ValueError("with page_table, k and v are the cache's pages and seqused_k its lengths: "
                             "cu_seqlens_k, seqused_q, out= and lse= are not taken")
        if cu_seqlens_q is None and max_seqlen_q is not None and isinstance(q, _torch.Tensor) and q.dim() == 4 \
                and max_seqlen_q != q.shape[1]:
            raise ValueError(f"max_seqlen_q = {max_seqlen_q} must be q's seqlen {q.shape[1]} without cu_seqlens_q")
        result = flash_attn_with_kvcache(q, k, v, cache_seqlens=seqused_k, page_table=page_table,
                                         cu_seqlens_q=cu_seqlens_q, softmax_scale=softmax_scale, causal=causal,
                                         window_size=window_size, softcap=softcap, num_splits=num_splits,
                                         learnable_sink=learnable_sink,
                                         max_seqlen_q=None if cu_seqlens_q is None else max_seqlen_q)
        return _compat.with_lse_grad(result, return_lse)
    if (max_seqlen_q is None) != (max_seqlen_k is None):
        raise ValueError("max_seqlen_q and max_seqlen_k must be given together")
    scale, causal, left, right, softcap, deterministic = _arguments(q, softmax_scale, causal, window_size, softcap,
                                                                    deterministic)
    if out is not None or lse is not None:
        _no_autograd("flash_attn_varlen_func(out=, lse=)", (q, k, v))

    def packed(q, k, v, cu_q, cu_k, max_q, max_k, out, lse):
        maxima = [-1 if value is None else _ops.count(value, name)
                  for name, value in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k))]
        seqs = (cu_q, cu_k, seqused_k, seqused_q)
        if out is None and lse is None:
            return _ops.call(_ops.varlen_fwd, q, k, v, *seqs, *maxima, scale, causal, left, right, softcap,
                             deterministic, learnable_sink)
        _ops._check_varlen(q, k, v, *seqs, *maxima)
        if out is None:
            out = q.new_empty((*q.shape[:2], v.shape[2]))
        if lse is None:
            lse = q.new_empty((q.shape[1], q.shape[0]), dtype=_ops._lse_dtype(q.dtype))
        _ops.varlen_fwd_into(q, k, v, out, lse, *seqs, *maxima, scale, causal, left, right, softcap,
                             learnable_sink)
        return out, lse

    if cu_seqlens_q is None or cu_seqlens_k is None:
        result = _compat.batched_varlen(packed, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out,
                                        lse)
    else:
        result = packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out, lse)
    return result if out is not None or lse is not None else _compat.with_lse_grad(result, return_lse)
