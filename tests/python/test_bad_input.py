"""Bad and edge-case input through the Python API and the C API: each gets a named error or a documented result,
never a crash, an abort or an uninitialised output. CPU cases run in CI; GPU cases where there is a device."""
import ctypes
import math

import pytest

torch = pytest.importorskip("torch")

from flashcute import _capi, flash_attn_func, flash_attn_varlen_func  # noqa: E402

U = _capi.WINDOW_UNBOUNDED

pytestmark = pytest.mark.usefixtures("flashcute_library")

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def qkv(b=1, sq=5, sk=7, h=2, hkv=2, d=8, dtype=torch.float64, device="cpu", grad=False):
    g = torch.Generator().manual_seed(b * 100 + sq * 10 + sk)
    shapes = ((b, sq, h, d), (b, sk, hkv, d), (b, sk, hkv, d))
    return [torch.randn(s, generator=g, dtype=torch.float64).to(device, dtype).requires_grad_(grad) for s in shapes]


def dtype_of(device):
    return torch.float64 if device == "cpu" else torch.bfloat16


def hd(device):
    return 8 if device == "cpu" else 64


# --- scalar arguments -------------------------------------------------------------------------------------------

SCALARS = {
    "rank0_q": (lambda q, k, v: (torch.tensor(1.0), k, v), {}, "q must be a tensor with a head_dim"),
    "not_a_tensor": (lambda q, k, v: (q.tolist(), k, v), {}, "q must be a tensor"),
    "softcap_underflows": (lambda q, k, v: (q, k, v), {"softcap": 1e-50}, "softcap = 1e-50 is not a finite float32"),
    "softcap_overflows": (lambda q, k, v: (q, k, v), {"softcap": 1e300}, "softcap"),
    "softcap_nan": (lambda q, k, v: (q, k, v), {"softcap": math.nan}, "softcap"),
    "scale_string": (lambda q, k, v: (q, k, v), {"softmax_scale": "1"}, "softmax_scale must be a real number"),
    "scale_underflows": (lambda q, k, v: (q, k, v), {"softmax_scale": 1e-60}, "softmax_scale"),
    "window_fraction": (lambda q, k, v: (q, k, v), {"window_size": (2.7, 1.2)}, "window_size entries must be integers"),
    "window_bool": (lambda q, k, v: (q, k, v), {"window_size": (True, None)}, "window_size entries"),
    "window_not_pair": (lambda q, k, v: (q, k, v), {"window_size": 3}, "window_size must be a"),
    "causal_string": (lambda q, k, v: (q, k, v), {"causal": "no"}, "causal must be a bool"),
    "causal_two": (lambda q, k, v: (q, k, v), {"causal": 2}, "causal must be a bool"),
    "deterministic_none": (lambda q, k, v: (q, k, v), {"deterministic": None}, "deterministic must be a bool"),
}


@pytest.mark.parametrize("case", SCALARS)
def test_scalar_arguments_are_checked(case):
    make, kw, match = SCALARS[case]
    with pytest.raises(ValueError, match=match):
        flash_attn_func(*make(*qkv()), **kw)


def test_head_dim_zero_is_named_not_a_division_error():
    q, k, v = qkv(d=0)
    with pytest.raises(ValueError, match="head_dim must be >= 1"):
        flash_attn_func(q, k, v)
    with pytest.raises(ValueError, match="head_dim"):
        flash_attn_func(q, k, v, softmax_scale=1.0)


def test_valid_scalar_spellings_still_work():
    q, k, v = qkv()
    ref = flash_attn_func(q, k, v, causal=True, window_size=(3, None))
    for kw in ({"causal": 1, "window_size": (3, -1)}, {"causal": True, "window_size": [3, None]}):
        for a, b in zip(flash_attn_func(q, k, v, **kw), ref):
            assert torch.equal(a, b)


# --- sizes: the real op and the fake one refuse the same things ---------------------------------------------------

def test_sizes_beyond_the_limits_are_refused_before_any_copy():
    # A stride-0 view of an enormous shape: refused by the size checks, before any float64 copy is made.
    q = torch.zeros(1, 1, 1, 8, dtype=torch.float64).expand(1, 2**31, 1, 8)
    k = torch.zeros(1, 1, 1, 8, dtype=torch.float64).expand(1, 4, 1, 8)
    with pytest.raises(ValueError, match="seqlen_q must fit in int32"):
        flash_attn_func(q, k, k)
    q = torch.zeros(1, 1, 1, 8, dtype=torch.float64).expand(1, 2**29, 1, 8)
    k = torch.zeros(1, 1, 1, 8, dtype=torch.float64).expand(1, 2**29, 1, 8)
    with pytest.raises(ValueError, match="seqlen_q \\+ seqlen_k must be below 2\\^30"):
        flash_attn_func(q, k, k)


def test_broadcast_inputs_are_not_materialised():
    # 2^22 keys, all the same: the float64 reference sees the stride-0 view (a few bytes), not 256 MB of copies.
    q = torch.randn(1, 2, 1, 8, dtype=torch.float64)
    k = torch.randn(1, 1, 1, 8, dtype=torch.float64).expand(1, 2**22, 1, 8)
    v = torch.randn(1, 1, 1, 8, dtype=torch.float64).expand(1, 2**22, 1, 8)
    out, lse = flash_attn_func(q, k, v)
    torch.testing.assert_close(out, v[:, :1].expand_as(out), rtol=1e-7, atol=1e-7)  # 2^22 sums in double
    scores = (q * k[:, :1]).sum(-1).transpose(1, 2) * 8 ** -0.5  # (1, 1, 2)
    torch.testing.assert_close(lse, scores + 22 * math.log(2), rtol=1e-7, atol=1e-7)


FAKE = {
    "seqlen_beyond_int32": (lambda: (torch.empty(1, 2**31, 1, 8, device="meta"), torch.empty(1, 4, 1, 8, device="meta")),
                            "seqlen_q must fit in int32"),
    "heads_not_divisible": (lambda: (torch.empty(1, 4, 3, 8, device="meta"), torch.empty(1, 4, 2, 8, device="meta")),
                            "not divisible"),
}


@pytest.mark.parametrize("case", FAKE)
def test_fake_implementation_refuses_what_the_op_refuses(case):
    make, match = FAKE[case]
    q, k = make()
    with pytest.raises(ValueError, match=match):
        torch.ops.flashcute.fwd(q, k, k, 1.0, False, U, U, 0.0)


@pytest.mark.gpu
def test_fake_cuda_tensors_follow_the_gpu_rules():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        for shape, match in (((1, 4, 2, 300), "multiple of 8 and at most 256"), ((70000, 4, 2, 64), "batch must be")):
            q = torch.empty(shape, device="cuda", dtype=torch.bfloat16)
            with pytest.raises(ValueError, match=match):
                torch.ops.flashcute.fwd(q, q, q, 1.0, False, U, U, 0.0)
        q = torch.empty(0, 4, 2, 64, device="cuda", dtype=torch.bfloat16)  # batch 0 is valid
        out, lse = torch.ops.flashcute.fwd(q, q, q, 1.0, False, U, U, 0.0)
        assert out.shape == (0, 4, 2, 64) and lse.shape == (0, 2, 4)


# --- empty inputs -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("b,sq,sk", [(0, 5, 7), (2, 0, 7), (2, 5, 0), (2, 0, 0)])
def test_empty_inputs(device, b, sq, sk):
    q, k, v = qkv(b, sq, sk, d=hd(device), dtype=dtype_of(device), device=device, grad=True)
    out, lse = flash_attn_func(q, k, v, causal=True)
    assert out.shape == (b, sq, 2, hd(device)) and lse.shape == (b, 2, sq)
    assert (out == 0).all() and (lse == -math.inf).all()  # no keys (or no rows): out 0, lse -inf
    dq, dk, dv = torch.autograd.grad((out.float().sum() + lse.float().clamp(min=-1).sum()), (q, k, v),
                                     allow_unused=True, materialize_grads=True)
    assert dq.shape == q.shape and dk.shape == k.shape and (dq == 0).all() and (dk == 0).all() and (dv == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_with_empty_sequences_and_an_empty_batch(device):
    dt, d = dtype_of(device), hd(device)
    q, k, v = (torch.randn(n, 2, d, dtype=dt, device=device, requires_grad=True) for n in (6, 9, 9))
    cu_q = torch.tensor([0, 0, 6, 6], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 4, 4, 9], dtype=torch.int32, device=device)
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k)
    assert (out == 0).all() and (lse == -math.inf).all()  # sequence 1 has queries but no keys
    dq, dk, dv = torch.autograd.grad(out.float().sum(), (q, k, v))
    assert (dq == 0).all() and (dk == 0).all() and (dv == 0).all()
    none = torch.zeros(1, dtype=torch.int32, device=device)  # batch 0
    out, lse = flash_attn_varlen_func(q[:0], k[:0], v[:0], none, none)
    assert out.shape == (0, 2, d) and lse.shape == (2, 0)


# --- varlen offsets -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("given", [False, True])
def test_varlen_padding_rows_are_defined(device, given):
    # cu_seqlens[-1] below the row count: the rows past it belong to no sequence: out 0, lse -inf, gradients 0.
    dt, d = dtype_of(device), hd(device)
    q, k, v = (torch.randn(12, 2, d, dtype=dt, device=device, requires_grad=True) for _ in range(3))
    cu = torch.tensor([0, 3, 8], dtype=torch.int32, device=device)
    maxima = {"max_seqlen_q": 5, "max_seqlen_k": 5} if given else {}
    for _ in range(3):  # fresh allocations each time: nothing left over from a previous call can pass
        out, lse = flash_attn_varlen_func(q, k, v, cu, cu, causal=True, **maxima)
        assert (out[8:] == 0).all() and (lse[:, 8:] == -math.inf).all() and out[:8].isfinite().all()
        dq, dk, dv = torch.autograd.grad((out.float() ** 2).sum(), (q, k, v))
        assert (dq[8:] == 0).all() and (dk[8:] == 0).all() and (dv[8:] == 0).all() and dq[:8].abs().sum() > 0


def test_varlen_max_seqlen_arguments_are_checked():
    q, k, v = (torch.randn(8, 2, 8, dtype=torch.float64) for _ in range(3))
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="given together"):
        flash_attn_varlen_func(q, k, v, cu, cu, max_seqlen_q=5)
    with pytest.raises(ValueError, match="max_seqlen_k must be a non-negative integer"):
        flash_attn_varlen_func(q, k, v, cu, cu, max_seqlen_q=5, max_seqlen_k=-2)
    with pytest.raises(ValueError, match="seqlen_q must fit in int32"):
        flash_attn_varlen_func(q, k, v, cu, cu, max_seqlen_q=2**31, max_seqlen_k=5)


def test_varlen_given_maxima_match_the_checked_path():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(n, 4, 8, generator=g, dtype=torch.float64) for n in (9, 13, 13))
    cu_q, cu_k = torch.tensor([0, 2, 9], dtype=torch.int32), torch.tensor([0, 6, 13], dtype=torch.int32)
    ref = flash_attn_varlen_func(q, k, v, cu_q, cu_k, causal=True)
    ours = flash_attn_varlen_func(q, k, v, cu_q, cu_k, causal=True, max_seqlen_q=7, max_seqlen_k=7)
    for a, b in zip(ours, ref):
        assert torch.equal(a, b)


# --- the C API through ctypes: aliasing outputs, no crash on NULL -------------------------------------------------

def test_c_api_null_params_do_not_crash():
    lib = _capi.lib()
    lib.flashcute_fwd_params_init(None)
    lib.flashcute_bwd_params_init(None)
    lib.flashcute_fwd_params_set_contiguous_strides(None)
    assert lib.flashcute_reference_fwd(None) == _capi.ERROR_INVALID_ARGUMENT
    assert "params is NULL" in _capi.lib().flashcute_last_error().decode()


def _reference_params(out_of):
    q, k, v = (torch.randn(1, 5, 2, 8, dtype=torch.float64) for _ in range(3))
    out, lse = out_of(q, k, v)
    p = _capi.fwd_params()
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
        setattr(p, name, t.data_ptr())
        setattr(p, f"{name}_batch_stride", t.stride(0))
        setattr(p, f"{name}_row_stride", t.stride(1))
        setattr(p, f"{name}_head_stride", t.stride(2))
    p.lse, p.lse_batch_stride, p.lse_head_stride = lse.data_ptr(), lse.stride(0), lse.stride(1)
    p.batch, p.seqlen_q, p.seqlen_k, p.nheads, p.nheads_kv, p.head_dim, p.head_dim_v = 1, 5, 5, 2, 2, 8, 8
    p.dtype, p.softmax_scale = _capi.FLOAT64, 0.3
    return p, (q, k, v, out, lse)


ALIASES = {
    "out_is_k": (lambda q, k, v: (k, torch.empty(1, 2, 5, dtype=torch.float64)), "out overlaps the input k"),
    "zero_out_stride": (lambda q, k, v: (torch.empty(1, 1, 1, 8, dtype=torch.float64).expand(1, 5, 2, 8),
                                         torch.empty(1, 2, 5, dtype=torch.float64)), "out strides"),
    "short_lse_stride": (lambda q, k, v: (torch.empty_like(q), torch.empty(1, 2, 5, dtype=torch.float64)
                                          .as_strided((1, 2, 5), (10, 3, 1))), "lse strides"),
}


@pytest.mark.parametrize("case", ALIASES)
def test_c_api_refuses_outputs_that_alias(case):
    make, match = ALIASES[case]
    p, keep = _reference_params(make)
    with pytest.raises(ValueError, match=match):
        _capi.check(_capi.lib().flashcute_reference_fwd(ctypes.byref(p)))
    del keep


# --- size-1 dimensions ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_size_one_dimensions_may_have_any_stride(device):
    # Decode-like: one query row; PyTorch leaves the strides of size-1 dims arbitrary (here the seqlen stride is 1).
    dt, d = dtype_of(device), hd(device)
    sk = 4096 if device == "cuda" else 33
    def odd(t):  # the same elements, with strides 1 on the size-1 batch and seqlen dims
        return t.as_strided(t.shape, (1, 1, t.stride(2), 1))
    q = odd(torch.randn(1, 1, 32, d, dtype=dt, device=device)).requires_grad_()
    k, v = (torch.randn(1, sk, 4, d, dtype=dt, device=device, requires_grad=True) for _ in range(2))
    out, lse = flash_attn_func(q, k, v, causal=True)
    dout = odd(torch.randn(1, 1, 32, d, dtype=dt, device=device))
    assert dout.stride(1) == 1
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    ref = flash_attn_func(*(t.detach().contiguous().requires_grad_() for t in (q, k, v)), causal=True)
    torch.testing.assert_close(out, ref[0])
    assert all(g.isfinite().all() for g in (dq, dk, dv))
