"""flash_attn_varlen_func: packed sequences give what flash_attn_func gives sequence by sequence (values and
gradients through out and lse), on CPU (float64 reference) and on the GPU; bad offsets are refused."""
import itertools

import pytest

torch = pytest.importorskip("torch")

from flashcute import _capi, flash_attn_func, flash_attn_varlen_func  # noqa: E402

pytestmark = pytest.mark.usefixtures("flashcute_library")

# (lengths of q, lengths of k, seqused_k or None, causal, window, nheads, nheads_kv): an empty query sequence,
# one-token ones, Sq > Sk (fully masked causal rows), GQA, a window, keys cut short by seqused_k.
CASES = {
    "causal": ([5, 1, 17, 0], [7, 3, 17, 4], None, True, (None, None), 4, 2),
    "window_gqa": ([9, 33], [30, 12], None, False, (5, 2), 4, 1),
    "seqused": ([6, 20, 3], [10, 25, 8], [4, 25, 0], True, (None, None), 2, 2),
}


def offsets(lengths, device):
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)


def make_case(name, dtype, device, head_dim=16):
    lens_q, lens_k, used, causal, window, h, hkv = CASES[name]
    g = torch.Generator().manual_seed(len(name))
    shapes = ((sum(lens_q), h, head_dim), (sum(lens_k), hkv, head_dim), (sum(lens_k), hkv, head_dim))
    q, k, v = (torch.randn(s, generator=g, dtype=torch.float64).to(device, dtype).requires_grad_() for s in shapes)
    seqused = None if used is None else torch.tensor(used, dtype=torch.int32, device=device)
    return q, k, v, offsets(lens_q, device), offsets(lens_k, device), seqused, causal, window


def loss_of(out, lse):
    # Weights on both outputs; -inf lse (rows that see no key) contributes nothing.
    w = torch.linspace(0.5, 1.5, out.numel(), dtype=torch.float64, device=out.device).view(out.shape)
    return (out.double() * w).sum() + 1e-1 * torch.where(lse.isfinite(), lse.double(), 0).square().sum()


def per_sequence(q, k, v, cu_q, cu_k, seqused, causal, window):
    """The same attention through flash_attn_func, one sequence at a time; (out, lse) packed like varlen's."""
    outs, lses = [], []
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    for b in range(cu_q.numel() - 1):
        q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        if seqused is not None:
            k1 = k0 + int(seqused[b])
        if q1 == q0:
            continue
        if k1 == k0:  # no key at all: out 0, lse -inf, no gradient
            outs.append(q.new_zeros((q1 - q0, q.shape[1], v.shape[2])))
            lses.append(torch.full((q.shape[1], q1 - q0), float("-inf"), device=q.device, dtype=lse_dtype))
            continue
        out, lse = flash_attn_func(q[q0:q1][None], k[k0:k1][None], v[k0:k1][None], causal=causal, window_size=window)
        outs.append(out[0])
        lses.append(lse[0])
    return torch.cat(outs), torch.cat(lses, dim=1)


def run_both(name, dtype, device):
    q, k, v, cu_q, cu_k, seqused, causal, window = make_case(name, dtype, device)
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, causal=causal, window_size=window, seqused_k=seqused)
    grads = torch.autograd.grad(loss_of(out, lse), (q, k, v))
    ref_out, ref_lse = per_sequence(q, k, v, cu_q, cu_k, seqused, causal, window)
    ref_grads = torch.autograd.grad(loss_of(ref_out, ref_lse), (q, k, v))
    return (out, lse, *grads), (ref_out, ref_lse, *ref_grads)


@pytest.mark.parametrize("name", CASES)
def test_varlen_matches_per_sequence_cpu(name):
    ours, ref = run_both(name, torch.float64, "cpu")
    for a, b, what in zip(ours, ref, ("out", "lse", "dq", "dk", "dv")):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=what)


@pytest.mark.gpu
@pytest.mark.parametrize("name", CASES)
def test_varlen_matches_per_sequence_gpu(name):
    # The same kernels run per sequence either way; only the grid and (backward) the float atomics' order differ.
    ours, ref = run_both(name, torch.bfloat16, "cuda")
    for a, b, what in zip(ours, ref, ("out", "lse", "dq", "dk", "dv")):
        assert torch.equal(a.isfinite(), b.isfinite()), what
        torch.testing.assert_close(a[a.isfinite()].float(), b[b.isfinite()].float(), rtol=2e-2, atol=2e-2, msg=what)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", (False, True), ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", (64, 128, 256))
def test_varlen_deterministic_bits_gpu(head_dim, causal):
    # Sequences of several key tiles (so the CTAs of a query tile take turns, or share slots), an empty one, GQA:
    # the deterministic backward gives the same bits on every run, and the default mode's values.
    lens_q, lens_k, h, hkv = [300, 1, 700, 0], [500, 200, 700, 90], 4, 2
    g = torch.Generator().manual_seed(head_dim)
    shapes = ((sum(lens_q), h, head_dim), (sum(lens_k), hkv, head_dim), (sum(lens_k), hkv, head_dim))
    q, k, v = (torch.randn(s, generator=g).to("cuda", torch.bfloat16).requires_grad_() for s in shapes)
    cu_q, cu_k = offsets(lens_q, "cuda"), offsets(lens_k, "cuda")

    def grads(deterministic):
        out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, causal=causal, deterministic=deterministic)
        return torch.autograd.grad(loss_of(out, lse), (q, k, v))

    runs = [grads(True) for _ in range(5)]
    for later in runs[1:]:
        for a, b in zip(runs[0], later):
            assert torch.equal(a, b), "deterministic backward differs between runs"
    for a, b, what in zip(runs[0], grads(False), ("dq", "dk", "dv")):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2, msg=what)


def test_varlen_opcheck():
    q, k, v, cu_q, cu_k, seqused, causal, window = make_case("seqused", torch.float64, "cpu")
    for maxima in ((-1, -1), (20, 25)):  # read on the host, or given (no host copy)
        used_q = (cu_q[1:] - cu_q[:-1]) // 2
        args = (cu_q, cu_k, seqused, used_q, *maxima, 0.25, causal, _capi.WINDOW_UNBOUNDED, -3, 0.0)
        _opcheck_varlen(q, k, v, args)


def _opcheck_varlen(q, k, v, args):
    torch.library.opcheck(torch.ops.flashcute.varlen_fwd, (q, k, v, *args, False))
    q, k, v = (t.detach() for t in (q, k, v))
    out, lse = torch.ops.flashcute.varlen_fwd(q, k, v, *args)
    for dlse in (None, torch.randn_like(lse)):
        torch.library.opcheck(torch.ops.flashcute.varlen_bwd,
                              (torch.randn_like(out), dlse, q, k, v, out, lse, *args, False))


BAD = {
    "int64_offsets": (lambda cu_q, cu_k, used: (cu_q.long(), cu_k, used), "cu_seqlens_q must be a 1-D int32"),
    "batch_mismatch": (lambda cu_q, cu_k, used: (cu_q, cu_k[:-1], used), "must both hold"),
    "past_the_rows": (lambda cu_q, cu_k, used: (cu_q, cu_k + 1, used), "cu_seqlens_k must start at 0"),
    "decreasing": (lambda cu_q, cu_k, used: (cu_q.flip(0), cu_k, used), "cu_seqlens_q must start at 0"),
    "seqused_too_long": (lambda cu_q, cu_k, used: (cu_q, cu_k, used + 100), "seqused_k must lie"),
}


@pytest.mark.parametrize("case", BAD)
def test_varlen_errors_name_the_argument(case):
    q, k, v, cu_q, cu_k, seqused, causal, _ = make_case("seqused", torch.float64, "cpu")
    fn, message = BAD[case]
    cu_q, cu_k, seqused = fn(cu_q, cu_k, seqused)
    with pytest.raises(ValueError, match=message):
        flash_attn_varlen_func(q, k, v, cu_q, cu_k, causal=causal, seqused_k=seqused)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_seqused_q_is_each_sequence_shortened(device):
    # seqused_q keeps each sequence's first queries: the causal diagonal aligns to them, the rest are padding (out 0,
    # lse -inf, zero gradients).
    dtype = torch.float64 if device == "cpu" else torch.bfloat16
    q, k, v, cu_q, cu_k, _, causal, window = make_case("causal", dtype, device)
    used_q = torch.tensor([3, 1, 10, 0], dtype=torch.int32, device=device)
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, causal=True, seqused_q=used_q)
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    grads = torch.autograd.grad((out, lse), (q, k, v), (dout, dlse))
    keep = torch.zeros(q.shape[0], dtype=torch.bool, device=device)
    for b in range(used_q.numel()):
        keep[int(cu_q[b]):int(cu_q[b]) + int(used_q[b])] = True
    short_q = q[keep].detach().requires_grad_()
    cu_short = torch.cat([used_q.new_zeros(1), used_q.cumsum(0).int()])
    ref_out, ref_lse = flash_attn_varlen_func(short_q, k, v, cu_short, cu_k, causal=True)
    ref_grads = torch.autograd.grad((ref_out, ref_lse), (short_q, k, v), (dout[keep], dlse[:, keep]))
    assert (out[~keep] == 0).all() and (lse[:, ~keep] == float("-inf")).all() and (grads[0][~keep] == 0).all()
    tol = dict(rtol=1e-10, atol=1e-10) if device == "cpu" else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(out[keep], ref_out, **tol)
    torch.testing.assert_close(lse[:, keep], ref_lse, **tol)
    for a, b_ in zip((grads[0][keep], grads[1], grads[2]), ref_grads):
        torch.testing.assert_close(a.float(), b_.float(), **tol)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", (64, 128, 256))
@pytest.mark.parametrize("causal", (False, True), ids=["full", "causal"])
def test_rows_no_sequence_owns_change_nothing(head_dim, causal):
    # Packed tensors longer than their sequences (a static buffer holding stale values, say): the Hopper kernels
    # load varlen tiles by TMA and read past a sequence's end, into the next sequence's rows and past the last one.
    # Those rows must not reach the results: out, lse and the deterministic gradients equal, bit for bit, those of
    # the same call on tensors without the tail.
    lens_q, lens_k, h, hkv, tail = [300, 1, 700, 129], [500, 200, 700, 130], 4, 2, 45
    g = torch.Generator().manual_seed(head_dim)
    tq, tk = sum(lens_q), sum(lens_k)
    clean = [torch.randn(s, generator=g).to("cuda", torch.bfloat16)
             for s in ((tq, h, head_dim), (tk, hkv, head_dim), (tk, hkv, head_dim))]
    padded = [torch.cat([x, 1e4 * torch.randn((tail, *x.shape[1:]), generator=g).to(x)]) for x in clean]
    cu_q, cu_k = offsets(lens_q, "cuda"), offsets(lens_k, "cuda")

    def run(q, k, v):
        q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
        out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k),
                                          causal=causal, deterministic=True)
        grads = torch.autograd.grad(loss_of(out[:tq], lse[:, :tq]), (q, k, v))
        return out[:tq], lse[:, :tq], grads[0][:tq], grads[1][:tk], grads[2][:tk]

    for a, b, what in zip(run(*padded), run(*clean), ("out", "lse", "dq", "dk", "dv")):
        assert torch.equal(a, b), what


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("used", (False, True), ids=["packed", "seqused"])
def test_rows_no_sequence_owns_are_written(device, used):
    # Rows past the last sequence and past a sequence's seqused_q get out 0, lse -inf and zero dq; key rows past the
    # last sequence zero dk and dv: written by the library, whatever the memory held (NaN here), also into out=/lse=.
    lens_q, lens_k, tail_q, tail_k = [5, 0, 130, 17], [7, 3, 150, 20], 11, 9
    used_q = [3, 0, 100, 17] if used else None
    used_k = [7, 1, 150, 5] if used else None
    dtype = torch.float64 if device == "cpu" else torch.bfloat16
    g = torch.Generator().manual_seed(3)
    tq, tk = sum(lens_q) + tail_q, sum(lens_k) + tail_k
    q, k, v = (torch.randn(s, generator=g, dtype=torch.float64).to(device, dtype).requires_grad_()
               for s in ((tq, 4, 64), (tk, 2, 64), (tk, 2, 64)))
    cu_q, cu_k = offsets(lens_q, device), offsets(lens_k, device)
    seqused_q, seqused_k = (None if x is None else torch.tensor(x, dtype=torch.int32, device=device)
                            for x in (used_q, used_k))
    owned_q = torch.zeros(tq, dtype=torch.bool, device=device)
    owned_k = torch.zeros(tk, dtype=torch.bool, device=device)
    for b in range(len(lens_q)):
        owned_q[int(cu_q[b]):int(cu_q[b]) + (used_q or lens_q)[b]] = True
        owned_k[int(cu_k[b]):int(cu_k[b + 1])] = True
    if device == "cuda":  # the next allocations reuse NaN-filled memory
        torch.empty(1 << 22, device=device).fill_(float("nan"))
    kw = dict(causal=True, seqused_q=seqused_q, seqused_k=seqused_k, max_seqlen_q=max(lens_q),
              max_seqlen_k=max(lens_k))
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, **kw)
    dq, dk, dv = torch.autograd.grad((out, lse), (q, k, v), (torch.randn_like(out), torch.randn_like(lse)))
    assert (out[~owned_q] == 0).all() and (lse[:, ~owned_q] == float("-inf")).all()
    assert (dq[~owned_q] == 0).all() and (dk[~owned_k] == 0).all() and (dv[~owned_k] == 0).all()
    for t in (out, dq, dk, dv):
        assert torch.isfinite(t).all()
    buf_out, buf_lse = torch.full_like(out, float("nan")), torch.full_like(lse, float("nan"))
    with torch.no_grad():
        flash_attn_varlen_func(q, k, v, cu_q, cu_k, out=buf_out, lse=buf_lse, **kw)
    assert torch.equal(buf_out, out) and torch.equal(buf_lse, lse)
