"""torch.library custom ops flashcute::fwd / flashcute::bwd over the C library (ctypes; no kernel logic here).

CUDA tensors go to flashcute_fwd / flashcute_bwd with their real strides; CPU tensors go through the float64 host
reference. Arguments the C library cannot see (dtypes of the pointer-only tensors, their shapes) are checked here.
"""
import ctypes
import math
import numbers
from typing import Optional

import torch
from torch import Tensor

from . import _capi, decode

_CUDA_DTYPES = {torch.float16: _capi.FLOAT16, torch.bfloat16: _capi.BFLOAT16}


_INT32_MAX = 2**31 - 1
_GRID_MAX = 65535  # CUDA's gridDim.y / gridDim.z: heads and batch on the GPU
_F32_MAX = 3.4028234663852886e38  # the largest float32
_F32_TINY = 2.0 ** -150  # half the smallest float32 subnormal: this and anything smaller round to 0


WINDOW_UNBOUNDED = _capi.WINDOW_UNBOUNDED

# The non-mutating ops' Python implementations (_custom_op), and the forward ops' autograd around them
# (_register_autograd), for call().
_DIRECT = {}
_WITH_AUTOGRAD = {}


def _custom_op(name, schema):
    """torch.library.custom_op for an op that mutates nothing, keeping its Python implementation for call()."""
    def make(fn):
        op = torch.library.custom_op(name, mutates_args=(), schema=schema)(fn)
        _DIRECT[op] = fn
        return op
    return make


def _plain_eager(args):
    """None where an op must be dispatched; else whether autograd must record the call (False: calling the op's
    implementation directly is the same computation). Direct calls need eager mode (nothing tracing or compiling,
    no dispatch or function mode, no functorch transform) and every tensor argument a plain CUDA tensor."""
    if torch.compiler.is_compiling():  # first: Dynamo cannot trace the probes below
        return None
    c = torch._C
    probes = (getattr(c, "_len_torch_dispatch_stack", None), getattr(c, "_is_torch_function_mode_enabled", None))
    if None in probes or probes[0]() or probes[1]():
        return None
    functorch = getattr(getattr(c, "_functorch", None), "peek_interpreter_stack", None)
    if functorch is None or functorch() is not None:
        return None
    record = False
    for a in args:
        if isinstance(a, Tensor):
            if type(a) is not Tensor or a.device.type != "cuda":
                return None
            record = record or a.requires_grad
    return record and torch.is_grad_enabled()


def call(op, *args):
    """op(*args): where nothing but the computation would see the difference (_plain_eager), its implementation is
    called directly, inside a torch.autograd.Function where autograd records the call (the op's own autograd, same
    saved tensors and backward), without the dispatcher's layers and torch.library's autograd wrapper. On the H100
    machine of bench/RESULTS.md (2026-12-06 fourth session, runs 6-8) that saved about 20 us of host time per call
    without autograd, and more with it (the wrapper refills the schema's defaults, quadratic in its arguments)."""
    record = _plain_eager(args)
    if record is None or (record and op not in _WITH_AUTOGRAD):
        return op(*args)
    return _WITH_AUTOGRAD[op].apply(*args) if record else _DIRECT[op](*args)


def window_side(side, name="window_size"):
    """None means unbounded; an integer is an offset from the diagonal, negative ones too (FlashAttention-4's
    convention: right = -5 shows keys at least 5 before the diagonal). Anything else is refused (2.7 would silently
    truncate)."""
    if side is None or side == WINDOW_UNBOUNDED:
        return WINDOW_UNBOUNDED
    if isinstance(side, bool) or not isinstance(side, numbers.Integral):
        raise ValueError(f"{name} entries must be integers or None, got {side!r}")
    if not -(2**63) < side < 2**63:
        raise ValueError(f"{name} entries must fit in int64, got {side}")
    return int(side)


def count(value, name):
    """A non-negative integer argument (bools refused: True is not a count)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def flag(value, name):
    """A bool argument: True/False (or 0/1); strings such as "no" are refused instead of being truthy."""
    if isinstance(value, (bool, numbers.Integral)) and value in (0, 1):
        return bool(value)
    if type(value).__name__ == "bool_":  # numpy.bool_
        return bool(value)
    raise ValueError(f"{name} must be a bool, got {value!r}")


def real(value, name):
    """A float argument as the C library will see it (float32): non-finite values, and values that overflow or
    vanish in float32 (softcap 1e-50 would silently turn softcap off), are refused."""
    try:
        if isinstance(value, (bool, str, bytes)):
            raise TypeError
        value = float(value)  # Python and NumPy reals, 0-d tensors
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {value!r}") from None
    magnitude = abs(value)
    if not math.isfinite(magnitude) or magnitude > _F32_MAX or 0 < magnitude <= _F32_TINY:
        raise ValueError(f"{name} = {value!r} is not a finite float32 number")
    return value


def default_scale(q):
    """1/sqrt(head_dim) of a q checked to be a tensor with a positive head dim."""
    if not isinstance(q, Tensor) or q.dim() == 0:
        raise ValueError(f"q must be a tensor with a head_dim dimension, got {type(q).__name__}"
                         f"{'' if not isinstance(q, Tensor) else ' of rank 0'}")
    if q.shape[-1] < 1:
        raise ValueError(f"head_dim must be >= 1, got {q.shape[-1]}")
    return q.shape[-1] ** -0.5


def _lse_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_sizes(device, batch, seqlen_q, seqlen_k, nheads, nheads_kv, head_dim, head_dim_v):
    """The C library's size rules, checked before any copy or allocation, and by the fake implementations too, so
    that torch.compile refuses what the real op refuses."""
    for name, value in (("batch", batch), ("seqlen_q", seqlen_q), ("seqlen_k", seqlen_k)):
        if value > _INT32_MAX:
            raise ValueError(f"{name} must fit in int32, got {value}")
    if seqlen_q + seqlen_k >= 2**30:
        raise ValueError(f"seqlen_q + seqlen_k must be below 2^30, got {seqlen_q + seqlen_k}")
    for name, value in (("nheads", nheads), ("nheads_kv", nheads_kv), ("head_dim", head_dim),
                        ("head_dim_v", head_dim_v)):
        if value < 1 or value > _INT32_MAX:
            raise ValueError(f"{name} must be in [1, 2^31), got {value}")
    if nheads % nheads_kv != 0:
        raise ValueError(f"q nheads {nheads} is not divisible by k nheads (nheads_kv) {nheads_kv}")
    if device.type == "cuda":
        for name, value in (("head_dim", head_dim), ("head_dim_v", head_dim_v)):
            if value % 8 or value > 256:
                raise ValueError(f"{name} must be a multiple of 8 and at most 256 on CUDA, got {value}")
        for name, value in (("batch", batch), ("nheads", nheads)):
            if value > _GRID_MAX:
                raise ValueError(f"{name} must be at most {_GRID_MAX} on CUDA (the grid's limit), got {value}")


def _check_inputs(q, k, v, varlen=False):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
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
    batch, seqlen_q, nheads, head_dim = q.shape
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
    if not varlen:  # varlen checks its maxima itself; here the sizes are the packed totals
        _check_sizes(q.device, batch, seqlen_q, seqlen_k, nheads, nheads_kv, head_dim, v.shape[3])
    elif max(seqlen_q, seqlen_k) > _INT32_MAX:
        raise ValueError(f"the packed rows of q and k must fit in int32, got {seqlen_q} and {seqlen_k}")


def _check_bwd(dout, dlse, q, k, v, out, lse):
    _check_inputs(q, k, v)
    batch, seqlen_q, nheads, _ = q.shape
    out_shape = (batch, seqlen_q, nheads, v.shape[3])
    lse_shape = (batch, nheads, seqlen_q)
    _check_grad_inputs(q, out, dout, lse, dlse, out_shape, lse_shape)


def _check_grad_inputs(q, out, dout, lse, dlse, out_shape, lse_shape):
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


def _aligned_rows(t):
    """Whether the kernels can address t where it is: 16-byte aligned rows, contiguous last dimension."""
    aligned = t.data_ptr() % 16 == 0 and all(st % 8 == 0 for st, n in zip(t.stride()[:-1], t.shape[:-1]) if n > 1)
    return aligned and (t.stride(-1) == 1 or t.shape[-1] <= 1)


def _kernel_ready(t):
    """t itself when the kernels can read it as it is, else a contiguous copy: any strided or offset view is
    accepted, and the C library's alignment rules never fire."""
    return t if _aligned_rows(t) else torch.empty_like(t, memory_format=torch.contiguous_format).copy_(t)


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


def run_forward(q, k, v, out, lse, args, varlen=None, sink=None, paged=None):
    """Launches the forward on the current stream into out and lse, which the caller allocated (any strides the
    kernels take: _kernel_ready's). Fixed length: q, k, v, out (B, S, H, D), lse (B, H, S). varlen: (cu_seqlens_q,
    cu_seqlens_k, seqused_k, seqused_q, max_q, max_k) with q, k, v, out (total, H, D) and lse (H, total). paged:
    (page_table, seqused_k, num_splits, packed_gqa) with k, v the pages (see _paged_params). args: (scale, causal,
    window_left, window_right, softcap); sink: the learnable sink or None. The one launch path of the CUDA ops and
    of flashcute.torch."""
    q, k, v = (_kernel_ready(t) for t in (q, k, v))
    dtype = _CUDA_DTYPES[q.dtype]
    if paged is not None:
        p = _paged_params(q, k, v, out, lse, dtype, args, *paged)
    elif varlen is None:
        p = _fwd_params(q, k, v, out, lse, dtype, *args)
    else:
        p = _varlen_fwd_params(q, k, v, out, lse, dtype, args, *varlen)
    sink32 = None if sink is None else sink.to(torch.float32).contiguous()  # held until the launch
    p.learnable_sink = _ptr(sink32)
    lib = _capi.lib()
    _launch_cuda(lib.flashcute_fwd, lib.flashcute_fwd_workspace_size, p, q.device)


def run_backward(dout, dlse, q, k, v, out, lse, dq, dk, dv, args, deterministic, varlen=None, sink=(None, None)):
    """Launches the backward on the current stream into dq, dk, dv (laid out like q, k, v; see run_forward);
    dlse may be None; sink: (learnable sink, its gradient buffer) or Nones."""
    q, k, v, out, dout = (_kernel_ready(t) for t in (q, k, v, out, dout))
    lse = lse.contiguous()  # dlse has no strides of its own: it shares lse's (contiguous) layout
    dlse = None if dlse is None else dlse.to(torch.float32).contiguous()
    dtype = _CUDA_DTYPES[q.dtype]
    if varlen is None:
        p = _bwd_params(_fwd_params(q, k, v, out, lse, dtype, *args), dout, dlse, dq, dk, dv, deterministic)
    else:
        fwd_p = _varlen_fwd_params(q, k, v, out, lse, dtype, args, *varlen)
        p = _bwd_params(fwd_p, dout[None], dlse, dq[None], dk[None], dv[None], deterministic)
    # The kernels read and write float32 (lse's type); both stay referenced until the launch.
    sink32 = None if sink[0] is None else sink[0].to(torch.float32).contiguous()
    dsink = sink[1]
    dsink32 = dsink if dsink is None or (dsink.dtype == torch.float32 and dsink.is_contiguous()) else \
        torch.empty(dsink.shape, dtype=torch.float32, device=dsink.device)
    p.fwd.learnable_sink = _ptr(sink32)
    p.dsink = _ptr(dsink32)
    lib = _capi.lib()
    _launch_cuda(lib.flashcute_bwd, lib.flashcute_bwd_workspace_size, p, q.device)
    if dsink32 is not dsink:
        dsink.copy_(dsink32)


def _f64(t):
    """A float64 copy for the host reference, without materialising expanded (stride-0) dimensions: a huge
    broadcast view stays as small as its data."""
    if t is None:
        return None
    small = t
    for d in range(t.dim()):
        if t.stride(d) == 0 and t.shape[d] > 1:
            small = small.narrow(d, 0, 1)
    wide = small.to(torch.float64).contiguous().expand(t.shape)
    return wide if t.dim() == 0 or wide.stride(-1) == 1 or wide.shape[-1] <= 1 else wide.contiguous()


def _check_sink(q, sink, nheads):
    """learnable_sink: None, or one logit per query head (a 1-D floating tensor on q's device)."""
    if sink is None:
        return
    if not isinstance(sink, Tensor) or sink.dim() != 1 or sink.shape[0] != nheads:
        raise ValueError(f"learnable_sink must be a 1-D tensor of nheads = {nheads} logits, got "
                         f"{tuple(sink.shape) if isinstance(sink, Tensor) else type(sink).__name__}")
    if not sink.dtype.is_floating_point:
        raise ValueError(f"learnable_sink must be a floating tensor, got {sink.dtype}")
    if sink.device != q.device:
        raise ValueError(f"learnable_sink is on {sink.device} but q is on {q.device}")


def _dsink_like(sink, q):
    """The sink's gradient buffer, or an empty tensor on q's device where there is no sink (ops return tensors, not
    None)."""
    return q.new_empty((0,), dtype=torch.float32) if sink is None else torch.empty_like(sink)


def _reference_bwd(fwd_p, sink, q, dout64, dlse64, dq, dk, dv, deterministic):
    """The float64 host reference backward, from fwd_p (float64 tensors) into the float64 gradient views as the C
    API takes them; returns the sink's gradient in the sink's dtype (empty without a sink)."""
    sink64 = _f64(sink)
    dsink64 = None if sink64 is None else torch.empty(sink64.shape, dtype=torch.float64)
    fwd_p.learnable_sink = _ptr(sink64)
    p = _bwd_params(fwd_p, dout64, dlse64, dq, dk, dv, deterministic)
    p.dsink = _ptr(dsink64)
    _capi.check(_capi.lib().flashcute_reference_bwd(ctypes.byref(p)))
    return _dsink_like(sink, q) if dsink64 is None else dsink64.to(sink.dtype)


_FWD_SCHEMA = ("(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal, int window_left, int window_right, "
               "float softcap, bool deterministic=False, Tensor? learnable_sink=None) -> (Tensor out, Tensor lse)")
_BWD_SCHEMA = ("(Tensor dout, Tensor? dlse, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, float softmax_scale, "
               "bool causal, int window_left, int window_right, float softcap, bool deterministic, "
               "Tensor? learnable_sink=None) -> (Tensor dq, Tensor dk, Tensor dv, Tensor dsink)")


@_custom_op("flashcute::fwd", _FWD_SCHEMA)
def fwd(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, causal: bool, window_left: int, window_right: int,
        softcap: float, deterministic: bool = False, learnable_sink: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    # deterministic only matters to the backward; it rides along so that setup_context can keep it.
    _check_inputs(q, k, v)
    _check_sink(q, learnable_sink, q.shape[2])
    args = (softmax_scale, causal, window_left, window_right, softcap)
    batch, seqlen_q, nheads, _ = q.shape
    if q.device.type == "cuda":
        out = q.new_empty((batch, seqlen_q, nheads, v.shape[3]))
        lse = q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)
        run_forward(q, k, v, out, lse, args, sink=learnable_sink)
        return out, lse
    q64, k64, v64, sink64 = (_f64(t) for t in (q, k, v, learnable_sink))
    out = torch.empty((batch, seqlen_q, nheads, v.shape[3]), dtype=torch.float64)
    lse = torch.empty((batch, nheads, seqlen_q), dtype=torch.float64)
    p = _fwd_params(q64, k64, v64, out, lse, _capi.FLOAT64, *args)
    p.learnable_sink = _ptr(sink64)
    _capi.check(_capi.lib().flashcute_reference_fwd(ctypes.byref(p)))
    return out.to(q.dtype), lse.to(_lse_dtype(q.dtype))


@fwd.register_fake
def _(q, k, v, softmax_scale, causal, window_left, window_right, softcap, deterministic=False, learnable_sink=None):
    _check_inputs(q, k, v)
    _check_sink(q, learnable_sink, q.shape[2])
    batch, seqlen_q, nheads, _ = q.shape
    out = q.new_empty((batch, seqlen_q, nheads, v.shape[3]))
    return out, q.new_empty((batch, nheads, seqlen_q), dtype=_lse_dtype(q.dtype))


_PAGED_FWD_SCHEMA = ("(Tensor q, Tensor k_pages, Tensor v_pages, Tensor page_table, Tensor? seqused_k, "
                     "float softmax_scale, bool causal, int window_left, int window_right, float softcap, "
                     "Tensor? learnable_sink=None, int num_splits=0, int packed_gqa=0) -> (Tensor out, Tensor lse)")


def _paged_params(q, k_pages, v_pages, out, lse, dtype, args, page_table, seqused_k, num_splits, packed_gqa):
    """The C API's paged forward: sequence b's keys live in the pages page_table[b, :] names, its first
    seqused_k[b] of them (all max_pages * page_size without seqused_k) taking part; num_splits: split-KV (0 on the
    GPU: one wave of the dispatched tile, decode.choose_splits); packed_gqa: q's rows are packed query heads (the C
    API's packed_gqa)."""
    p = _fwd_params(q, k_pages, v_pages, out, lse, dtype, *args)
    p.num_splits, p.packed_gqa = num_splits, packed_gqa
    p.seqlen_k = page_table.shape[1] * k_pages.shape[1]
    p.page_table, p.page_table_batch_stride = _ptr(page_table), page_table.stride(0)
    p.page_size, p.num_pages = k_pages.shape[1], k_pages.shape[0]
    p.seqused_k = _ptr(seqused_k)
    if num_splits == 0 and q.device.type == "cuda":  # chosen here, where the dispatched tile is known
        def wave():
            with torch.cuda.device(q.device):
                ctas, sms = _capi.fwd_occupancy(p)
            return ctas * sms
        batch, rows, heads, _ = q.shape
        p.num_splits = decode.choose_splits(batch, heads, rows, p.seqlen_k, wave)
    return p


def _paged_out(q, head_dim_v, packed_gqa):
    """paged_fwd's out (batch, rows, nheads, head_dim_v). Packed decode with one query row per head (rows =
    packed_gqa) gets it in the unpacked order, row j of K/V head h at query head h * packed_gqa + j, so unpacking it
    is a view and not a copy (a separate kernel, about 2 us, per decode step)."""
    batch, rows, nheads, _ = q.shape
    if packed_gqa > 1 and rows == packed_gqa:
        return q.new_empty_strided((batch, rows, nheads, head_dim_v),
                                   (rows * nheads * head_dim_v, head_dim_v, rows * head_dim_v, 1))
    return q.new_empty((batch, rows, nheads, head_dim_v))


@_custom_op("flashcute::paged_fwd", _PAGED_FWD_SCHEMA)
def paged_fwd(q: Tensor, k_pages: Tensor, v_pages: Tensor, page_table: Tensor, seqused_k: Optional[Tensor],
              softmax_scale: float, causal: bool, window_left: int, window_right: int, softcap: float,
              learnable_sink: Optional[Tensor] = None, num_splits: int = 0,
              packed_gqa: int = 0) -> tuple[Tensor, Tensor]:
    """Forward over a paged KV cache (no gradient): q (batch, seqlen_q, nheads, D); k_pages / v_pages (num_pages,
    page_size, nheads_kv, D); page_table (batch, max_pages) int32; num_splits > 1: the keys of each sequence in
    that many chunks, combined by the library (split-KV; 0 on the GPU: as many as fill one wave, _paged_params);
    packed_gqa > 1: q holds nheads_kv heads of packed_gqa query heads each, row i * packed_gqa + j of head h being
    query row i of head h * packed_gqa + j (the masks see row i). The C library checks the arguments."""
    _check_sink(q, learnable_sink, q.shape[2])
    args = (softmax_scale, causal, window_left, window_right, softcap)
    batch, seqlen_q, nheads, _ = q.shape
    table, used = (None if t is None else t.contiguous() for t in (page_table, seqused_k))
    out = _paged_out(q, v_pages.shape[3], packed_gqa)
    if q.device.type == "cuda":
        lse = q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)
        run_forward(q, k_pages, v_pages, out, lse, args, sink=learnable_sink,
                    paged=(table, used, num_splits, packed_gqa))
        return out, lse
    q64, k64, v64, sink64 = (_f64(t) for t in (q, k_pages, v_pages, learnable_sink))
    out64 = torch.empty((batch, seqlen_q, nheads, v_pages.shape[3]), dtype=torch.float64)
    lse = torch.empty((batch, nheads, seqlen_q), dtype=torch.float64)
    p = _paged_params(q64, k64, v64, out64, lse, _capi.FLOAT64, args, table, used, num_splits, packed_gqa)
    p.learnable_sink = _ptr(sink64)
    _capi.check(_capi.lib().flashcute_reference_fwd(ctypes.byref(p)))
    return out.copy_(out64), lse.to(_lse_dtype(q.dtype))


@paged_fwd.register_fake
def _(q, k_pages, v_pages, page_table, seqused_k, softmax_scale, causal, window_left, window_right, softcap,
      learnable_sink=None, num_splits=0, packed_gqa=0):
    batch, seqlen_q, nheads, _ = q.shape
    out = _paged_out(q, v_pages.shape[3], packed_gqa)
    return out, q.new_empty((batch, nheads, seqlen_q), dtype=_lse_dtype(q.dtype))


@_custom_op("flashcute::bwd", _BWD_SCHEMA)
def bwd(dout: Tensor, dlse: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
        softmax_scale: float, causal: bool, window_left: int, window_right: int, softcap: float,
        deterministic: bool, learnable_sink: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    _check_bwd(dout, dlse, q, k, v, out, lse)
    _check_sink(q, learnable_sink, q.shape[2])
    args = (softmax_scale, causal, window_left, window_right, softcap)
    if q.device.type == "cuda":
        dq, dk, dv = (torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
        dsink = _dsink_like(learnable_sink, q)
        run_backward(dout, dlse, q, k, v, out, lse, dq, dk, dv, args, deterministic, sink=(learnable_sink, dsink))
        return dq, dk, dv, dsink
    q64, k64, v64, out64, lse64, dout64, dlse64 = (_f64(t) for t in (q, k, v, out, lse, dout, dlse))
    lse64 = lse64.contiguous()
    dlse64 = None if dlse64 is None else dlse64.contiguous()
    dq, dk, dv = (torch.empty(t.shape, dtype=torch.float64) for t in (q, k, v))
    fwd_p = _fwd_params(q64, k64, v64, out64, lse64, _capi.FLOAT64, *args)
    dsink = _reference_bwd(fwd_p, learnable_sink, q, dout64, dlse64, dq, dk, dv, deterministic)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dsink


@bwd.register_fake
def _(dout, dlse, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap, deterministic,
      learnable_sink=None):
    _check_bwd(dout, dlse, q, k, v, out, lse)
    _check_sink(q, learnable_sink, q.shape[2])
    grads = tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
    return (*grads, _dsink_like(learnable_sink, q))


def _register_autograd(forward_op, backward_op, num_seq_tensors):
    """Autograd for a forward op whose inputs are q, k, v, then num_seq_tensors sequence tensors (varlen offsets,
    passed through), then scalars ending with deterministic, then the learnable sink (or None); backward_op takes
    (dout, dlse, q, k, v, out, lse, *sequence tensors, *scalars, sink) and returns (dq, dk, dv, dsink)."""

    def setup_context(ctx, inputs, output):
        n = 3 + num_seq_tensors
        ctx.save_for_backward(*inputs[:n], *output, inputs[-1])
        ctx.args = inputs[n:-1]
        ctx.set_materialize_grads(False)  # an unused out or lse arrives as None (dlse None -> NULL in C)

    def backward(ctx, dout, dlse):
        q, k, v, *seq, out, lse, sink = ctx.saved_tensors
        no_grads = (None,) * (num_seq_tensors + len(ctx.args))
        if dout is None and dlse is None:
            return (None,) * 3 + no_grads + (None,)
        if dout is None:
            dout = torch.zeros_like(out)
        *args, deterministic = ctx.args
        deterministic = deterministic or torch.are_deterministic_algorithms_enabled()
        dq, dk, dv, dsink = call(backward_op, dout, dlse, q, k, v, out, lse, *seq, *args, deterministic, sink)
        return (dq, dk, dv) + no_grads + (None if sink is None else dsink,)

    forward_op.register_autograd(backward, setup_context=setup_context)

    class Direct(torch.autograd.Function):  # the same autograd around direct calls of the implementation (call())
        @staticmethod
        def forward(ctx, *inputs):
            output = _DIRECT[forward_op](*inputs)
            setup_context(ctx, inputs, output)
            return output

        @staticmethod
        def backward(ctx, dout, dlse):
            return backward(ctx, dout, dlse)

    _WITH_AUTOGRAD[forward_op] = Direct


_register_autograd(fwd, bwd, 0)


# Variable length: sequences packed along the rows. q (total_q, H, D), k/v (total_k, Hkv, D/Dv), int32
# cu_seqlens_q/k (batch + 1 offsets), optional int32 seqused_k and seqused_q (batch); out (total_q, H, Dv), lse
# (H, total_q).
# The C library takes these as batch = number of sequences, seqlen = the longest one, total = the packed rows,
# with the batch strides ignored; the packed tensors are passed as (1, total, H, D) views. max_seqlen_q/k < 0 mean
# "not given": the offsets are then read on the host (one small copy), checked and their maxima taken. Given, no
# host copy happens (CUDA graphs) and the kernels clamp whatever the offsets hold (C API, flashcute.h).

def _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, seqused_q, max_seqlen_q, max_seqlen_k):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() != 3:
            raise ValueError(f"{name} must be a 3-D tensor (total_tokens, nheads, head_dim) for varlen, got "
                             f"{tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__}")
    _check_inputs(q[None], k[None], v[None], varlen=True)
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k), ("seqused_k", seqused_k),
                    ("seqused_q", seqused_q)):
        if t is None:
            continue
        if t.dtype != torch.int32 or t.dim() != 1:
            raise ValueError(f"{name} must be a 1-D int32 tensor, got {t.dtype} with shape {tuple(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    if cu_seqlens_q.numel() < 1 or cu_seqlens_k.numel() != cu_seqlens_q.numel():
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must both hold batch + 1 >= 1 offsets, got "
                         f"{cu_seqlens_q.numel()} and {cu_seqlens_k.numel()}")
    for name, t in (("seqused_k", seqused_k), ("seqused_q", seqused_q)):
        if t is not None and t.numel() != cu_seqlens_q.numel() - 1:
            raise ValueError(f"{name} must hold batch = {cu_seqlens_q.numel() - 1} entries, got {t.numel()}")
    if (max_seqlen_q < 0) != (max_seqlen_k < 0):
        raise ValueError("max_seqlen_q and max_seqlen_k must be given together")
    _check_sizes(q.device, cu_seqlens_q.numel() - 1, max(max_seqlen_q, 0), max(max_seqlen_k, 0), q.shape[1],
                 k.shape[1], q.shape[2], v.shape[2])


def _varlen_lengths(q, k, cu_seqlens_q, cu_seqlens_k, seqused_k, seqused_q, max_seqlen_q, max_seqlen_k):
    """The longest sequences: as given, or read from the offsets on the host (one small copy) and checked against
    the packed tensors, so that inconsistent offsets raise instead of being clamped."""
    if max_seqlen_q >= 0:
        return max_seqlen_q, max_seqlen_k
    if q.device.type == "meta":
        return q.shape[0], k.shape[0]
    if q.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise ValueError("flash_attn_varlen_func under CUDA graph capture needs max_seqlen_q and max_seqlen_k: "
                         "without them the offsets are read on the host, which capture forbids")
    cu_q, cu_k = cu_seqlens_q.cpu().long(), cu_seqlens_k.cpu().long()
    for name, cu, total in (("cu_seqlens_q", cu_q, q.shape[0]), ("cu_seqlens_k", cu_k, k.shape[0])):
        if cu[0] != 0 or bool((cu[1:] < cu[:-1]).any()) or cu[-1] > total:
            raise ValueError(f"{name} must start at 0, never decrease, and end at most at the {total} packed rows, "
                             f"got {cu.tolist()}")
    len_k = cu_k[1:] - cu_k[:-1]
    for name, used, lengths in (("seqused_k", seqused_k, len_k), ("seqused_q", seqused_q, cu_q[1:] - cu_q[:-1])):
        if used is not None:
            used = used.cpu().long()
            if bool((used < 0).any()) or bool((used > lengths).any()):
                raise ValueError(f"{name} must lie in [0, the sequence's length], got {used.tolist()}")
    max_q = int((cu_q[1:] - cu_q[:-1]).max()) if cu_q.numel() > 1 else 0
    max_k = int(len_k.max()) if cu_k.numel() > 1 else 0
    _check_sizes(q.device, cu_q.numel() - 1, max_q, max_k, q.shape[1], k.shape[1], q.shape[2], q.shape[2])
    return max_q, max_k


def _contiguous(*tensors):
    return tuple(None if t is None else t.contiguous() for t in tensors)


def _varlen_fwd_params(q, k, v, out, lse, dtype, args, cu_seqlens_q, cu_seqlens_k, seqused_k, seqused_q, max_q,
                       max_k):
    p = _fwd_params(q[None], k[None], v[None], out[None], lse[None], dtype, *args)
    p.batch, p.seqlen_q, p.seqlen_k = cu_seqlens_q.numel() - 1, max_q, max_k
    p.total_q, p.total_k = q.shape[0], k.shape[0]
    p.cu_seqlens_q, p.cu_seqlens_k = _ptr(cu_seqlens_q), _ptr(cu_seqlens_k)
    p.seqused_k, p.seqused_q = _ptr(seqused_k), _ptr(seqused_q)
    return p


_VARLEN_ARGS = ("Tensor cu_seqlens_q, Tensor cu_seqlens_k, Tensor? seqused_k, Tensor? seqused_q, int max_seqlen_q, "
                "int max_seqlen_k, "
                "float softmax_scale, bool causal, int window_left, int window_right, float softcap")
_VARLEN_FWD_SCHEMA = (f"(Tensor q, Tensor k, Tensor v, {_VARLEN_ARGS}, bool deterministic=False, "
                      "Tensor? learnable_sink=None) -> (Tensor out, Tensor lse)")
_VARLEN_BWD_SCHEMA = (f"(Tensor dout, Tensor? dlse, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
                      f"{_VARLEN_ARGS}, bool deterministic, Tensor? learnable_sink=None) "
                      "-> (Tensor dq, Tensor dk, Tensor dv, Tensor dsink)")


@_custom_op("flashcute::varlen_fwd", _VARLEN_FWD_SCHEMA)
def varlen_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
               seqused_k: Optional[Tensor], seqused_q: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
               softmax_scale: float, causal: bool,
               window_left: int, window_right: int, softcap: float,
               deterministic: bool = False, learnable_sink: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    varlen = (cu_seqlens_q, cu_seqlens_k, seqused_k, seqused_q, max_seqlen_q, max_seqlen_k)
    _check_varlen(q, k, v, *varlen)
    _check_sink(q, learnable_sink, q.shape[1])
    max_q, max_k = _varlen_lengths(q, k, *varlen)
    args = (softmax_scale, causal, window_left, window_right, softcap)
    seqs = _contiguous(cu_seqlens_q, cu_seqlens_k, seqused_k, seqused_q)
    total_q, nheads, _ = q.shape
    # Rows that belong to no sequence (past cu_seqlens_q[-1], or a sequence's seqused_q) are defined: out 0, lse -inf,
    # which the library writes.
    if q.device.type == "cuda":
        out = q.new_empty((total_q, nheads, v.shape[2]))
        lse = q.new_empty((nheads, total_q), dtype=torch.float32)
        run_forward(q, k, v, out, lse, args, (*seqs, max_q, max_k), sink=learnable_sink)
        return out, lse
    q64, k64, v64, sink64 = (_f64(t) for t in (q, k, v, learnable_sink))
    out = torch.empty((total_q, nheads, v.shape[2]), dtype=torch.float64)  # the reference writes every row
    lse = torch.empty((nheads, total_q), dtype=torch.float64)
    p = _varlen_fwd_params(q64, k64, v64, out, lse, _capi.FLOAT64, args, *seqs, max_q, max_k)
    p.learnable_sink = _ptr(sink64)
    _capi.check(_capi.lib().flashcute_reference_fwd(ctypes.byref(p)))
    return out.to(q.dtype), lse.to(_lse_dtype(q.dtype))


@varlen_fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, seqused_q, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
      window_left, window_right, softcap, deterministic=False, learnable_sink=None):
    _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, seqused_q, max_seqlen_q, max_seqlen_k)
    _check_sink(q, learnable_sink, q.shape[1])
    total_q, nheads, _ = q.shape
    return q.new_empty((total_q, nheads, v.shape[2])), q.new_empty((nheads, total_q), dtype=_lse_dtype(q.dtype))


def _check_varlen_bwd(dout, dlse, q, k, v, out, lse, *varlen):
    _check_varlen(q, k, v, *varlen)
    total_q, nheads, _ = q.shape
    out_shape, lse_shape = (total_q, nheads, v.shape[2]), (nheads, total_q)
    _check_grad_inputs(q, out, dout, lse, dlse, out_shape, lse_shape)


@_custom_op("flashcute::varlen_bwd", _VARLEN_BWD_SCHEMA)
def varlen_bwd(dout: Tensor, dlse: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
               cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, seqused_k: Optional[Tensor], seqused_q: Optional[Tensor],
               max_seqlen_q: int,
               max_seqlen_k: int, softmax_scale: float, causal: bool, window_left: int, window_right: int,
               softcap: float, deterministic: bool,
               learnable_sink: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    varlen = (cu_seqlens_q, cu_seqlens_k, seqused_k, seqused_q, max_seqlen_q, max_seqlen_k)
    _check_varlen_bwd(dout, dlse, q, k, v, out, lse, *varlen)
    _check_sink(q, learnable_sink, q.shape[1])
    max_q, max_k = _varlen_lengths(q, k, *varlen)
    args = (softmax_scale, causal, window_left, window_right, softcap)
    seqs = _contiguous(cu_seqlens_q, cu_seqlens_k, seqused_k, seqused_q)
    # Rows that belong to no sequence get zero gradients (the library writes them).
    if q.device.type == "cuda":
        dq, dk, dv = (torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
        dsink = _dsink_like(learnable_sink, q)
        run_backward(dout, dlse, q, k, v, out, lse, dq, dk, dv, args, deterministic, (*seqs, max_q, max_k),
                     sink=(learnable_sink, dsink))
        return dq, dk, dv, dsink
    q64, k64, v64, out64, lse64, dout64, dlse64 = (_f64(t) for t in (q, k, v, out, lse, dout, dlse))
    lse64 = lse64.contiguous()
    dlse64 = None if dlse64 is None else dlse64.contiguous()
    dq, dk, dv = (torch.empty(t.shape, dtype=torch.float64) for t in (q, k, v))  # the reference writes every row
    fwd_p = _varlen_fwd_params(q64, k64, v64, out64, lse64, _capi.FLOAT64, args, *seqs, max_q, max_k)
    dsink = _reference_bwd(fwd_p, learnable_sink, q, dout64[None], dlse64, dq[None], dk[None], dv[None],
                           deterministic)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dsink


@varlen_bwd.register_fake
def _(dout, dlse, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, seqused_q, max_seqlen_q, max_seqlen_k,
      softmax_scale, causal, window_left, window_right, softcap, deterministic, learnable_sink=None):
    _check_varlen_bwd(dout, dlse, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, seqused_q, max_seqlen_q,
                      max_seqlen_k)
    _check_sink(q, learnable_sink, q.shape[1])
    grads = tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
    return (*grads, _dsink_like(learnable_sink, q))


_register_autograd(varlen_fwd, varlen_bwd, 4)


# Outputs into caller buffers (FlashAttention-4's out=, lse=, dq=, dk=, dv=): mutating ops, for calls without
# autograd. On CUDA the kernels write straight into a buffer they can address (16-byte aligned rows; lse contiguous
# along its rows), otherwise into a temporary that is then copied over; on the CPU the reference's result is copied.

def _check_buffers(q, buffers):
    """buffers: (name, tensor, shape, dtype) of each caller buffer."""
    for name, t, shape, dtype in buffers:
        if not isinstance(t, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
        if t.dtype != dtype:
            raise ValueError(f"{name} must have dtype {dtype}, got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")


def _addressable(t, rows_contiguous=False):
    """Whether the kernels can write t where it is; rows_contiguous: lse, whose last dimension has no stride in
    the C API."""
    if rows_contiguous:
        return t.data_ptr() % 4 == 0 and (t.stride(-1) == 1 or t.shape[-1] <= 1)
    return _aligned_rows(t)


def _run_into(buffers, launch):
    """Runs launch(*targets) with each caller buffer, or a temporary where the kernels cannot write it, then copies
    the temporaries over. buffers: (tensor, rows_contiguous)."""
    targets = [t if _addressable(t, rows_contiguous) else torch.empty(t.shape, dtype=t.dtype, device=t.device)
               for t, rows_contiguous in buffers]
    launch(*targets)
    for t, target in zip((b[0] for b in buffers), targets):
        if target is not t:
            t.copy_(target)


_INTO_ARGS = "float softmax_scale, bool causal, int window_left, int window_right, float softcap"


@torch.library.custom_op("flashcute::fwd_into", mutates_args=("out", "lse"),
                         schema=(f"(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!) lse, {_INTO_ARGS}, "
                                 "Tensor? learnable_sink=None) -> ()"))
def fwd_into(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, softmax_scale: float, causal: bool,
             window_left: int, window_right: int, softcap: float, learnable_sink: Optional[Tensor] = None) -> None:
    _check_inputs(q, k, v)
    _check_sink(q, learnable_sink, q.shape[2])
    batch, seqlen_q, nheads, _ = q.shape
    _check_buffers(q, (("out", out, (batch, seqlen_q, nheads, v.shape[3]), q.dtype),
                       ("lse", lse, (batch, nheads, seqlen_q), _lse_dtype(q.dtype))))
    args = (softmax_scale, causal, window_left, window_right, softcap)
    if q.device.type == "cuda":
        _run_into(((out, False), (lse, True)),
                  lambda o, l: run_forward(q, k, v, o, l, args, sink=learnable_sink))
        return
    o, l = fwd(q, k, v, *args, False, learnable_sink)
    out.copy_(o)
    lse.copy_(l)


@fwd_into.register_fake
def _(q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap, learnable_sink=None):
    _check_inputs(q, k, v)
    _check_sink(q, learnable_sink, q.shape[2])


# The sink's arguments have no defaults: torch 2.11's boxed dispatch drops trailing arguments equal to their
# defaults, and its ADInplaceOrView kernel then indexes past the end for the mutable dsink (IndexError on the
# H100 / H200 device's torch, bench/RESULTS.md 2026-12-06; later torch releases pass).
@torch.library.custom_op("flashcute::bwd_into", mutates_args=("dq", "dk", "dv", "dsink"),
                         schema=("(Tensor dout, Tensor? dlse, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
                                 f"Tensor(a!) dq, Tensor(b!) dk, Tensor(c!) dv, {_INTO_ARGS}, bool deterministic, "
                                 "Tensor? learnable_sink, Tensor(d!)? dsink) -> ()"))
def bwd_into(dout: Tensor, dlse: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
             dq: Tensor, dk: Tensor, dv: Tensor, softmax_scale: float, causal: bool, window_left: int,
             window_right: int, softcap: float, deterministic: bool, learnable_sink: Optional[Tensor],
             dsink: Optional[Tensor]) -> None:
    """dsink: the sink's gradient buffer (the sink's shape and dtype), None where it is not wanted."""
    _check_into_bwd(dout, dlse, q, k, v, out, lse, dq, dk, dv, learnable_sink, dsink)
    args = (softmax_scale, causal, window_left, window_right, softcap)
    if q.device.type == "cuda":
        _run_into(((dq, False), (dk, False), (dv, False)),
                  lambda a, b, c: run_backward(dout, dlse, q, k, v, out, lse, a, b, c, args, deterministic,
                                               sink=(learnable_sink, dsink)))
        return
    grads = bwd(dout, dlse, q, k, v, out, lse, *args, deterministic, learnable_sink)
    for dst, src in zip((dq, dk, dv, dsink), grads):
        if dst is not None:
            dst.copy_(src)


def _check_into_bwd(dout, dlse, q, k, v, out, lse, dq, dk, dv, sink, dsink):
    _check_bwd(dout, dlse, q, k, v, out, lse)
    _check_sink(q, sink, q.shape[2])
    if dsink is not None and sink is None:
        raise ValueError("dsink= is the learnable sink's gradient: pass learnable_sink too")
    buffers = [("dq", dq, q.shape, q.dtype), ("dk", dk, k.shape, k.dtype), ("dv", dv, v.shape, v.dtype)]
    _check_buffers(q, buffers + ([] if dsink is None else [("dsink", dsink, sink.shape, sink.dtype)]))


@bwd_into.register_fake
def _(dout, dlse, q, k, v, out, lse, dq, dk, dv, softmax_scale, causal, window_left, window_right, softcap,
      deterministic, learnable_sink, dsink):
    _check_into_bwd(dout, dlse, q, k, v, out, lse, dq, dk, dv, learnable_sink, dsink)


@torch.library.custom_op("flashcute::varlen_fwd_into", mutates_args=("out", "lse"),
                         schema=(f"(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!) lse, {_VARLEN_ARGS}, "
                                 "Tensor? learnable_sink=None) -> ()"))
def varlen_fwd_into(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, cu_seqlens_q: Tensor,
                    cu_seqlens_k: Tensor, seqused_k: Optional[Tensor], seqused_q: Optional[Tensor],
                    max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool, window_left: int,
                    window_right: int, softcap: float, learnable_sink: Optional[Tensor] = None) -> None:
    varlen = (cu_seqlens_q, cu_seqlens_k, seqused_k, seqused_q, max_seqlen_q, max_seqlen_k)
    _check_varlen(q, k, v, *varlen)
    _check_sink(q, learnable_sink, q.shape[1])
    total_q, nheads, _ = q.shape
    _check_buffers(q, (("out", out, (total_q, nheads, v.shape[2]), q.dtype),
                       ("lse", lse, (nheads, total_q), _lse_dtype(q.dtype))))
    args = (softmax_scale, causal, window_left, window_right, softcap)
    if q.device.type == "cuda":
        max_q, max_k = _varlen_lengths(q, k, *varlen)
        seqs = _contiguous(cu_seqlens_q, cu_seqlens_k, seqused_k, seqused_q)
        # The library writes padding rows (in no sequence) too: out 0, lse -inf.
        _run_into(((out, False), (lse, True)),
                  lambda o, l: run_forward(q, k, v, o, l, args, (*seqs, max_q, max_k), sink=learnable_sink))
        return
    o, l = varlen_fwd(q, k, v, *varlen, *args, False, learnable_sink)
    out.copy_(o)
    lse.copy_(l)


@varlen_fwd_into.register_fake
def _(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, seqused_q, max_seqlen_q, max_seqlen_k, softmax_scale,
      causal, window_left, window_right, softcap, learnable_sink=None):
    _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, seqused_q, max_seqlen_q, max_seqlen_k)
    _check_sink(q, learnable_sink, q.shape[1])
