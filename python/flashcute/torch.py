"""flashcute as PyTorch's flash attention: SDPA's flash backend, torch.nn.attention.varlen and whatever else calls the
aten flash-attention ops (PyTorch's context parallelism among them) run flashcute's kernels, forward and backward.

    import flashcute.torch
    flashcute.torch.activate()            # until flashcute.torch.deactivate()
    with flashcute.torch.enabled(): ...   # or for a block

Where the installed torch has torch.nn.attention's flash-attention registry, flashcute registers itself there as
"flashcute" (so torch.nn.attention.activate_flash_attention_impl("flashcute") works too) and activate() goes through
it; older torch gets the same overrides of the aten ops through torch.library. Inputs flashcute does not serve
(dropout, debug masks, ALiBi, paged KV, dtypes or head dims without a kernel) go to PyTorch's own kernel where torch
can hand it back (torch.library.get_kernel); otherwise they raise, naming what is missing.
"""
import contextlib
import inspect

import torch

from . import ops

__all__ = ["activate", "deactivate", "enabled", "is_active", "NAME"]

NAME = "flashcute"

# The aten flash-attention ops flashcute takes over; ops a torch version lacks are skipped.
_FORWARD, _BACKWARD = "_flash_attention_forward", "_flash_attention_backward"
_FORWARD_INPLACE = "_flash_attention_forward_no_dropout_inplace"
_SDPA_FORWARD, _SDPA_BACKWARD = "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward"

_registry = getattr(torch.nn, "attention", None)
_HAS_REGISTRY = all(hasattr(_registry, f) for f in ("register_flash_attention_impl", "activate_flash_attention_impl",
                                                    "restore_flash_attention_impl", "current_flash_attention_impl"))
_CAN_FALL_BACK = hasattr(torch.library, "get_kernel") and \
    "with_keyset" in inspect.signature(torch.library.Library.impl).parameters

_handle = None  # the installed overrides when activated without the registry


def _bind(name, args, kwargs):
    """The op's arguments by name (its schema's defaults for those not passed)."""
    bound = {}
    for i, arg in enumerate(getattr(torch.ops.aten, name).default._schema.arguments):
        if i < len(args):
            bound[arg.name] = args[i]
        elif arg.name in kwargs:
            bound[arg.name] = kwargs[arg.name]
        else:
            bound[arg.name] = arg.default_value if arg.has_default_value() else None
    return bound


def _like(ref, shape):
    """An empty tensor of `shape` with ref's dtype, device and dimension order (what PyTorch's meta functions give
    these ops' outputs, so torch.compile sees the strides it expects)."""
    if tuple(ref.shape) == tuple(shape):
        return torch.empty_like(ref)
    order = sorted(range(ref.dim()), key=lambda d: (ref.stride(d) if ref.stride(d) else float("inf"), d))
    strides, step = [0] * ref.dim(), 1
    for d in order:
        strides[d], step = step, step * shape[d]
    return torch.empty_strided(shape, strides, dtype=ref.dtype, device=ref.device)


def _unsupported(a, tensors, head_dims):
    """Why flashcute cannot serve this call, or None."""
    if a.get("dropout_p", 0.0):
        return "dropout"
    if a.get("return_debug_mask"):
        return "return_debug_mask"
    if a.get("alibi_slopes") is not None:
        return "ALiBi slopes"
    if a.get("block_table") is not None:
        return "a paged KV cache (block_table)"
    q = tensors[0]
    if q.is_cuda and q.dtype not in (torch.float16, torch.bfloat16):  # (CPU tensors: the glue's tests)
        return f"dtype {q.dtype}"
    if any(t.device != q.device for t in tensors):
        return "tensors on different devices"
    if any(d % 8 or d > 256 for d in head_dims):
        return f"head dims {head_dims} (multiples of 8 up to 256)"
    return None


def _aten_window(side):
    """PyTorch's flash ops spell an unbounded side None or -1 (FlashAttention-2's convention)."""
    return ops.window_side(None if side is None or side < 0 else side)


def _args(a, head_dim):
    scale = a.get("scale")
    return (head_dim ** -0.5 if scale is None else float(scale), bool(a["is_causal"]),
            _aten_window(a.get("window_size_left")), _aten_window(a.get("window_size_right")), 0.0)


def _varlen(a):
    if a.get("cum_seq_q") is None:
        return None
    cu_q, cu_k = (a[n].to(torch.int32).contiguous() for n in ("cum_seq_q", "cum_seq_k"))
    used = a.get("seqused_k")
    used = None if used is None else used.to(torch.int32).contiguous()
    return cu_q, cu_k, used, None, int(a["max_q"]), int(a["max_k"])


def _forward(a, out=None):
    """out and lse of aten's flash forward: q, k, v (B, S, H, D), or (total, H, D) with cum_seq_q/k."""
    q, k, v = a["query"], a["key"], a["value"]
    varlen = _varlen(a)
    if out is None:
        out = _like(q, (*q.shape[:-1], v.shape[-1]))
    # varlen: (H, total); the library writes rows past the last sequence too (out 0, lse -inf).
    lse_shape = (q.shape[0], q.shape[2], q.shape[1]) if varlen is None else (q.shape[1], q.shape[0])
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    ops.run_forward(q, k, v, out, lse, _args(a, q.shape[-1]), varlen)
    return out, lse


def _backward(a, grad_out, q, k, v, out, lse, grads):
    """dq, dk, dv of aten's flash backward into grads, laid out like q, k, v (see _forward)."""
    ops.run_backward(grad_out, None, q, k, v, out, lse, *grads, _args(a, q.shape[-1]),
                     torch.are_deterministic_algorithms_enabled(), _varlen(a))


def _no_rng(q):
    """The rng state and offset outputs of a call without dropout."""
    return (torch.zeros((2,), dtype=torch.uint64, device=q.device),
            torch.zeros((), dtype=torch.uint64, device=q.device))


def _flash_forward(a):
    q, k, v = a["query"], a["key"], a["value"]
    why = _unsupported(a, (q, k, v), (q.shape[-1], v.shape[-1]))
    if why:
        return why
    out, lse = _forward(a)
    return (out, lse, *_no_rng(q), torch.empty(0, dtype=q.dtype, device=q.device))


def _flash_forward_inplace(a):
    q, k, v = a["query"], a["key"], a["value"]
    why = _unsupported(a, (q, k, v), (q.shape[-1], v.shape[-1]))
    if why:
        return why
    return _forward(a, out=a["out"])[1]


def _flash_backward(a):
    q, k, v = a["query"], a["key"], a["value"]
    why = _unsupported(a, (a["grad_out"], q, k, v, a["out"]), (q.shape[-1], v.shape[-1]))
    if why:
        return why
    grads = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)  # varlen padding rows: the library zeroes
    _backward(a, a["grad_out"], q, k, v, a["out"], a["logsumexp"], grads)
    return grads


def _sdpa_forward(a):
    """SDPA's flash op: (B, H, S, D) tensors, which flashcute reads as (B, S, H, D) views (no copies)."""
    q, k, v = a["query"], a["key"], a["value"]
    why = _unsupported(a, (q, k, v), (q.shape[-1], v.shape[-1]))
    if why:
        return why
    out = _like(q, (*q.shape[:-1], v.shape[-1]))
    flash = dict(a, query=q.transpose(1, 2), key=k.transpose(1, 2), value=v.transpose(1, 2), cum_seq_q=None)
    _, lse = _forward(flash, out=out.transpose(1, 2))
    return (out, lse, None, None, q.shape[2], k.shape[2], *_no_rng(q), torch.empty(0, dtype=q.dtype, device=q.device))


def _sdpa_backward(a):
    q, k, v = a["query"], a["key"], a["value"]
    why = _unsupported(a, (a["grad_out"], q, k, v, a["out"]), (q.shape[-1], v.shape[-1]))
    if why:
        return why
    grads = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    t = [x.transpose(1, 2) for x in (a["grad_out"], q, k, v, a["out"], *grads)]
    _backward(dict(a, cum_seq_q=None), *t[:5], a["logsumexp"], t[5:])
    return grads


_IMPLS = {_FORWARD: _flash_forward, _FORWARD_INPLACE: _flash_forward_inplace, _BACKWARD: _flash_backward,
          _SDPA_FORWARD: _sdpa_forward, _SDPA_BACKWARD: _sdpa_backward}


def _kernel(name, impl):
    """The CUDA kernel registered for aten::name: impl's result, or PyTorch's own kernel when impl declines (returns
    the reason as a string)."""
    if _CAN_FALL_BACK:
        original = torch.library.get_kernel(f"aten::{name}", "CUDA")

        def kernel(keyset, *args, **kwargs):
            result = impl(_bind(name, args, kwargs))
            return original.call_boxed(keyset, *args, **kwargs) if isinstance(result, str) else result
        return kernel

    def kernel(*args, **kwargs):
        result = impl(_bind(name, args, kwargs))
        if isinstance(result, str):
            raise NotImplementedError(f"flashcute.torch: aten::{name} with {result} is not supported, and this torch "
                                      "cannot hand the call back to its own kernel: flashcute.torch.deactivate()")
        return result
    return kernel


class _Handle:
    """The installed overrides; remove() gives the ops back to PyTorch's kernels."""

    def __init__(self):
        self.library = torch.library.Library("aten", "IMPL", "CUDA")  # noqa: TOR901
        for name, impl in _IMPLS.items():
            if hasattr(torch.ops.aten, name):
                extra = {"with_keyset": True} if _CAN_FALL_BACK else {}
                self.library.impl(name, _kernel(name, impl), "CUDA", **extra)

    def remove(self):
        if self.library is not None:
            destroy = getattr(self.library, "_destroy", None)
            if destroy is not None:
                destroy()
            self.library = None


def activate():
    """Route PyTorch's flash-attention ops to flashcute until deactivate()."""
    global _handle
    if _HAS_REGISTRY:
        _registry.activate_flash_attention_impl(NAME)
    elif _handle is None:
        _handle = _Handle()


def deactivate():
    """Give the flash-attention ops back to PyTorch (or to no custom implementation at all)."""
    global _handle
    if _HAS_REGISTRY:
        if _registry.current_flash_attention_impl() == NAME:
            _registry.restore_flash_attention_impl()
    elif _handle is not None:
        _handle.remove()
        _handle = None


def is_active():
    if _HAS_REGISTRY:
        return _registry.current_flash_attention_impl() == NAME
    return _handle is not None


@contextlib.contextmanager
def enabled():
    """flashcute as PyTorch's flash attention inside the block; whatever was active before comes back after it."""
    previous = _registry.current_flash_attention_impl() if _HAS_REGISTRY else None
    was_active = is_active()
    activate()
    try:
        yield
    finally:
        if not was_active:
            deactivate()
            if previous is not None:
                _registry.activate_flash_attention_impl(previous)


if _HAS_REGISTRY:
    _registry.register_flash_attention_impl(NAME, register_fn=_Handle)
