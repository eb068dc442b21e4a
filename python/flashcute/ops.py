"""torch.library custom ops flashcute::fwd / flashcute::bwd over the C library (ctypes; no kernel logic here).

CUDA tensors go to flashcute_fwd / flashcute_bwd with their real strides; CPU tensors go through the float64 host
reference. Arguments the C library cannot see (dtypes of the pointer-only tensors, their shapes) are checked here.
"""
import ctypes
from typing import Optional

import torch
from torch import Tensor

from . import _capi

_CUDA_DTYPES = {torch.float16: _capi.FLOAT16, torch.bfloat16: _capi.BFLOAT16}


def window_side(side):
    """None or negative means unbounded (-1)."""
    return -1 if side is None or side < 0 else int(side)


def _lse_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_inputs(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, seqlen, nheads, head_dim), got shape {tuple(t.shape)}")
    for name, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}: q, k, v must share one device")
        if t.dtype != q.dtype:
            raise ValueError(f"{name} has dtype {t.dtype} but q has {q.dtype}: q, k, v must share one dtype")
    if q.device.type == "cuda":
        if q.dtype not in _CUDA_DTYPES:
            raise ValueError(f"q dtype {q.dtype} is not supported on CUDA (float16 or bfloat16)")
    elif q.device.type in ("cpu", "meta"):
        if not q.dtype.is_floating_point:
            raise ValueError(f"q dtype {q.dtype} is not a floating dtype")
    else:
        raise ValueError(f"q is on {q.device}: only cuda and cpu tensors are supported")
    batch, _, nheads, head_dim = q.shape
    _, seqlen_k, nheads_kv, head_dim_k = k.shape
    for name, t in (("k", k), ("v", v)):
        if t.shape[0] != batch:
            raise ValueError(f"{name} batch {t.shape[0]} != q batch {batch}")
    if v.shape[1] != seqlen_k:
        raise ValueError(f"v seqlen {v.shape[1]} != k seqlen {seqlen_k}")
    if v.shape[2] != nheads_kv:
        raise ValueError(f"v nheads {v.shape[2]} != k nheads (nheads_kv) {nheads_kv}")
    if head_dim_k != head_dim:
        raise ValueError(f"k head_dim {head_dim_k} != q head_dim {head_dim}")
    if nheads_kv == 0 or nheads % nheads_kv != 0:
        raise ValueError(f"q nheads {nheads} is not divisible by k nheads (nheads_kv) {nheads_kv}")


def _check_bwd(dout, dlse, q, k, v, out, lse):
    _check_inputs(q, k, v)
    batch, seqlen_q, nheads, _ = q.shape
    out_shape = (batch, seqlen_q, nheads, v.shape[3])
    lse_shape = (batch, nheads, seqlen_q)
    on_cuda = q.device.type == "cuda"
    checks = [("out", out, out_shape, q.dtype), ("dout", dout, out_shape, q.dtype), ("lse", lse, lse_shape, torch.float32)]
    if dlse is not None:
        checks.append(("dlse", dlse, lse_shape, torch.float32))
    for name, t, shape, dtype in checks:
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
        if on_cuda and t.dtype != dtype:  # pointer-only in the C API: its dtype is implied
            raise ValueError(f"{name} must have dtype {dtype} on CUDA, got {t.dtype}")


def _last_dim_contiguous(t):
    return t if t.stride(-1) == 1 else t.contiguous()


def _ptr(t):
    return None if t is None else t.data_ptr()


def _set_strides(p, prefix, t):
    setattr(p, f"{prefix}_batch_stride", t.stride(0))
    setattr(p, f"{prefix}_row_stride", t.stride(1))
    setattr(p, f"{prefix}_head_stride", t.stride(2))


def _fwd_params(q, k, v, out, lse, dtype, scale, causal, window_left, window_right, softcap):
    p = _capi.fwd_params()
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
        setattr(p, name, _ptr(t))
        _set_strides(p, name, t)
    p.lse = _ptr(lse)
    p.lse_batch_stride, p.lse_head_stride = lse.stride(0), lse.stride(1)
    p.batch, p.seqlen_q, p.nheads, p.head_dim = q.shape
    p.seqlen_k, p.nheads_kv, p.head_dim_v = k.shape[1], k.shape[2], v.shape[3]
    p.dtype = dtype
    p.softmax_scale, p.softcap, p.causal = scale, softcap, int(causal)
    p.window_left, p.window_right = window_side(window_left), window_side(window_right)
    return p


def _bwd_params(fwd, dout, dlse, dq, dk, dv, deterministic):
    p = _capi.bwd_params()
    p.fwd = fwd
    p.dout, p.dlse = _ptr(dout), _ptr(dlse)
    _set_strides(p, "dout", dout)
    for name, t in (("dq", dq), ("dk", dk), ("dv", dv)):
        setattr(p, name, _ptr(t))
        _set_strides(p, name, t)
    p.deterministic = int(deterministic)
    return p


def _launch_cuda(run, workspace_size, p, device):
    with torch.cuda.device(device):
        nbytes = ctypes.c_size_t(0)
        _capi.check(workspace_size(ctypes.byref(p), ctypes.byref(nbytes)))
        workspace = None  # kept alive until the launch is queued; the caching allocator orders reuse on the stream
        if nbytes.value:
            workspace = torch.empty(nbytes.value, dtype=torch.uint8, device=device)
            p.workspace, p.workspace_size = workspace.data_ptr(), nbytes.value
        stream = torch.cuda.current_stream(device).cuda_stream
        _capi.check(run(ctypes.byref(p), ctypes.c_void_p(stream)))


def _f64(t):
    return None if t is None else t.to(torch.float64).contiguous()


_FWD_SCHEMA = ("(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal, int window_left, int window_right, "
               "float softcap, bool deterministic=False) -> (Tensor out, Tensor lse)")
_BWD_SCHEMA = ("(Tensor dout, Tensor? dlse, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, float softmax_scale, "
               "bool causal, int window_left, int window_right, float softcap, bool deterministic) "
               "-> (Tensor dq, Tensor dk, Tensor dv)")


@torch.library.custom_op("flashcute::fwd", mutates_args=(), schema=_FWD_SCHEMA)
def fwd(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, causal: bool, window_left: int, window_right: int,
        softcap: float, deterministic: bool = False) -> tuple[Tensor, Tensor]:
    # deterministic only matters to the backward; it rides along so that setup_context can keep it.
    _check_inputs(q, k, v)
    args = (softmax_scale, causal, window_left, window_right, softcap)
    batch, seqlen_q, nheads, _ = q.shape
    if q.device.type == "cuda":
        q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
        out = q.new_empty((batch, seqlen_q, nheads, v.shape[3]))
        lse = q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)
        lib = _capi.lib()
        p = _fwd_params(q, k, v, out, lse, _CUDA_DTYPES[q.dtype], *args)
        _launch_cuda(lib.flashcute_fwd, lib.flashcute_fwd_workspace_size, p, q.device)
        return out, lse
    q64, k64, v64 = (_f64(t) for t in (q, k, v))
    out = q64.new_empty((batch, seqlen_q, nheads, v.shape[3]))
    lse = q64.new_empty((batch, nheads, seqlen_q))
    _capi.check(_capi.lib().flashcute_reference_fwd(ctypes.byref(_fwd_params(q64, k64, v64, out, lse,
                                                                            _capi.FLOAT64, *args))))
    return out.to(q.dtype), lse.to(_lse_dtype(q.dtype))


@fwd.register_fake
def _(q, k, v, softmax_scale, causal, window_left, window_right, softcap, deterministic=False):
    _check_inputs(q, k, v)
    batch, seqlen_q, nheads, _ = q.shape
    out = q.new_empty((batch, seqlen_q, nheads, v.shape[3]))
    return out, q.new_empty((batch, nheads, seqlen_q), dtype=_lse_dtype(q.dtype))


@torch.library.custom_op("flashcute::bwd", mutates_args=(), schema=_BWD_SCHEMA)
def bwd(dout: Tensor, dlse: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
        softmax_scale: float, causal: bool, window_left: int, window_right: int, softcap: float,
        deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    _check_bwd(dout, dlse, q, k, v, out, lse)
    args = (softmax_scale, causal, window_left, window_right, softcap)
    if q.device.type == "cuda":
        q, k, v, out, dout = (_last_dim_contiguous(t) for t in (q, k, v, out, dout))
        lse = lse.contiguous()  # dlse has no strides of its own: it shares lse's (contiguous) layout
        dlse = None if dlse is None else dlse.contiguous()
        dq, dk, dv = (torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
        lib = _capi.lib()
        p = _bwd_params(_fwd_params(q, k, v, out, lse, _CUDA_DTYPES[q.dtype], *args), dout, dlse, dq, dk, dv,
                        deterministic)
        _launch_cuda(lib.flashcute_bwd, lib.flashcute_bwd_workspace_size, p, q.device)
        return dq, dk, dv
    q64, k64, v64, out64, lse64, dout64, dlse64 = (_f64(t) for t in (q, k, v, out, lse, dout, dlse))
    dq, dk, dv = (torch.empty_like(t) for t in (q64, k64, v64))
    fwd_p = _fwd_params(q64, k64, v64, out64, lse64, _capi.FLOAT64, *args)
    p = _bwd_params(fwd_p, dout64, dlse64, dq, dk, dv, deterministic)
    _capi.check(_capi.lib().flashcute_reference_bwd(ctypes.byref(p)))
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


@bwd.register_fake
def _(dout, dlse, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap, deterministic):
    _check_bwd(dout, dlse, q, k, v, out, lse)
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


def _register_autograd(forward_op, backward_op, num_seq_tensors):
    """Autograd for a forward op whose inputs are q, k, v, then num_seq_tensors sequence tensors (varlen offsets,
    passed through), then scalars ending with deterministic; backward_op takes (dout, dlse, q, k, v, out, lse,
    *sequence tensors, *scalars)."""

    def setup_context(ctx, inputs, output):
        n = 3 + num_seq_tensors
        ctx.save_for_backward(*inputs[:n], *output)
        ctx.args = inputs[n:]
        ctx.set_materialize_grads(False)  # an unused out or lse arrives as None (dlse None -> NULL in C)

    def backward(ctx, dout, dlse):
        q, k, v, *seq, out, lse = ctx.saved_tensors
        no_grads = (None,) * (num_seq_tensors + len(ctx.args))
        if dout is None and dlse is None:
            return (None,) * 3 + no_grads
        if dout is None:
            dout = torch.zeros_like(out)
        *args, deterministic = ctx.args
        deterministic = deterministic or torch.are_deterministic_algorithms_enabled()
        dq, dk, dv = backward_op(dout, dlse, q, k, v, out, lse, *seq, *args, deterministic)
        return (dq, dk, dv) + no_grads

    forward_op.register_autograd(backward, setup_context=setup_context)


_register_autograd(fwd, bwd, 0)


# Variable length: sequences packed along the rows. q (total_q, H, D), k/v (total_k, Hkv, D/Dv), int32
# cu_seqlens_q/k (batch + 1 offsets), optional int32 seqused_k (batch); out (total_q, H, Dv), lse (H, total_q).
# The C library takes these as batch = number of sequences, seqlen = the longest one, with the batch strides
# ignored; the packed tensors are passed as (1, total, H, D) views.

def _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D (total_tokens, nheads, head_dim) for varlen, got shape "
                             f"{tuple(t.shape)}")
    _check_inputs(q[None], k[None], v[None])
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k), ("seqused_k", seqused_k)):
        if t is None:
            continue
        if t.dtype != torch.int32 or t.dim() != 1:
            raise ValueError(f"{name} must be a 1-D int32 tensor, got {t.dtype} with shape {tuple(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    if cu_seqlens_q.numel() < 2 or cu_seqlens_k.numel() != cu_seqlens_q.numel():
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must both hold batch + 1 >= 2 offsets, got "
                         f"{cu_seqlens_q.numel()} and {cu_seqlens_k.numel()}")
    if seqused_k is not None and seqused_k.numel() != cu_seqlens_q.numel() - 1:
        raise ValueError(f"seqused_k must hold batch = {cu_seqlens_q.numel() - 1} entries, got {seqused_k.numel()}")


def _varlen_lengths(q, k, cu_seqlens_q, cu_seqlens_k, seqused_k):
    """The longest sequences, checked against the packed tensors (one small host copy): the kernels size their
    grids and workspaces from them, so offsets that disagree with the tensors must never reach the library."""
    if q.device.type == "meta":
        return q.shape[0], k.shape[0]
    cu_q, cu_k = cu_seqlens_q.cpu().long(), cu_seqlens_k.cpu().long()
    for name, cu, total in (("cu_seqlens_q", cu_q, q.shape[0]), ("cu_seqlens_k", cu_k, k.shape[0])):
        if cu[0] != 0 or bool((cu[1:] < cu[:-1]).any()) or cu[-1] > total:
            raise ValueError(f"{name} must start at 0, never decrease, and end at most at the {total} packed rows, "
                             f"got {cu.tolist()}")
    len_k = cu_k[1:] - cu_k[:-1]
    if seqused_k is not None:
        used = seqused_k.cpu().long()
        if bool((used < 0).any()) or bool((used > len_k).any()):
            raise ValueError(f"seqused_k must lie in [0, the sequence's length], got {used.tolist()}")
    return max(int((cu_q[1:] - cu_q[:-1]).max()), 1), max(int(len_k.max()), 1)


def _varlen_fwd_params(q, k, v, out, lse, dtype, args, cu_seqlens_q, cu_seqlens_k, seqused_k, max_q, max_k):
    p = _fwd_params(q[None], k[None], v[None], out[None], lse[None], dtype, *args)
    p.batch, p.seqlen_q, p.seqlen_k = cu_seqlens_q.numel() - 1, max_q, max_k
    p.cu_seqlens_q, p.cu_seqlens_k, p.seqused_k = _ptr(cu_seqlens_q), _ptr(cu_seqlens_k), _ptr(seqused_k)
    return p


_VARLEN_FWD_SCHEMA = ("(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, Tensor? seqused_k, "
                      "float softmax_scale, bool causal, int window_left, int window_right, float softcap, "
                      "bool deterministic=False) -> (Tensor out, Tensor lse)")
_VARLEN_BWD_SCHEMA = ("(Tensor dout, Tensor? dlse, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
                      "Tensor cu_seqlens_q, Tensor cu_seqlens_k, Tensor? seqused_k, float softmax_scale, bool causal, "
                      "int window_left, int window_right, float softcap, bool deterministic) "
                      "-> (Tensor dq, Tensor dk, Tensor dv)")


@torch.library.custom_op("flashcute::varlen_fwd", mutates_args=(), schema=_VARLEN_FWD_SCHEMA)
def varlen_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
               seqused_k: Optional[Tensor], softmax_scale: float, causal: bool, window_left: int, window_right: int,
               softcap: float, deterministic: bool = False) -> tuple[Tensor, Tensor]:
    _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k)
    max_q, max_k = _varlen_lengths(q, k, cu_seqlens_q, cu_seqlens_k, seqused_k)
    args = (softmax_scale, causal, window_left, window_right, softcap)
    seqs = (cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(), None if seqused_k is None else seqused_k.contiguous())
    total_q, nheads, _ = q.shape
    if q.device.type == "cuda":
        q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
        out = q.new_empty((total_q, nheads, v.shape[2]))
        lse = q.new_empty((nheads, total_q), dtype=torch.float32)
        lib = _capi.lib()
        p = _varlen_fwd_params(q, k, v, out, lse, _CUDA_DTYPES[q.dtype], args, *seqs, max_q, max_k)
        _launch_cuda(lib.flashcute_fwd, lib.flashcute_fwd_workspace_size, p, q.device)
        return out, lse
    q64, k64, v64 = (_f64(t) for t in (q, k, v))
    out = q64.new_empty((total_q, nheads, v.shape[2]))
    lse = q64.new_empty((nheads, total_q))
    p = _varlen_fwd_params(q64, k64, v64, out, lse, _capi.FLOAT64, args, *seqs, max_q, max_k)
    _capi.check(_capi.lib().flashcute_reference_fwd(ctypes.byref(p)))
    return out.to(q.dtype), lse.to(_lse_dtype(q.dtype))


@varlen_fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, softmax_scale, causal, window_left, window_right, softcap,
      deterministic=False):
    _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k)
    total_q, nheads, _ = q.shape
    return q.new_empty((total_q, nheads, v.shape[2])), q.new_empty((nheads, total_q), dtype=_lse_dtype(q.dtype))


@torch.library.custom_op("flashcute::varlen_bwd", mutates_args=(), schema=_VARLEN_BWD_SCHEMA)
def varlen_bwd(dout: Tensor, dlse: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
               cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, seqused_k: Optional[Tensor], softmax_scale: float,
               causal: bool, window_left: int, window_right: int, softcap: float,
               deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k)
    total_q, nheads, _ = q.shape
    for name, t, shape in (("out", out, (total_q, nheads, v.shape[2])), ("dout", dout, (total_q, nheads, v.shape[2])),
                           ("lse", lse, (nheads, total_q)), ("dlse", dlse, (nheads, total_q))):
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    max_q, max_k = _varlen_lengths(q, k, cu_seqlens_q, cu_seqlens_k, seqused_k)
    args = (softmax_scale, causal, window_left, window_right, softcap)
    seqs = (cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(), None if seqused_k is None else seqused_k.contiguous())
    if q.device.type == "cuda":
        q, k, v, out, dout = (_last_dim_contiguous(t) for t in (q, k, v, out, dout))
        lse = lse.to(torch.float32).contiguous()
        dlse = None if dlse is None else dlse.to(torch.float32).contiguous()
        dq, dk, dv = (torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
        lib = _capi.lib()
        fwd_p = _varlen_fwd_params(q, k, v, out, lse, _CUDA_DTYPES[q.dtype], args, *seqs, max_q, max_k)
        p = _bwd_params(fwd_p, dout[None], dlse, dq[None], dk[None], dv[None], deterministic)
        _launch_cuda(lib.flashcute_bwd, lib.flashcute_bwd_workspace_size, p, q.device)
        return dq, dk, dv
    q64, k64, v64, out64, lse64, dout64, dlse64 = (_f64(t) for t in (q, k, v, out, lse, dout, dlse))
    dq, dk, dv = (torch.empty_like(t) for t in (q64, k64, v64))
    fwd_p = _varlen_fwd_params(q64, k64, v64, out64, lse64, _capi.FLOAT64, args, *seqs, max_q, max_k)
    p = _bwd_params(fwd_p, dout64[None], dlse64, dq[None], dk[None], dv[None], deterministic)
    _capi.check(_capi.lib().flashcute_reference_bwd(ctypes.byref(p)))
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


@varlen_bwd.register_fake
def _(dout, dlse, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, softmax_scale, causal, window_left,
      window_right, softcap, deterministic):
    _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k)
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


_register_autograd(varlen_fwd, varlen_bwd, 3)
