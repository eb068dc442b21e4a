"""The GPU correctness grid: every dtype x head dim x feature x seqlen pair, against a float64 reference, with the
error rule |ours - ref64| <= 2 * |plain torch attention in the same dtype - ref64| + atol.

Also run under FLASHCUTE_ARCH=80, 86, 89, 120 (other arch profiles' tiles on this GPU). Skipped without CUDA.
"""
import math
import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import flashcute  # noqa: E402

HEAD_DIMS = (64, 96, 128, 192, 256)
DTYPES = (torch.float16, torch.bfloat16)
# (name, nheads, nheads_kv, causal, window (left, right), softcap)
FEATURES = {
    "plain": (2, 2, False, (None, None), 0.0),
    "causal": (2, 2, True, (None, None), 0.0),
    "window": (2, 2, False, (37, 11), 0.0),
    "softcap": (2, 2, True, (None, None), 7.5),
    "gqa4": (8, 2, False, (None, None), 0.0),
    "mqa": (4, 1, True, (64, None), 0.0),
}
# q and k lengths drawn separately from {1, 17, 113, 128, 1013, 4096}.
SEQ_PAIRS = [(1, 1), (17, 113), (113, 17), (128, 128), (1013, 1013), (4096, 1013), (113, 4096), (1, 1013)]
FAST_PAIRS = [(17, 113), (113, 17), (128, 128), (1013, 1013)]


def visible_mask(sq, sk, causal, window, device):
    """DESIGN.md section 1: bottom-right aligned; True where key j is visible to query i."""
    left, right = window
    if causal:
        right = 0
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    diag = i + (sk - sq)
    vis = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left is not None and left >= 0:
        vis &= j >= diag - left
    if right is not None and right >= 0:
        vis &= j <= diag + right
    return vis


def attention(q, k, v, scale, causal, window, softcap, compute_dtype):
    """Plain attention; in float64 it is the reference, in fp16/bf16 the baseline whose error bounds ours."""
    b, sq, h, d = q.shape
    hkv = k.shape[2]
    qh = q.to(compute_dtype).transpose(1, 2)
    kh = k.to(compute_dtype).repeat_interleave(h // hkv, dim=2).transpose(1, 2)
    vh = v.to(compute_dtype).repeat_interleave(h // hkv, dim=2).transpose(1, 2)
    s = torch.matmul(qh, kh.transpose(-1, -2)).float() * scale
    if compute_dtype == torch.float64:
        s = torch.matmul(qh, kh.transpose(-1, -2)) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    vis = visible_mask(sq, k.shape[1], causal, window, q.device)
    s = s.masked_fill(~vis, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None].masked_fill(torch.isinf(lse)[..., None], 0.0))
    p = p.masked_fill(~vis, 0.0)
    out = torch.matmul(p.to(compute_dtype), vh)
    return out.transpose(1, 2), lse


def poison_allocator(nbytes):
    # flash_attn_func allocates its outputs with torch.empty; filling and freeing a block first makes any
    # element the kernel fails to write show up as NaN.
    torch.empty(nbytes // 4 + 1024, dtype=torch.float32, device="cuda").fill_(float("nan"))


def check(ours, ref, base, atol, what):
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(ours), finite), f"{what}: non-finite pattern differs (NaN or wrong -inf)"
    err = (ours.double() - ref).abs()[finite].max().item() if finite.any() else 0.0
    berr = (base.double() - ref).abs()[finite].max().item() if finite.any() else 0.0
    assert err <= 2 * berr + atol, f"{what}: error {err:.3e} > 2 x torch {berr:.3e} + {atol}"


def run_case(dtype, hd, feature, sq, sk, arch=None, batch=1):
    h, hkv, causal, window, softcap = FEATURES[feature]
    torch.manual_seed(hash((str(dtype), hd, feature, sq, sk, arch)) % (2**31))
    q = torch.randn(batch, sq, h, hd, device="cuda", dtype=dtype)
    k = torch.randn(batch, sk, hkv, hd, device="cuda", dtype=dtype)
    v = torch.randn(batch, sk, hkv, hd, device="cuda", dtype=dtype)
    scale = 1.0 / math.sqrt(hd)
    old = os.environ.get("FLASHCUTE_ARCH")
    if arch:
        os.environ["FLASHCUTE_ARCH"] = str(arch)
    try:
        poison_allocator(q.numel() * 2 + batch * h * sq * 4)
        out, lse = flashcute.flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, window_size=window,
                                             softcap=softcap)
        torch.cuda.synchronize()
    finally:
        if arch:
            if old is None:
                os.environ.pop("FLASHCUTE_ARCH")
            else:
                os.environ["FLASHCUTE_ARCH"] = old
    ref_o, ref_lse = attention(q, k, v, scale, causal, window, softcap, torch.float64)
    base_o, base_lse = attention(q, k, v, scale, causal, window, softcap, dtype)
    assert not torch.isnan(out).any(), "NaN (or an unwritten element) in out"
    assert not torch.isnan(lse).any(), "NaN (or an unwritten element) in lse"
    check(out, ref_o, base_o, 1e-5, "out")
    check(lse, ref_lse, base_lse, 1e-5, "lse")
    empty = torch.isinf(ref_lse)
    if empty.any():
        assert (out.transpose(1, 2)[empty] == 0).all(), "rows with no visible key must give out = 0"


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


@pytest.mark.parametrize("hd", (40, 72, 136))
def test_forward_padded_head_dims(hd):
    # Head dims that are multiples of 8 but not instantiated round up to the next tile by masking.
    h, hkv = 2, 2
    q = torch.randn(2, 77, h, hd, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 91, hkv, hd, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 91, hkv, hd, device="cuda", dtype=torch.bfloat16)
    out, lse = flashcute.flash_attn_func(q, k, v, causal=True)
    ref_o, ref_lse = attention(q, k, v, 1 / math.sqrt(hd), True, (None, None), 0.0, torch.float64)
    base_o, base_lse = attention(q, k, v, 1 / math.sqrt(hd), True, (None, None), 0.0, torch.bfloat16)
    check(out, ref_o, base_o, 1e-5, "out")
    check(lse, ref_lse, base_lse, 1e-5, "lse")


def test_forward_strided_inputs():
    # A (B, H, S, D) tensor transposed to (B, S, H, D): non-contiguous batch/row/head strides, no copies.
    q = torch.randn(2, 3, 150, 64, device="cuda", dtype=torch.float16).transpose(1, 2)
    k = torch.randn(2, 3, 201, 64, device="cuda", dtype=torch.float16).transpose(1, 2)
    v = torch.randn(2, 201, 3, 128, device="cuda", dtype=torch.float16)[..., :64]
    out, lse = flashcute.flash_attn_func(q, k, v, causal=True)
    ref_o, ref_lse = attention(q, k, v, 1 / 8, True, (None, None), 0.0, torch.float64)
    base_o, base_lse = attention(q, k, v, 1 / 8, True, (None, None), 0.0, torch.float16)
    check(out, ref_o, base_o, 1e-5, "out")
    check(lse, ref_lse, base_lse, 1e-5, "lse")
