"""Learnable attention sinks (GPT-OSS): one logit per query head in every row's softmax denominator, forward and
backward (dsink), fixed length and varlen, against plain float64 PyTorch and finite differences; on the GPU (both
kernel families) against the float64 reference under the 2x rule."""
import pytest

torch = pytest.importorskip("torch")

import flashcute  # noqa: E402
from flashcute import ops  # noqa: E402


def _rand(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def plain(q, k, v, sink, causal=False):
    """float64 attention whose softmax denominator also holds exp(sink[h]); returns (out, lse)."""
    h = q.shape[2]
    kk, vv = (t.repeat_interleave(h // t.shape[2], dim=2) for t in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q, kk) * 0.25  # a scale float32 holds exactly (the C API takes float32)
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        i = torch.arange(sq)[:, None]
        s = s.masked_fill(torch.arange(sk)[None, :] > i + (sk - sq), float("-inf"))
    logits = torch.cat([s, sink[None, :, None, None].expand(*s.shape[:3], 1)], dim=-1)
    lse = torch.logsumexp(logits, -1)
    p = torch.exp(s - lse[..., None])
    return torch.einsum("bhqk,bkhd->bqhd", p, vv), lse


@pytest.mark.parametrize("causal", [False, True])
def test_forward_matches_plain_float64(causal):
    q, k, v = _rand(2, 7, 4, 8), _rand(2, 5, 2, 8, seed=1), _rand(2, 5, 2, 8, seed=2)
    sink = _rand(4, seed=3)
    out, lse = flashcute.flash_attn_func(q, k, v, softmax_scale=0.25, causal=causal, learnable_sink=sink)
    ref_out, ref_lse = plain(q, k, v, sink, causal)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-12, atol=1e-12)


def test_rows_without_keys_give_zero_and_the_sink():
    q, k, v = _rand(1, 6, 2, 8), _rand(1, 3, 2, 8, seed=1), _rand(1, 3, 2, 8, seed=2)
    sink = torch.tensor([0.5, -2.0], dtype=torch.float64)
    out, lse = flashcute.flash_attn_func(q, k, v, causal=True, learnable_sink=sink)  # rows 0..2 see no key
    assert torch.equal(out[:, :3], torch.zeros_like(out[:, :3]))
    assert torch.equal(lse[0, :, :3], sink[:, None].expand(2, 3))


def test_gradients_against_finite_differences():
    q, k, v = (t.requires_grad_() for t in (_rand(1, 5, 2, 4), _rand(1, 6, 1, 4, seed=1), _rand(1, 6, 1, 4, seed=2)))
    sink = _rand(2, seed=3).requires_grad_()

    def fn(q, k, v, sink):
        out, lse = flashcute.flash_attn_func(q, k, v, causal=True, window_size=(3, None), learnable_sink=sink)
        return out, lse

    assert torch.autograd.gradcheck(fn, (q, k, v, sink))


def test_varlen_matches_each_sequence():
    lengths = (4, 1, 6)
    cu = torch.tensor([0, 4, 5, 11], dtype=torch.int32)
    q, k, v = _rand(11, 4, 8), _rand(11, 2, 8, seed=1), _rand(11, 2, 8, seed=2)
    sink = _rand(4, seed=3).requires_grad_()
    out, lse = flashcute.flash_attn_varlen_func(q, k, v, cu, cu, causal=True, learnable_sink=sink)
    (out.square().sum() + lse.sum()).backward()
    dsink = sink.grad.clone()
    sink.grad = None
    total = 0
    for b, n in enumerate(lengths):
        lo = int(cu[b])
        o, l_ = flashcute.flash_attn_func(*(t[None, lo:lo + n] for t in (q, k, v)), causal=True,
                                          learnable_sink=sink)
        torch.testing.assert_close(out[lo:lo + n], o[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(lse[:, lo:lo + n], l_[0], rtol=1e-12, atol=1e-12)
        total = total + o.square().sum() + l_.sum()
    total.backward()
    torch.testing.assert_close(dsink, sink.grad, rtol=1e-10, atol=1e-12)


def test_sink_is_checked():
    q = _rand(1, 3, 4, 8)
    with pytest.raises(ValueError, match="learnable_sink must be a 1-D tensor of nheads = 4"):
        flashcute.flash_attn_func(q, q[:, :, :2], q[:, :, :2], learnable_sink=torch.zeros(2, dtype=torch.float64))


def test_opcheck():
    q, k, v = _rand(1, 4, 2, 8), _rand(1, 5, 1, 8, seed=1), _rand(1, 5, 1, 8, seed=2)
    sink = _rand(2, seed=3)
    args = (0.35, True, ops.WINDOW_UNBOUNDED, ops.WINDOW_UNBOUNDED, 0.0, False, sink)
    torch.library.opcheck(ops.fwd, (q, k, v, *args))
    out, lse = ops.fwd(q, k, v, *args)
    torch.library.opcheck(ops.bwd, (torch.randn_like(out), torch.randn_like(lse), q, k, v, out, lse, *args))


def _gpu_or_skip():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


def _reference(q, k, v, sink, dout, dlse, **kw):
    """float64 out, lse and gradients (q, k, v, sink) from the host reference."""
    q64, k64, v64, s64 = (t.detach().cpu().double().requires_grad_() for t in (q, k, v, sink))
    out, lse = flashcute.flash_attn_func(q64, k64, v64, learnable_sink=s64, **kw)
    grads = torch.autograd.grad((out, lse), (q64, k64, v64, s64), (dout.cpu().double(), dlse.cpu().double()))
    return out, lse, grads


def _plain_same_dtype(q, k, v, sink, dout, dlse, scale, causal):
    """Plain PyTorch attention with the sink on q's device: matmuls in q's dtype, softmax in float32 (as
    attn_ref's baseline), gradients by autograd. The error rule's baseline."""
    q, k, v, sink = (t.detach().requires_grad_() for t in (q, k, v, sink))
    h = q.shape[2]
    kk, vv = (t.repeat_interleave(h // t.shape[2], dim=2) for t in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q, kk).float() * scale
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        i = torch.arange(sq, device=q.device)[:, None]
        s = s.masked_fill(torch.arange(sk, device=q.device)[None, :] > i + (sk - sq), float("-inf"))
    logits = torch.cat([s, sink.float()[None, :, None, None].expand(*s.shape[:3], 1)], dim=-1)
    lse = torch.logsumexp(logits, -1)
    p = torch.exp(s - lse[..., None]).to(q.dtype)
    out = torch.einsum("bhqk,bkhd->bqhd", p, vv)
    grads = torch.autograd.grad((out, lse), (q, k, v, sink), (dout, dlse))
    return out, lse, grads


@pytest.mark.gpu
@pytest.mark.parametrize("arch", [None, 80, 120])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("hd", [64, 128, 256])
@pytest.mark.parametrize("causal,sq,sk", [(False, 128, 128), (True, 113, 17), (True, 17, 300), (False, 1, 77)])
def test_gpu_matches_reference(arch, dtype, hd, causal, sq, sk, monkeypatch):
    """Forward and backward with a sink on each kernel family (native: Hopper on an H200; FLASHCUTE_ARCH=80/120:
    the portable tiles), GQA, rows that see no key (causal with sq > sk), against float64 under the 2x rule."""
    _gpu_or_skip()
    from attn_ref import check, check_dsink
    if arch:
        monkeypatch.setenv("FLASHCUTE_ARCH", str(arch))
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(hd * 1000 + sq)
    q = torch.randn(2, sq, 4, hd, device="cuda", dtype=dt, generator=g)
    k, v = (torch.randn(2, sk, 2, hd, device="cuda", dtype=dt, generator=g) for _ in range(2))
    sink = (torch.randn(4, device="cuda", generator=g) * 2).requires_grad_()
    scale = hd ** -0.5
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out, lse = flashcute.flash_attn_func(qg, kg, vg, softmax_scale=scale, causal=causal, learnable_sink=sink)
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    grads = torch.autograd.grad((out, lse), (qg, kg, vg, sink), (dout, dlse))
    r_out, r_lse, r_grads = _reference(q, k, v, sink, dout, dlse, softmax_scale=scale, causal=causal)
    b_out, b_lse, b_grads = _plain_same_dtype(q, k, v, sink, dout, dlse, scale, causal)
    check(out, r_out, b_out, 1e-5, "out")
    check(lse, r_lse, b_lse, 1e-5, "lse")
    for name, ours, ref, base in zip(("dq", "dk", "dv"), grads, r_grads, b_grads):
        check(ours, ref, base, 1e-4, name)
    check_dsink(grads[3], out, lse, dout, dlse, sink, False)  # the 2x rule fails it by chance (attn_ref.check_dsink)
    if causal and sq > sk:  # the first sq - sk rows see no key: out 0, lse = the sink
        assert torch.equal(out[:, : sq - sk], torch.zeros_like(out[:, : sq - sk]))
        torch.testing.assert_close(lse[:, :, : sq - sk], sink.detach()[None, :, None].expand(2, 4, sq - sk))


@pytest.mark.gpu
def test_gpu_varlen_and_deterministic_dsink():
    """varlen with a sink on the GPU against each sequence alone and the reference's dsink; the deterministic
    backward's dsink bit-identical between runs."""
    _gpu_or_skip()
    cu = torch.tensor([0, 40, 41, 170], dtype=torch.int32, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(7)
    q, k, v = (torch.randn(170, 4, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    sink = torch.randn(4, device="cuda", generator=g).requires_grad_()
    dsinks = []
    for _ in range(2):
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        out, lse = flashcute.flash_attn_varlen_func(qg, kg, vg, cu, cu, causal=True, learnable_sink=sink,
                                                    deterministic=True)
        dout, dlse = (torch.ones_like(t) for t in (out, lse))
        dsinks.append(torch.autograd.grad((out, lse), (sink,), (dout, dlse))[0])
    assert torch.equal(dsinks[0], dsinks[1])
    for b in range(3):  # each sequence as its own fixed-length call: the same rows through the same kernel
        lo, hi = int(cu[b]), int(cu[b + 1])
        o, l_ = flashcute.flash_attn_func(*(t[None, lo:hi] for t in (q, k, v)), causal=True, learnable_sink=sink)
        torch.testing.assert_close(out[lo:hi], o[0])
        torch.testing.assert_close(lse[:, lo:hi], l_[0])
    q64, k64, v64, s64 = (t.detach().cpu().double().requires_grad_() for t in (q, k, v, sink))
    r_out, r_lse = flashcute.flash_attn_varlen_func(q64, k64, v64, cu.cpu(), cu.cpu(), causal=True,
                                                    learnable_sink=s64)
    (r_dsink,) = torch.autograd.grad((r_out, r_lse), (s64,), (torch.ones_like(r_out), torch.ones_like(r_lse)))
    torch.testing.assert_close(dsinks[0].double().cpu(), r_dsink, rtol=2e-2, atol=1e-2)
