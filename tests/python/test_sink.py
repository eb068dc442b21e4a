"""Learnable attention sinks (GPT-OSS): one logit per query head in every row's softmax denominator, forward and
backward (dsink), fixed length and varlen, against plain float64 PyTorch and finite differences. The GPU kernels do
not have sinks yet and refuse them."""
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


@pytest.mark.gpu
def test_gpu_refuses_sinks_by_name():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    q = torch.randn(1, 64, 2, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(flashcute.FlashCuteError, match="learnable_sink"):
        flashcute.flash_attn_func(q, q, q, learnable_sink=torch.zeros(2, device="cuda"))
