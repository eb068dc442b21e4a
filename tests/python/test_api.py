"""Python API of flashcute: autograd, torch.library registration, errors; CPU (float64 reference) and GPU."""
import shutil

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import flashcute  # noqa: E402
from flashcute import _capi, flash_attn_func  # noqa: E402
from attn_ref import check, visible_mask  # noqa: E402

pytestmark = pytest.mark.usefixtures("flashcute_library")


def torch_attn(q, k, v, softmax_scale=None, causal=False, window_size=(None, None), softcap=0.0):
    """Plain PyTorch attention in q's dtype with flashcute's semantics (DESIGN.md 1); returns (out, lse)."""
    batch, seqlen_q, nheads, head_dim = q.shape
    seqlen_k, nheads_kv = k.shape[1], k.shape[2]
    scale = head_dim ** -0.5 if softmax_scale is None else softmax_scale
    k, v = (t.repeat_interleave(nheads // nheads_kv, dim=2) for t in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    visible = visible_mask(seqlen_q, seqlen_k, causal, window_size, q.device)
    empty = ~visible.any(-1)  # rows with no visible key: out 0, lse -inf, no gradient
    s = s.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(s.masked_fill(empty[:, None], 0), -1).masked_fill(empty, float("-inf"))
    p = torch.exp(s - lse.masked_fill(empty, 0)[..., None])
    return torch.einsum("bhqk,bkhd->bqhd", p.to(v.dtype), v), lse


def rand(batch, seqlen_q, seqlen_k, nheads, nheads_kv, head_dim, head_dim_v, dtype=torch.float64, device="cpu"):
    g = torch.Generator().manual_seed(0)
    shapes = [(batch, seqlen_q, nheads, head_dim), (batch, seqlen_k, nheads_kv, head_dim),
              (batch, seqlen_k, nheads_kv, head_dim_v)]
    return [torch.randn(s, generator=g, dtype=torch.float64).to(device, dtype).requires_grad_() for s in shapes]


def finite(lse):
    return torch.where(lse.isfinite(), lse, torch.zeros_like(lse))


def grads(fn, q, k, v, loss, **kw):
    out, lse = fn(q, k, v, **kw)
    dq, dk, dv = torch.autograd.grad(loss(out, lse), (q, k, v), materialize_grads=True)
    return [t.detach() for t in (out, lse, dq, dk, dv)]


def smoke_loss(out, lse):
    return out.float().square().mean() + 1e-3 * finite(lse).float().square().mean()


# (batch, seqlen_q, seqlen_k, nheads, nheads_kv, head_dim, head_dim_v), kwargs
CASES = {
    "plain": ((2, 5, 7, 2, 2, 4, 4), {}),
    "causal_sq_gt_sk": ((1, 7, 4, 2, 2, 4, 3), {"causal": True}),  # first 3 rows fully masked
    "causal_sq_lt_sk": ((1, 4, 7, 2, 2, 4, 4), {"causal": True}),
    "window": ((1, 6, 6, 2, 2, 4, 4), {"window_size": (2, 1)}),
    "window_causal": ((1, 6, 8, 2, 2, 4, 4), {"window_size": (1, None), "causal": True}),
    # negative sides are offsets (FlashAttention-4): keys 2..5 before the diagonal; the first rows see none
    "window_past_diagonal": ((1, 9, 9, 2, 2, 4, 4), {"window_size": (5, -2)}),
    "window_negative_left": ((1, 6, 9, 2, 2, 4, 4), {"window_size": (-1, 3)}),
    "window_empty": ((1, 5, 5, 2, 2, 4, 4), {"window_size": (-3, 1)}),  # narrower than one key: every row empty
    "softcap": ((1, 5, 5, 2, 2, 4, 4), {"softcap": 1.5, "softmax_scale": 1.25}),  # float32-exact: C takes floats
    "gqa": ((2, 5, 6, 4, 2, 4, 4), {"causal": True}),
}


@pytest.mark.parametrize("case", CASES)
def test_gradcheck(case):
    shape, kw = CASES[case]
    q, k, v = rand(*shape)
    assert torch.autograd.gradcheck(lambda q, k, v: (lambda o, l: (o, finite(l)))(*flash_attn_func(q, k, v, **kw)),
                                    (q, k, v))


@pytest.mark.parametrize("case", CASES)
def test_matches_torch_float64(case):
    shape, kw = CASES[case]
    q, k, v = rand(*shape)
    loss = lambda o, l: o.square().sum() + finite(l).square().sum()  # noqa: E731
    for ours, ref in zip(grads(flash_attn_func, q, k, v, loss, **kw), grads(torch_attn, q, k, v, loss, **kw)):
        torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)


def test_smoke_vs_sdpa():
    q, k, v = rand(1, 128, 128, 2, 2, 64, 64, dtype=torch.float16)
    out, lse, dq, dk, dv = grads(flash_attn_func, q, k, v, smoke_loss, causal=True)
    assert out.dtype == torch.float16 and lse.dtype == torch.float32 and dq.dtype == torch.float16
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out64 = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q64, k64, v64)), is_causal=True)
    out64 = out64.transpose(1, 2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q64, k64) * 64 ** -0.5
    lse64 = torch.logsumexp(scores.masked_fill(torch.ones(128, 128, dtype=torch.bool).triu(1), float("-inf")), -1)
    refs = [out64, lse64, *torch.autograd.grad(smoke_loss(out64, lse64), (q64, k64, v64))]
    for name, ours, ref in zip(["out", "lse", "dq", "dk", "dv"], [out, lse, dq, dk, dv], refs):
        scale = ref.abs().max().item()
        torch.testing.assert_close(ours.double(), ref.detach(), rtol=2e-3, atol=2e-3 * scale, msg=name)


@pytest.mark.parametrize("used", ["out", "lse"])
def test_one_output_unused(used):
    q, k, v = rand(1, 6, 5, 2, 1, 4, 4)
    loss = (lambda o, l: o.sum()) if used == "out" else (lambda o, l: l.sum())
    for ours, ref in zip(grads(flash_attn_func, q, k, v, loss), grads(torch_attn, q, k, v, loss)):
        torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16])
def test_fully_masked_rows(dtype):
    q, k, v = rand(1, 6, 3, 2, 2, 4, 4, dtype=dtype)
    out, lse, *dqkv = grads(flash_attn_func, q, k, v, lambda o, l: o.float().sum() + finite(l).sum(), causal=True)
    assert lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert (out[:, :3] == 0).all() and (lse[:, :, :3] == float("-inf")).all()
    assert out[:, 3:].abs().sum() > 0 and lse[:, :, 3:].isfinite().all()
    assert all(g.isfinite().all() for g in dqkv) and (dqkv[0][:, :3] == 0).all()


def test_strided_views():
    qkv = torch.randn(2, 9, 3, 4, 8, dtype=torch.float64)  # packed (B, S, 3, H, D): q, k, v are strided views
    q, k, v = qkv.unbind(2)
    ours = flash_attn_func(q, k, v, causal=True)
    ref = flash_attn_func(q.contiguous(), k.contiguous(), v.contiguous(), causal=True)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_opcheck():
    q, k, v = rand(1, 5, 6, 4, 2, 8, 4)
    torch.library.opcheck(torch.ops.flashcute.fwd, (q, k, v, 0.3, True, 2, -1, 0.0, False))
    q, k, v = detached(q, k, v)  # no double backward: bwd is checked without requires_grad
    out, lse = torch.ops.flashcute.fwd(q, k, v, 0.3, True, 2, -1, 0.0)
    args = (q, k, v, out, lse, 0.3, True, 2, -1, 0.0, False)
    for dlse in (None, torch.randn_like(lse)):
        torch.library.opcheck(torch.ops.flashcute.bwd, (torch.randn_like(out), dlse, *args))


def detached(q, k, v):
    return [t.detach() for t in (q, k, v)]


ERRORS = {
    "int32": (lambda q, k, v: (q.int(), k.int(), v.int()), "q dtype"),
    "dtype_mismatch": (lambda q, k, v: (q, k.float(), v), "k has dtype"),
    "head_dim_mismatch": (lambda q, k, v: (q, k[..., :2], v), "k head_dim"),
    "nheads_not_divisible": (lambda q, k, v: (q[:, :, :3], k, v), "nheads"),
    "three_d": (lambda q, k, v: (q[0], k, v), "q must be 4-D"),
    "seqlen_k_mismatch": (lambda q, k, v: (q, k, v[:, :2]), "v seqlen"),
}


@pytest.mark.parametrize("case", ERRORS)
def test_errors_name_the_argument(case):
    make, match = ERRORS[case]
    with pytest.raises(ValueError, match=match):
        flash_attn_func(*make(*detached(*rand(1, 4, 4, 4, 2, 4, 4))))


def test_c_library_errors_surface():
    q, k, v = detached(*rand(1, 4, 4, 2, 2, 8, 8))
    with pytest.raises(ValueError, match="^invalid argument: softcap"):  # validated by the C library
        flash_attn_func(q, k, v, softcap=-1.0)
    with pytest.raises(flashcute.FlashCuteError, match="^unsupported: ") as info:  # other statuses
        _capi.check(2)
    assert info.value.status == 2 and isinstance(info.value, RuntimeError)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_error_mixed_devices():
    q, k, v = detached(*rand(1, 4, 4, 2, 2, 64, 64, dtype=torch.float16))
    with pytest.raises(ValueError, match="k is on"):
        flash_attn_func(q.cuda(), k, v.cuda())


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph(backend):
    if not torch._dynamo.is_dynamo_supported():
        pytest.skip("torch.compile is not supported here")
    if backend == "inductor" and shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("inductor needs a C compiler")
    torch._dynamo.reset()
    loss = lambda o, l: o.square().sum() + finite(l).square().sum()  # noqa: E731

    def step(q, k, v):
        out, lse = flash_attn_func(q, k, v, causal=True, window_size=(3, None))
        return out, lse

    q, k, v = rand(2, 7, 5, 4, 2, 8, 8)
    compiled = grads(torch.compile(step, backend=backend, fullgraph=True), q, k, v, loss)
    for a, b in zip(compiled, grads(step, q, k, v, loss)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


# --- GPU: |ours - ref64| <= 2 |plain torch in the same dtype - ref64| + atol (max over elements) ---------------
GPU_CASES = {
    "smoke": ((1, 128, 128, 2, 2, 64, 64), {"causal": True}),
    "noncausal_odd": ((2, 113, 203, 4, 4, 64, 64), {}),
    "gqa_causal_sq_gt_sk": ((1, 203, 113, 4, 2, 128, 128), {"causal": True}),
    "window_softcap": ((2, 17, 1013, 2, 1, 128, 128), {"window_size": (64, 8), "softcap": 30.0}),
}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", GPU_CASES)
def test_gpu_vs_reference(case, dtype):
    shape, kw = GPU_CASES[case]
    q, k, v = rand(*shape, dtype=dtype, device="cuda")
    if case == "smoke":
        loss = smoke_loss
    else:  # random cotangents keep the gradients O(1), so that atol does not hide errors
        g = torch.Generator().manual_seed(1)
        dout = torch.randn(shape[0], shape[1], shape[3], shape[6], generator=g, dtype=torch.float64)
        dlse = torch.randn(shape[0], shape[3], shape[1], generator=g, dtype=torch.float64)
        loss = lambda o, l: (o.double() * dout.to(o.device)).sum() + (finite(l).double() * dlse.to(l.device)).sum()  # noqa: E731
    ours = grads(flash_attn_func, q, k, v, loss, **kw)
    ref = grads(flash_attn_func, *(t.detach().cpu().double().requires_grad_() for t in (q, k, v)), loss, **kw)
    plain = grads(torch_attn, q, k, v, loss, **kw)
    assert ours[0].dtype == dtype and ours[1].dtype == torch.float32 and ours[0].is_cuda
    for name, a, b, c, atol in zip(["out", "lse", "dq", "dk", "dv"], ours, ref, plain, [1e-5] * 2 + [1e-4] * 3):
        check(a, b, c, atol, name)


@pytest.mark.gpu
def test_gpu_strided_deterministic_and_masked_rows():
    qkv = torch.randn(2, 67, 3, 4, 64, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    q, k, v = qkv.unbind(2)
    runs = [grads(flash_attn_func, q, k, v, smoke_loss, deterministic=True) for _ in range(2)]
    for a, b in zip(*runs):
        assert torch.equal(a, b)
    contiguous = grads(flash_attn_func, *(t.detach().contiguous().requires_grad_() for t in (q, k, v)), smoke_loss)
    for a, b in zip(runs[0], contiguous):
        torch.testing.assert_close(a, b)
    q, k, v = rand(1, 40, 16, 2, 2, 64, 64, dtype=torch.float16, device="cuda")
    out, lse, *dqkv = grads(flash_attn_func, q, k, v, smoke_loss, causal=True)
    assert (out[:, :24] == 0).all() and (lse[:, :, :24] == float("-inf")).all()
    assert all(g.isfinite().all() for g in dqkv)


@pytest.mark.gpu
def test_direct_calls_give_the_ops_bits():
    # Where nothing but the computation would see it (eager, plain CUDA tensors, no autograd to record, no mode),
    # the functions call the ops' implementations without the dispatcher (flashcute.ops.call): the same bits as
    # the dispatched ops, forward and deterministic backward, fixed length and varlen.
    from torch.utils._python_dispatch import TorchDispatchMode
    from flashcute import flash_attn_varlen_func, ops

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 300, 4, 64, generator=g).to("cuda", torch.bfloat16) for _ in range(3))
    assert ops._plain_eager((q, k, v)) is False  # direct, nothing to record
    with Passthrough():
        assert ops._plain_eager((q, k, v)) is None  # dispatched
    assert ops._plain_eager((q.requires_grad_(), k, v)) is True  # direct, autograd records it
    q.requires_grad_(False)
    scale = 64 ** -0.5
    with torch.no_grad():
        out, lse = flash_attn_func(q, k, v, causal=True)
    ref = torch.ops.flashcute.fwd(q, k, v, scale, True, ops.WINDOW_UNBOUNDED, 0, 0.0)
    assert torch.equal(out, ref[0]) and torch.equal(lse, ref[1])

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = flash_attn_func(*leaves, causal=True, deterministic=True)
    assert type(out.grad_fn).__name__.startswith("Direct")  # the autograd.Function around the direct call
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    grads = torch.autograd.grad((out, lse), leaves, (dout, dlse))
    ref = torch.ops.flashcute.bwd(dout, dlse, q, k, v, out.detach(), lse.detach(), scale, True,
                                  ops.WINDOW_UNBOUNDED, 0, 0.0, True)
    for a, b in zip(grads, ref[:3]):
        assert torch.equal(a, b)

    cu = torch.tensor([0, 100, 300, 600], dtype=torch.int32, device="cuda")
    qv, kv, vv = (t.reshape(600, 4, 64) for t in (q, k, v))
    with torch.no_grad():
        out, lse = flash_attn_varlen_func(qv, kv, vv, cu, cu, max_seqlen_q=300, max_seqlen_k=300, causal=True)
    ref = torch.ops.flashcute.varlen_fwd(qv, kv, vv, cu, cu, None, None, 300, 300, scale, True,
                                         ops.WINDOW_UNBOUNDED, 0, 0.0)
    assert torch.equal(out, ref[0]) and torch.equal(lse, ref[1])
    # With autograd: the direct call's autograd.Function and the op's registered autograd, the same gradients.
    grads = []
    for fn in (lambda *t: flash_attn_varlen_func(*t, cu, cu, max_seqlen_q=300, max_seqlen_k=300, causal=True,
                                                 deterministic=True),
               lambda *t: torch.ops.flashcute.varlen_fwd(*t, cu, cu, None, None, 300, 300, scale, True,
                                                         ops.WINDOW_UNBOUNDED, 0, 0.0, True)):
        leaves = [t.clone().requires_grad_() for t in (qv, kv, vv)]
        out, lse = fn(*leaves)
        grads.append(torch.autograd.grad((out, lse), leaves, (torch.ones_like(out), torch.ones_like(lse))))
    for a, b in zip(*grads):
        assert torch.equal(a, b)
