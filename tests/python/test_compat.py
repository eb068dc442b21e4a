"""FlashAttention-4's calling conventions (flashcute.compat, flash_attn_combine): its keywords are taken, its padded
and paged forms of flash_attn_varlen_func give the bits of flashcute's own forms of the same attention (values and
gradients), and bad uses of them are refused by name. CPU (float64 reference) and GPU."""
import pytest

torch = pytest.importorskip("torch")

from flashcute import flash_attn_combine, flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache  # noqa

pytestmark = pytest.mark.usefixtures("flashcute_library")

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
DTYPE = torch.bfloat16


def randn(*shape, device, seed, dtype=DTYPE, grad=False):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float32).to(device, dtype).requires_grad_(grad)


def qkv(device, batch=3, sq=37, sk=53, h=4, hkv=2, d=64, grad=True):
    return (randn(batch, sq, h, d, device=device, seed=1, grad=grad),
            randn(batch, sk, hkv, d, device=device, seed=2, grad=grad),
            randn(batch, sk, hkv, d, device=device, seed=3, grad=grad))


def grads(out, lse, inputs):
    """Gradients of a loss on both outputs; -inf lse (rows with no key) takes no part."""
    w = torch.linspace(0.5, 1.5, out.numel(), device=out.device).view(out.shape)
    loss = (out.float() * w).sum() + 1e-2 * torch.where(lse.isfinite(), lse, 0).square().sum()
    return torch.autograd.grad(loss, inputs)


def same(a, b):
    assert a.shape == b.shape
    assert torch.equal(torch.nan_to_num(a.float()), torch.nan_to_num(b.float()))


@pytest.mark.parametrize("device", DEVICES)
def test_fa4_keywords(device):
    q, k, v = qkv(device)
    ref = flash_attn_func(q, k, v, causal=True)
    got = flash_attn_func(q, k, v, causal=True, num_splits=3, pack_gqa=True, qv=None, return_lse=True)
    for a, b in zip(ref, got):
        same(a, b)
    out, lse = flash_attn_func(q, k, v, causal=True, return_lse=False)
    assert out.requires_grad and not lse.requires_grad
    same(out, ref[0])


@pytest.mark.parametrize("device", DEVICES)
def test_padded_batch_is_varlen(device):
    """cu_seqlens_q = cu_seqlens_k = None: the batch as packed sequences, out and lse in the batch layout."""
    q, k, v = qkv(device)
    ref = flash_attn_func(q, k, v, causal=True)
    got = flash_attn_varlen_func(q, k, v, causal=True)
    assert got[0].shape == ref[0].shape and got[1].shape == ref[1].shape
    for a, b in zip(ref, got):
        same(a, b)
    for a, b in zip(grads(*ref, (q, k, v)), grads(*got, (q, k, v))):
        same(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_seqused_on_padded_sides(device):
    """seqused_q / seqused_k count each padded sequence's rows; rows past seqused_q give out 0, lse -inf and no
    gradient; the result is each sequence's own attention."""
    q, k, v = qkv(device)
    used_q = torch.tensor([37, 5, 0], dtype=torch.int32, device=device)
    used_k = torch.tensor([53, 20, 7], dtype=torch.int32, device=device)
    out, lse = flash_attn_varlen_func(q, k, v, seqused_q=used_q, seqused_k=used_k, causal=True, max_seqlen_q=37,
                                      max_seqlen_k=53)
    dq, dk, dv = grads(out, lse, (q, k, v))
    for b, (nq, nk) in enumerate(zip(used_q.tolist(), used_k.tolist())):
        assert torch.all(out[b, nq:] == 0) and torch.all(lse[b, :, nq:] == float("-inf"))
        assert torch.all(dq[b, nq:] == 0) and torch.all(dk[b, nk:] == 0) and torch.all(dv[b, nk:] == 0)
        if nq == 0:
            continue
        qb, kb, vb = (t[b:b + 1, :n].detach().requires_grad_() for t, n in ((q, nq), (k, nk), (v, nk)))
        ref_out, ref_lse = flash_attn_func(qb, kb, vb, causal=True)
        same(out[b:b + 1, :nq], ref_out)
        same(lse[b:b + 1, :, :nq], ref_lse)


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_packed_and_padded(device):
    """q packed with cu_seqlens_q against k, v padded with seqused_k, and the other way round."""
    q, k, v = qkv(device)
    used_k = torch.tensor([53, 20, 7], dtype=torch.int32, device=device)
    lens_q = [37, 5, 0]
    cu_q = torch.tensor([0, 37, 42, 42], dtype=torch.int32, device=device)
    q_packed = torch.cat([q[b, :n] for b, n in enumerate(lens_q)]).detach().requires_grad_()
    out, lse = flash_attn_varlen_func(q_packed, k, v, cu_seqlens_q=cu_q, seqused_k=used_k, causal=True)
    assert out.shape == (42, 4, 64) and lse.shape == (4, 42)
    padded, padded_lse = flash_attn_varlen_func(q, k, v, seqused_q=torch.tensor(lens_q, dtype=torch.int32,
                                                                                 device=device),
                                                seqused_k=used_k, causal=True)
    same(out[:37], padded[0, :37])
    same(out[37:42], padded[1, :5])
    same(lse[:, :37], padded_lse[0, :, :37])
    # k packed, q padded: max_seqlen as one-element tensors (FlashAttention-4 allows them).
    cu_k = torch.tensor([0, 53, 73, 80], dtype=torch.int32, device=device)
    k_packed = torch.cat([k[b, :n] for b, n in enumerate(used_k.tolist())])
    v_packed = torch.cat([v[b, :n] for b, n in enumerate(used_k.tolist())])
    out2, lse2 = flash_attn_varlen_func(q, k_packed, v_packed, cu_seqlens_k=cu_k, causal=True,
                                        max_seqlen_q=torch.tensor(37), max_seqlen_k=torch.tensor(53))
    full, full_lse = flash_attn_varlen_func(q, k, v, seqused_k=used_k, causal=True)
    same(out2, full)
    same(lse2, full_lse)


@pytest.mark.parametrize("device", DEVICES)
def test_padded_into_buffers(device):
    q, k, v = qkv(device, grad=False)
    ref = flash_attn_varlen_func(q, k, v, causal=True)
    out = torch.full_like(ref[0], float("nan"))
    lse = torch.full_like(ref[1], float("nan"))
    got = flash_attn_varlen_func(q, k, v, causal=True, out=out, lse=lse)
    assert got[0] is out and got[1] is lse
    same(out, ref[0])
    same(lse, ref[1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("page_size", [1, 8])
def test_page_table_is_kvcache(device, page_size):
    """page_table: k and v are a paged cache, seqused_k its lengths; the same bits as flash_attn_with_kvcache, and
    the attention over the gathered keys."""
    h, hkv, d = 4, 2, 64
    pages = 3 * 40 // page_size + 5
    k_cache = randn(pages, page_size, hkv, d, device=device, seed=4)
    v_cache = randn(pages, page_size, hkv, d, device=device, seed=5)
    per_seq = 40 // page_size
    table = torch.randperm(pages, generator=torch.Generator().manual_seed(6))[:3 * per_seq].reshape(3, per_seq)
    table = table.to(device=device, dtype=torch.int32)
    lens = torch.tensor([40, 17, 0], dtype=torch.int32, device=device)
    q = randn(3, 4, h, d, device=device, seed=7)
    got = flash_attn_varlen_func(q, k_cache, v_cache, page_table=table, seqused_k=lens, causal=True, num_splits=1)
    ref = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, page_table=table, causal=True,
                                  num_splits=1)
    for a, b in zip(got, ref):
        same(a, b)
    keys, values = (c[table.long()].reshape(3, 40, hkv, d) for c in (k_cache, v_cache))
    flat = flash_attn_varlen_func(q, keys, values, seqused_k=lens, causal=True)
    for a, b in zip(got, flat):
        torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_compat_refusals(device):
    q, k, v = qkv(device, grad=False)
    with pytest.raises(ValueError, match="qv"):
        flash_attn_func(q, k, v, qv=q)
    with pytest.raises(ValueError, match="num_splits"):
        flash_attn_func(q, k, v, num_splits=-1)
    with pytest.raises(ValueError, match="pack_gqa"):
        flash_attn_varlen_func(q, k, v, pack_gqa="yes")
    with pytest.raises(ValueError, match="return_lse"):
        flash_attn_func(q, k, v, return_lse="no")
    with pytest.raises(ValueError, match="4-D"):
        flash_attn_varlen_func(q[0], k, v)
    with pytest.raises(ValueError, match="same sequences"):
        flash_attn_varlen_func(q[:2], k, v)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        flash_attn_varlen_func(q, k, v, max_seqlen_q=torch.tensor([1, 2]), max_seqlen_k=3)
    table = torch.zeros(3, 1, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="page_table"):
        flash_attn_varlen_func(q, k, v, page_table=table, cu_seqlens_k=torch.zeros(4, dtype=torch.int32,
                                                                                   device=device))


def combine_reference(out_partial, lse_partial):
    lse = torch.logsumexp(lse_partial.double(), dim=0)
    weights = torch.exp(lse_partial.double() - lse).nan_to_num(0.0)
    return (weights[..., None] * out_partial.double()).sum(0), lse


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("splits", [1, 2, 5])
def test_combine(device, splits):
    out_p = randn(splits, 3, 9, 4, 32, device=device, seed=8, dtype=torch.float32)
    # lse_partial with FlashAttention-4's strides (seqlen contiguous); some splits and one whole row saw no key.
    lse_p = randn(splits, 3, 4, 9, device=device, seed=9, dtype=torch.float32).transpose(-1, -2)
    lse_p[splits // 2:, 0] = float("-inf")
    lse_p[:, 1, 2] = float("-inf")
    out_p[:, 1, 2] = float("nan")  # unwritten partials of empty splits must not leak into the result
    out, lse = flash_attn_combine(out_p, lse_p, out_dtype=torch.bfloat16)
    ref_out, ref_lse = combine_reference(out_p.nan_to_num(0.0), lse_p)
    assert out.dtype == torch.bfloat16 and out.shape == (3, 9, 4, 32) and lse.shape == (3, 9, 4)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-2, rtol=1e-2)
    assert torch.all(out[1, 2] == 0) and torch.all(lse[1, 2] == float("-inf"))
    # Packed rows with cu_seqlens and seqused: rows outside keep what out= held, lse -inf there.
    cu = torch.tensor([0, 10, 20], dtype=torch.int32, device=device)
    used = torch.tensor([4, 10], dtype=torch.int32, device=device)
    buf = torch.full((27, 4, 32), 7.0, device=device)
    got, got_lse = flash_attn_combine(out_p.reshape(splits, 27, 4, 32), lse_p.reshape(splits, 27, 4), out=buf,
                                      cu_seqlens=cu, seqused=used)
    assert got is buf
    rows = torch.zeros(27, dtype=torch.bool)
    rows[0:4] = rows[10:20] = True
    flat_out, flat_lse = ref_out.reshape(27, 4, 32), ref_lse.reshape(27, 4)
    torch.testing.assert_close(got[rows.to(device)].double(), flat_out[rows.to(device)], atol=1e-5, rtol=1e-5)
    assert torch.all(got[~rows.to(device)] == 7.0) and torch.all(got_lse[~rows.to(device)] == float("-inf"))
    assert flash_attn_combine(out_p, lse_p, return_lse=False)[1] is None
