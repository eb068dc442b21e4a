"""flashcute: exact attention (FlashAttention) forward and backward, a thin layer over the C library."""
from ._capi import FlashCuteError, build_info, version

try:
    import torch
except ModuleNotFoundError:  # the ctypes layer and `python -m flashcute.info` work without torch
    torch = None
else:
    from . import ops as _ops

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "version", "build_info", "FlashCuteError"]


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_size=(None, None), softcap=0.0,
                    deterministic=False):
    """Attention over q (B, Sq, H, D), k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv); returns (out, lse).

    out is (B, Sq, H, Dv) in q's dtype; lse is (B, H, Sq) float32 (float64 for float64 inputs), natural log.
    window_size = (left, right), None or negative meaning unbounded; causal sets right = 0.
    Differentiable through both out and lse.
    """
    if torch is None:
        raise ModuleNotFoundError("flash_attn_func needs torch")
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    left, right = window_size
    return _ops.fwd(q, k, v, float(softmax_scale), bool(causal), _ops.window_side(left), _ops.window_side(right),
                    float(softcap), bool(deterministic))


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale=None, causal=False,
                           window_size=(None, None), softcap=0.0, deterministic=False, seqused_k=None):
    """Attention over sequences packed along the rows: q (total_q, H, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv).

    cu_seqlens_q / cu_seqlens_k are int32 (batch + 1) offsets of each sequence's first row (sequence b is rows
    cu[b] .. cu[b + 1]); seqused_k (int32, batch), if given, limits sequence b to its first seqused_k[b] keys.
    Returns out (total_q, H, Dv) and lse (H, total_q), differentiable through both. Masks and the other
    arguments are those of flash_attn_func, applied per sequence. The offsets are checked against the tensors on
    the host (one small copy per call), since the kernels size their grids and workspaces from them.
    """
    if torch is None:
        raise ModuleNotFoundError("flash_attn_varlen_func needs torch")
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    left, right = window_size
    return _ops.varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, float(softmax_scale), bool(causal),
                           _ops.window_side(left), _ops.window_side(right), float(softcap), bool(deterministic))

