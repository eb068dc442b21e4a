"""flashcute.torch, flashcute as PyTorch's flash attention. On the CPU: activation and restoring, and the glue (argument
binding, layouts, the outputs each aten op returns, their strides against PyTorch's meta functions) with the kernel
launch replaced by the float64 reference. On the GPU: SDPA's flash backend and varlen_attn give flashcute's own
functions' bits, forward and backward."""
import inspect
import math

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import flashcute  # noqa: E402
import flashcute.torch as provider  # noqa: E402
from flashcute import ops  # noqa: E402

pytestmark = pytest.mark.usefixtures("flashcute_library")


def test_activate_and_restore():
    assert not provider.is_active()
    with provider.enabled():
        assert provider.is_active()
        if provider._HAS_REGISTRY:
            assert torch.nn.attention.current_flash_attention_impl() == provider.NAME
            assert provider.NAME in torch.nn.attention.list_flash_attention_impls()
    assert not provider.is_active()
    provider.activate()
    provider.activate()  # twice is fine
    provider.deactivate()
    provider.deactivate()
    assert not provider.is_active()


def test_activate_without_the_registry(monkeypatch):
    # Older torch has no flash-attention registry: the overrides go in through torch.library directly.
    monkeypatch.setattr(provider, "_HAS_REGISTRY", False)
    with provider.enabled():
        assert provider.is_active() and provider._handle is not None
    assert not provider.is_active() and provider._handle is None


def _reference_launches(monkeypatch):
    """run_forward/run_backward computed by the float64 reference on CPU tensors, into the given buffers."""
    def forward(q, k, v, out, lse, args, varlen=None):
        if varlen is None:
            o, l_ = ops.fwd(q, k, v, *args)
        else:
            o, l_ = ops.varlen_fwd(q, k, v, *varlen, *args)
        out.copy_(o)
        lse.copy_(l_)

    def backward(dout, dlse, q, k, v, out, lse, dq, dk, dv, args, deterministic, varlen=None):
        if varlen is None:
            grads = ops.bwd(dout, dlse, q, k, v, out, lse, *args, deterministic)[:3]
        else:
            grads = ops.varlen_bwd(dout, dlse, q, k, v, out, lse, *varlen, *args, deterministic)
        for dst, src in zip((dq, dk, dv), grads):
            dst.copy_(src)

    monkeypatch.setattr(ops, "run_forward", forward)
    monkeypatch.setattr(ops, "run_backward", backward)


def _meta(t):
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def test_sdpa_glue_matches_math_attention(monkeypatch):
    _reference_launches(monkeypatch)
    g = torch.Generator().manual_seed(0)
    # (B, H, S, D) as SDPA passes them, q non-contiguous the way a (B, S, H, D) projection gives it.
    q = torch.randn(2, 9, 4, 16, generator=g, dtype=torch.float64).transpose(1, 2)
    k, v = (torch.randn(2, 4, 9, 16, generator=g, dtype=torch.float64) for _ in range(2))
    name = provider._SDPA_FORWARD
    result = provider._sdpa_forward(provider._bind(name, (q, k, v, 0.0, True, False), {"scale": 0.25}))
    out, lse = result[0], result[1]
    assert len(result) == 9 and result[4] == 9 and result[5] == 9
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    scores = (q @ k.transpose(-1, -2) * 0.25).masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1), -math.inf)
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, -1), rtol=1e-6, atol=1e-6)
    meta = getattr(torch.ops.aten, name).default(_meta(q), _meta(k), _meta(v), 0.0, True, False, scale=0.25)
    assert out.stride() == meta[0].stride() and lse.shape == meta[1].shape

    dout = torch.randn(out.shape, generator=g, dtype=torch.float64)
    name = provider._SDPA_BACKWARD
    args = (dout, q, k, v, out, lse, None, None, 9, 9, 0.0, True, *result[6:8])
    dq, dk, dv = provider._sdpa_backward(provider._bind(name, args, {"scale": 0.25}))
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(F.scaled_dot_product_attention(*leaves, is_causal=True, scale=0.25), leaves, dout)
    for a, b in zip((dq, dk, dv), want):  # lse went through float32, as the aten op's lse does
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert dq.stride() == q.stride()


def test_varlen_glue_matches_flashcute(monkeypatch):
    _reference_launches(monkeypatch)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(n, 4, 8, generator=g, dtype=torch.float64) for n in (11, 13, 13))
    cu_q = torch.tensor([0, 5, 9], dtype=torch.int32)  # two padding rows after the last sequence
    cu_k = torch.tensor([0, 6, 13], dtype=torch.int32)
    args = (q, k, v, cu_q, cu_k, 5, 7, 0.0, True, False)
    out, lse, *_ = provider._flash_forward(provider._bind(provider._FORWARD, args, {"window_size_left": 2}))
    want = flashcute.flash_attn_varlen_func(q, k, v, cu_q, cu_k, causal=True, window_size=(2, None))
    assert torch.equal(out, want[0]) and torch.equal(lse, want[1].float())  # lse is float32, as aten's
    assert (out[9:] == 0).all() and (lse[:, 9:] == -math.inf).all()
    # An op the provider does not serve declines with a reason (PyTorch's kernel takes it on the GPU).
    why = provider._flash_forward(provider._bind(provider._FORWARD, (*args[:7], 0.1, True, False), {}))
    assert why == "dropout"


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("gqa", [False, True])
def test_sdpa_gives_flashcute_bits(causal, gqa):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    g = torch.Generator(device="cuda").manual_seed(2)
    hkv = 2 if gqa else 8
    q = torch.randn(2, 8, 777, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(2, hkv, 777, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    dout = torch.randn_like(q)
    torch.use_deterministic_algorithms(True, warn_only=True)  # the default backward adds dq with float atomics
    try:
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        with provider.enabled(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = F.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=gqa)
            grads = torch.autograd.grad(out, leaves, dout)
        mine = [t.transpose(1, 2).clone().requires_grad_() for t in (q, k, v)]
        ref, _ = flashcute.flash_attn_func(*mine, causal=causal, deterministic=True)
        ref_grads = torch.autograd.grad(ref, mine, dout.transpose(1, 2))
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.equal(out, ref.transpose(1, 2))
    for name, a, b in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert torch.equal(a, b.transpose(1, 2)), name


@pytest.mark.gpu
def test_varlen_attn_gives_flashcute_bits():  # forward and backward
    varlen = pytest.importorskip("torch.nn.attention.varlen")
    g = torch.Generator(device="cuda").manual_seed(3)
    lengths = (300, 17, 1, 700)
    cu = torch.tensor([0, 300, 317, 318, 1018], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(sum(lengths), 8, 64, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
    # Causal is is_causal=True in some torch releases and window_size=(-1, 0) in others.
    causal = ({"is_causal": True} if "is_causal" in inspect.signature(varlen.varlen_attn).parameters
              else {"window_size": (-1, 0)})
    dout = torch.randn(q.shape, device="cuda", dtype=torch.float16, generator=g)
    torch.use_deterministic_algorithms(True, warn_only=True)  # both sides then take the bit-identical backward
    try:
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        with provider.enabled():
            out = varlen.varlen_attn(*leaves, cu, cu, max(lengths), max(lengths), **causal)
            out = out[0] if isinstance(out, tuple) else out
            grads = torch.autograd.grad(out, leaves, dout)
        mine = [t.clone().requires_grad_() for t in (q, k, v)]
        ref, _ = flashcute.flash_attn_varlen_func(*mine, cu, cu, causal=True, max_seqlen_q=700, max_seqlen_k=700,
                                                  deterministic=True)
        ref_grads = torch.autograd.grad(ref, mine, dout)
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.equal(out, ref)
    for name, a, b in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert torch.equal(a, b), name


@pytest.mark.gpu
def test_unserved_calls_go_to_pytorch_or_raise():
    q = torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.float16)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with provider.enabled(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        if provider._CAN_FALL_BACK:
            out = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
            assert out.shape == q.shape and out.isfinite().all()
        else:
            with pytest.raises(NotImplementedError, match="dropout"):
                F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
