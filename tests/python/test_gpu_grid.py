"""The GPU correctness grid: every dtype x head dim x feature x seqlen pair, against a float64 reference, with the
error rule |ours - ref64| <= 2 * |plain torch attention in the same dtype - ref64| + atol.

Also run under FLASHCUTE_ARCH=80, 86, 89, 120 (other arch profiles' tiles on this GPU). Skipped without CUDA.
"""
import contextlib
import math
import os
import threading
import zlib

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import flashcute  # noqa: E402
from attn_ref import backward, check, forward  # noqa: E402

HEAD_DIMS = (64, 96, 128, 192, 256)
DTYPES = (torch.float16, torch.bfloat16)
# (name, nheads, nheads_kv, causal, window (left, right), softcap)
FEATURES = {
    "plain": (2, 2, False, (None, None), 0.0),
    "causal": (2, 2, True, (None, None), 0.0),
    "window": (2, 2, False, (37, 11), 0.0),
    "window_past_diagonal": (2, 2, False, (50, -7), 0.0),  # negative right: keys at least 7 before the diagonal
    "softcap": (2, 2, True, (None, None), 7.5),
    "gqa4": (8, 2, False, (None, None), 0.0),
    "mqa": (4, 1, True, (64, None), 0.0),
}
# q and k lengths drawn separately from {1, 17, 113, 128, 1013, 4096}.
SEQ_PAIRS = [(1, 1), (17, 113), (113, 17), (128, 128), (1013, 1013), (4096, 1013), (113, 4096), (1, 1013)]
FAST_PAIRS = [(17, 113), (113, 17), (128, 128), (1013, 1013)]


@contextlib.contextmanager
def forced_env(name, value):
    """The environment variable `name` set to value while the block runs (the library reads it per call); a falsy
    value leaves it as it is."""
    old = os.environ.get(name)
    if value:
        os.environ[name] = str(value)
    try:
        yield
    finally:
        if value:
            if old is None:
                os.environ.pop(name)
            else:
                os.environ[name] = old


def forced_arch(arch):
    return forced_env("FLASHCUTE_ARCH", arch)


def stable_seed(*parts):
    # The same inputs on every run (Python's hash() of strings changes between processes).
    return zlib.crc32(repr(parts).encode())


def dims_of(hd):
    """(head_dim, head_dim_v) of a grid head dim: an int, or a pair where V's differs."""
    return hd if isinstance(hd, tuple) else (hd, hd)


def make_inputs(dtype, hd, feature, sq, sk, seed, batch=1, requires_grad=False):
    h, hkv = FEATURES[feature][:2]
    d, dv = dims_of(hd)
    torch.manual_seed(seed % (2**31))
    shapes = ((batch, sq, h, d), (batch, sk, hkv, d), (batch, sk, hkv, dv))
    return [torch.randn(s, device="cuda", dtype=dtype, requires_grad=requires_grad) for s in shapes]


def poison_allocator(nbytes):
    # flash_attn_func allocates its outputs with torch.empty; filling and freeing a block first makes any
    # element the kernel fails to write show up as NaN.
    torch.empty(nbytes // 4 + 1024, dtype=torch.float32, device="cuda").fill_(float("nan"))


def check_forward(q, k, v, out, lse, scale, causal, window, softcap):
    """out and lse against the float64 reference under the error rule; empty rows give out = 0."""
    ref_o, ref_lse = forward(q, k, v, scale, causal, window, softcap, torch.float64)
    base_o, base_lse = forward(q, k, v, scale, causal, window, softcap, q.dtype)
    check(out, ref_o, base_o, 1e-5, "out")
    check(lse, ref_lse, base_lse, 1e-5, "lse")
    empty = torch.isinf(ref_lse)
    if empty.any():
        assert (out.transpose(1, 2)[empty] == 0).all(), "rows with no visible key must give out = 0"


def run_case(dtype, hd, feature, sq, sk, arch=None, batch=1):
    _, _, causal, window, softcap = FEATURES[feature]
    q, k, v = make_inputs(dtype, hd, feature, sq, sk, stable_seed(dtype, hd, feature, sq, sk, arch), batch)
    scale = 1.0 / math.sqrt(dims_of(hd)[0])
    with forced_arch(arch):
        poison_allocator(q.numel() * 2 + batch * q.shape[2] * sq * 4)
        out, lse = flashcute.flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, window_size=window,
                                             softcap=softcap)
        torch.cuda.synchronize()
    check_forward(q, k, v, out, lse, scale, causal, window, softcap)


def run_backward_case(dtype, hd, feature, sq, sk, with_dlse, arch=None, deterministic=False):
    _, _, causal, window, softcap = FEATURES[feature]
    q, k, v = make_inputs(dtype, hd, feature, sq, sk, stable_seed(dtype, hd, feature, sq, sk, arch, 1),
                          requires_grad=True)
    scale = 1.0 / math.sqrt(dims_of(hd)[0])
    with forced_arch(arch):
        out, lse = flashcute.flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, window_size=window,
                                             softcap=softcap, deterministic=deterministic)
        dout = torch.randn_like(out)
        dlse = torch.randn_like(lse) if with_dlse else None
        poison_allocator(3 * q.numel() * 2)
        outs, grads = ([out, lse], [dout, dlse]) if with_dlse else ([out], [dout])
        dq, dk, dv = torch.autograd.grad(outs, (q, k, v), grads)
        torch.cuda.synchronize()
    q64, k64, v64 = (t.detach().double() for t in (q, k, v))
    o64, lse64 = forward(q64, k64, v64, scale, causal, window, softcap, torch.float64)
    ref = backward(q64, k64, v64, o64, lse64, dout.double(), None if dlse is None else dlse.double(), scale,
                   causal, window, softcap, torch.float64)
    ob, lseb = forward(q.detach(), k.detach(), v.detach(), scale, causal, window, softcap, dtype)
    base = backward(q.detach(), k.detach(), v.detach(), ob, lseb, dout, dlse, scale, causal, window, softcap, dtype)
    for name, ours, r, bse in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, base):
        check(ours, r, bse, 1e-4, name)
    return dq, dk, dv


@pytest.mark.parametrize("sq,sk", SEQ_PAIRS)
@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize("hd", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_forward_grid(dtype, hd, feature, sq, sk):
    run_case(dtype, hd, feature, sq, sk)


@pytest.mark.parametrize("sq,sk", FAST_PAIRS)
@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize("hd", HEAD_DIMS)
@pytest.mark.parametrize("arch", (80, 86, 89, 120))
def test_forward_grid_forced_arch(arch, hd, feature, sq, sk):
    run_case(torch.bfloat16 if arch % 2 else torch.float16, hd, feature, sq, sk, arch=arch)


# V's head dim apart from Q's and K's: DeepSeek's (192, 128), which has Hopper kernels of its own, and one that pads.
HEAD_DIM_PAIRS = ((192, 128), (128, 64))


@pytest.mark.parametrize("sq,sk", SEQ_PAIRS)
@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize("dims", HEAD_DIM_PAIRS, ids=lambda d: f"{d[0]}v{d[1]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_forward_grid_head_dim_v(dtype, dims, feature, sq, sk):
    run_case(dtype, dims, feature, sq, sk)


@pytest.mark.parametrize("with_dlse", (True, False), ids=["dlse", "no_dlse"])
@pytest.mark.parametrize("sq,sk", [(17, 113), (113, 17), (1013, 1013)])
@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize("dims", HEAD_DIM_PAIRS, ids=lambda d: f"{d[0]}v{d[1]}")
def test_backward_grid_head_dim_v(dims, feature, sq, sk, with_dlse):
    run_backward_case(torch.bfloat16, dims, feature, sq, sk, with_dlse)


@pytest.mark.parametrize("hd", (40, 72, 136))
def test_forward_padded_head_dims(hd):
    # Head dims that are multiples of 8 but not instantiated round up to the next tile by masking.
    h, hkv = 2, 2
    q = torch.randn(2, 77, h, hd, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 91, hkv, hd, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 91, hkv, hd, device="cuda", dtype=torch.bfloat16)
    out, lse = flashcute.flash_attn_func(q, k, v, causal=True)
    check_forward(q, k, v, out, lse, 1 / math.sqrt(hd), True, (None, None), 0.0)


def test_forward_strided_inputs():
    # A (B, H, S, D) tensor transposed to (B, S, H, D): non-contiguous batch/row/head strides, no copies.
    q = torch.randn(2, 3, 150, 64, device="cuda", dtype=torch.float16).transpose(1, 2)
    k = torch.randn(2, 3, 201, 64, device="cuda", dtype=torch.float16).transpose(1, 2)
    v = torch.randn(2, 201, 3, 128, device="cuda", dtype=torch.float16)[..., :64]
    out, lse = flashcute.flash_attn_func(q, k, v, causal=True)
    check_forward(q, k, v, out, lse, 1 / 8, True, (None, None), 0.0)


@pytest.mark.parametrize("hd", HEAD_DIMS)
def test_forward_expanded_inputs(hd):
    # K and V repeated along batch, heads and rows by stride-0 views (no copies): the Hopper forward cannot load
    # those with TMA and must take its cp.async path; the result is the materialised tensors' bit for bit.
    q = torch.randn(3, 130, 4, hd, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 97, 1, hd, device="cuda", dtype=torch.bfloat16).expand(3, 97, 2, hd)
    v = torch.randn(1, 1, 2, hd, device="cuda", dtype=torch.bfloat16).expand(3, 97, 2, hd)
    out, lse = flashcute.flash_attn_func(q, k, v, causal=True)
    ref_out, ref_lse = flashcute.flash_attn_func(q, k.contiguous(), v.contiguous(), causal=True)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


BWD_PAIRS = [(1, 1), (17, 113), (113, 17), (128, 128), (1013, 1013), (4096, 1013)]


@pytest.mark.parametrize("with_dlse", (True, False), ids=["dlse", "no_dlse"])
@pytest.mark.parametrize("sq,sk", BWD_PAIRS)
@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize("hd", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_backward_grid(dtype, hd, feature, sq, sk, with_dlse):
    run_backward_case(dtype, hd, feature, sq, sk, with_dlse)


@pytest.mark.parametrize("sq,sk", [(113, 17), (1013, 1013)])
@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize("hd", HEAD_DIMS)
@pytest.mark.parametrize("arch", (80, 86, 89, 120))
def test_backward_grid_forced_arch(arch, hd, feature, sq, sk):
    run_backward_case(torch.bfloat16 if arch % 2 else torch.float16, hd, feature, sq, sk, True, arch=arch)


# Several key tiles per column in every case, so CTAs take turns (or share slots). Natively the Hopper tiles take
# turns: hd128 and hd192 (and (192, 128)) through a dQ writer thread, hd64 and hd256 from the MMA warps. The
# forced-arch cases run the portable tiles: hd256 orders its dQ additions by turns, the others use slots.
@pytest.mark.parametrize("dtype,hd,feature,sq,sk,arch", [
    (torch.bfloat16, 128, "causal", 1013, 1013, None),
    (torch.bfloat16, 128, "gqa4", 1013, 1013, None),
    (torch.bfloat16, 192, "window", 517, 1013, None),
    (torch.float16, (192, 128), "causal", 1013, 700, None),
    (torch.float16, 64, "window", 517, 1013, None),
    (torch.float16, 256, "softcap", 1013, 700, None),
    (torch.bfloat16, 128, "causal", 1013, 1013, 80),
    (torch.bfloat16, 192, "gqa4", 1013, 1013, 80),
    (torch.float16, 256, "softcap", 1013, 700, 80),
    (torch.bfloat16, 192, "window", 517, 1013, 86),
    (torch.bfloat16, 256, "causal", 1013, 1013, 120),
])
def test_backward_deterministic_bits(dtype, hd, feature, sq, sk, arch):
    # Deterministic mode is correct, and gives the same bits every run.
    run_backward_case(dtype, hd, feature, sq, sk, True, arch=arch, deterministic=True)
    q, k, v = make_inputs(dtype, hd, feature, sq, sk, 7, requires_grad=True)
    _, _, causal, window, softcap = FEATURES[feature]
    dout = torch.randn(*q.shape[:-1], v.shape[-1], device="cuda", dtype=q.dtype)
    dlse = torch.randn(q.shape[0], q.shape[2], q.shape[1], device="cuda")
    runs = []
    with forced_arch(arch):
        for _ in range(5):
            out, lse = flashcute.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap,
                                                 deterministic=True)
            g = torch.autograd.grad([out, lse], (q, k, v), [dout, dlse])
            runs.append([t.clone() for t in g])
    for later in runs[1:]:
        for a, b in zip(runs[0], later):
            assert torch.equal(a, b), "deterministic backward differs between runs"


def on_fresh_thread(fn):
    """fn() run on a new thread (one that has not used the GPU: no CUDA context is current on it), its result or
    its exception returned to the caller's thread."""
    result = {}

    def body():
        try:
            result["value"] = fn()
        except Exception as e:  # noqa: BLE001 (raised again below, on the caller's thread)
            result["error"] = e

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


@pytest.mark.parametrize("hd", (64, 128, 256))
@pytest.mark.parametrize("sq,sk", [(1, 1), (113, 1013)])
def test_fresh_thread(hd, sq, sk):
    # TMA descriptors need a current CUDA context, and a thread that has not used the GPU has none: autograd's
    # worker thread, when this backward is the first CUDA work of a backward pass. The forward and the
    # (deterministic) backward, each the first GPU work of a new thread, give the bits they give here.
    q, k, v = make_inputs(torch.bfloat16, hd, "plain", sq, sk, 11)
    dout = torch.randn(q.shape, device="cuda", dtype=q.dtype)
    dlse = torch.randn(q.shape[0], q.shape[2], q.shape[1], device="cuda")
    unbounded, scale = flashcute.ops.WINDOW_UNBOUNDED, 1 / math.sqrt(hd)

    def fwd():
        out, lse = torch.ops.flashcute.fwd(q, k, v, scale, True, unbounded, unbounded, 0.0)
        torch.cuda.synchronize()
        return out, lse

    def bwd(out, lse):
        grads = torch.ops.flashcute.bwd(dout, dlse, q, k, v, out, lse, scale, True, unbounded, unbounded, 0.0, True)
        torch.cuda.synchronize()
        return grads[:3]

    out, lse = fwd()
    grads = bwd(out, lse)
    for name, a, b in zip(("out", "lse"), (out, lse), on_fresh_thread(fwd)):
        assert torch.equal(a, b), f"{name} differs on a fresh thread"
    for name, a, b in zip(("dq", "dk", "dv"), grads, on_fresh_thread(lambda: bwd(out, lse))):
        assert torch.equal(a, b), f"{name} differs on a fresh thread"
