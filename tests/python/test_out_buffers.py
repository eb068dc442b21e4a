"""Caller buffers: flash_attn_func / flash_attn_varlen_func(out=, lse=) and flash_attn_backward(dq=, dk=, dv=) write
into the given tensors (any strides) the same values the allocating calls return, refuse wrong buffers by name, and
refuse autograd. Runs on the CPU (float64 reference) and, where there is a GPU, on it."""
import pytest

torch = pytest.importorskip("torch")

import flashcute  # noqa: E402
from flashcute import ops  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _inputs(device, dtype=None, b=2, sq=33, sk=47, h=4, hkv=2, d=64):
    dtype = dtype or (torch.bfloat16 if device == "cuda" else torch.float32)
    g = torch.Generator(device=device).manual_seed(5)
    return [torch.randn(b, s, n, d, device=device, dtype=dtype, generator=g)
            for s, n in ((sq, h), (sk, hkv), (sk, hkv))]


def _strided_like(t):
    """A non-contiguous buffer of t's shape (every other element of a wider tensor's last dimension)."""
    wide = torch.full((*t.shape[:-1], 2 * t.shape[-1]), float("nan"), dtype=t.dtype, device=t.device)
    return wide[..., ::2]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["both", "out", "lse", "strided"])
def test_forward_into_buffers(device, which):
    q, k, v = _inputs(device)
    ref_out, ref_lse = flashcute.flash_attn_func(q, k, v, causal=True)
    out = torch.full_like(ref_out, float("nan")) if which in ("both", "out") else None
    lse = torch.full_like(ref_lse, float("nan")) if which in ("both", "lse") else None
    if which == "strided":
        out, lse = _strided_like(ref_out), _strided_like(ref_lse)
    got_out, got_lse = flashcute.flash_attn_func(q, k, v, causal=True, out=out, lse=lse)
    if out is not None:
        assert got_out is out
    if lse is not None:
        assert got_lse is lse
    assert torch.equal(got_out, ref_out) and torch.equal(got_lse, ref_lse)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_into_buffers(device):
    q, k, v = _inputs(device)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = flashcute.flash_attn_func(*leaves, causal=True, deterministic=True)
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    ref = torch.autograd.grad((out, lse), leaves, (dout, dlse))
    buffers = [_strided_like(q), torch.empty_like(k), None]
    got = flashcute.flash_attn_backward(dout, q, k, v, out.detach(), lse.detach(), dlse, causal=True,
                                        deterministic=True, dq=buffers[0], dk=buffers[1], dv=buffers[2])
    assert got[0] is buffers[0] and got[1] is buffers[1]
    for name, a, b in zip(("dq", "dk", "dv"), got, ref):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_forward_into_buffers(device):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    g = torch.Generator(device=device).manual_seed(7)
    q, k, v = (torch.randn(70, 4, 64, device=device, dtype=dtype, generator=g) for _ in range(3))
    cu = torch.tensor([0, 30, 31, 60], dtype=torch.int32, device=device)  # rows 60..69 are padding
    ref_out, ref_lse = flashcute.flash_attn_varlen_func(q, k, v, cu, cu, causal=True)
    out, lse = torch.full_like(ref_out, float("nan")), torch.full_like(ref_lse, float("nan"))
    got = flashcute.flash_attn_varlen_func(q, k, v, cu, cu, causal=True, out=out, lse=lse)
    assert got[0] is out and got[1] is lse
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


@pytest.mark.parametrize("device", DEVICES)
def test_sink_into_buffers(device):
    """learnable_sink with out=/lse= (both entry points) and with flash_attn_backward's buffers, dsink= included."""
    q, k, v = _inputs(device)
    sink = torch.linspace(-1.0, 1.5, q.shape[2], device=device)
    ref_out, ref_lse = flashcute.flash_attn_func(q, k, v, causal=True, learnable_sink=sink)
    out, lse = _strided_like(ref_out), torch.full_like(ref_lse, float("nan"))
    got = flashcute.flash_attn_func(q, k, v, causal=True, learnable_sink=sink, out=out, lse=lse)
    assert got[0] is out and got[1] is lse
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)

    cu = torch.tensor([0, 20, 33], dtype=torch.int32, device=device)
    qv, kv, vv = (t[0] for t in (q, k, v))
    ref = flashcute.flash_attn_varlen_func(qv, kv[:33], vv[:33], cu, cu, causal=True, learnable_sink=sink)
    got = flashcute.flash_attn_varlen_func(qv, kv[:33], vv[:33], cu, cu, causal=True, learnable_sink=sink,
                                           out=torch.full_like(ref[0], float("nan")), lse=torch.empty_like(ref[1]))
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])

    leaves = [t.clone().requires_grad_() for t in (q, k, v, sink)]
    out, lse = flashcute.flash_attn_func(*leaves[:3], causal=True, deterministic=True, learnable_sink=leaves[3])
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    ref = torch.autograd.grad((out, lse), leaves, (dout, dlse))
    dsink = torch.full_like(sink, float("nan"))
    got = flashcute.flash_attn_backward(dout, q, k, v, out.detach(), lse.detach(), dlse, causal=True,
                                        deterministic=True, dq=_strided_like(q), learnable_sink=sink, dsink=dsink)
    assert len(got) == 4 and got[3] is dsink
    for name, a, b in zip(("dq", "dk", "dv", "dsink"), got, ref):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="dsink= is the learnable sink's gradient"):
        flashcute.flash_attn_backward(dout, q, k, v, out.detach(), lse.detach(), dsink=dsink)
    with pytest.raises(ValueError, match="dsink must have dtype"):
        flashcute.flash_attn_backward(dout, q, k, v, out.detach(), lse.detach(), learnable_sink=sink,
                                      dsink=dsink.double())


def test_buffers_are_checked_by_name():
    q, k, v = _inputs("cpu")
    out, lse = flashcute.flash_attn_func(q, k, v)
    with pytest.raises(ValueError, match="out must have shape"):
        flashcute.flash_attn_func(q, k, v, out=out[:, :5])
    with pytest.raises(ValueError, match="lse must have dtype"):
        flashcute.flash_attn_func(q, k, v, lse=lse.double())
    with pytest.raises(ValueError, match="dk must have shape"):
        flashcute.flash_attn_backward(torch.randn_like(out), q, k, v, out, lse, dk=torch.empty_like(q))


def test_buffers_refuse_autograd():
    q, k, v = (t.requires_grad_() for t in _inputs("cpu"))
    with pytest.raises(ValueError, match="autograd"):
        flashcute.flash_attn_func(q, k, v, out=torch.empty(q.shape[:3] + v.shape[3:]))
    with torch.no_grad():
        out, lse = flashcute.flash_attn_func(q, k, v, lse=torch.empty(q.shape[0], q.shape[2], q.shape[1]))
    assert out.shape == q.shape and lse.isfinite().all()


def test_opcheck():
    q, k, v = _inputs("cpu", b=1, sq=9, sk=11)
    out = torch.empty(*q.shape[:3], v.shape[3])
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1])
    args = (0.125, True, -1, 0, 0.0)
    torch.library.opcheck(ops.fwd_into, (q, k, v, out, lse, *args))
    ops.fwd_into(q, k, v, out, lse, *args)
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    torch.library.opcheck(ops.bwd_into, (torch.randn_like(out), None, q, k, v, out, lse, dq, dk, dv, *args, True, None,
                                         None))
    sink = torch.randn(q.shape[2])
    torch.library.opcheck(ops.fwd_into, (q, k, v, out, lse, *args, sink))
    torch.library.opcheck(ops.bwd_into, (torch.randn_like(out), None, q, k, v, out, lse, dq, dk, dv, *args, True, sink,
                                         torch.empty_like(sink)))
