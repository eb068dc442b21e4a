"""Plain PyTorch attention, forward and analytic backward (DESIGN.md sections 1-2), for the GPU grids.

In float64 it is the reference; in fp16/bf16 (matmuls in that dtype, softmax in float32) it is the baseline whose
error bounds ours: |ours - ref64| <= 2 * |baseline - ref64| + atol.
"""
import torch


def visible_mask(sq, sk, causal, window, device):
    """Bottom-right aligned: True where key j is visible to query i."""
    left, right = window
    if causal:
        right = 0
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    diag = i + (sk - sq)
    vis = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left is not None:  # None: unbounded; any integer, negative too, is an offset
        vis &= j >= diag - left
    if right is not None:
        vis &= j <= diag + right
    return vis


def _heads(x, h, dtype):
    """(B, S, Hkv, D) -> (B, H, S, D) with each kv head repeated for its query heads."""
    return x.to(dtype).repeat_interleave(h // x.shape[2], dim=2).transpose(1, 2)


def _scores(q, k, scale, softcap, vis, dtype):
    h = q.shape[2]
    s = torch.matmul(_heads(q, h, dtype), _heads(k, h, dtype).transpose(-1, -2))
    s = s.double() * scale if dtype == torch.float64 else s.float() * scale
    t = None
    if softcap > 0:
        t = torch.tanh(s / softcap)
        s = softcap * t
    return s.masked_fill(~vis, float("-inf")), t


def _probs(s, lse):
    """P = exp(s - lse), with rows of lse = -inf giving P = 0 (never (-inf) - (-inf))."""
    empty = torch.isinf(lse)[..., None]
    return torch.exp(s - lse[..., None].masked_fill(empty, 0.0)).masked_fill(empty, 0.0)


def forward(q, k, v, scale, causal, window, softcap, dtype, sink=None):
    """Returns out (B, Sq, H, Dv) and lse (B, H, Sq). sink (H,): a learnable sink's logits, one more term of every
    row's softmax denominator (rows that see no key then give out 0 and lse = the sink)."""
    vis = visible_mask(q.shape[1], k.shape[1], causal, window, q.device)
    s, _ = _scores(q, k, scale, softcap, vis, dtype)
    if sink is None:
        lse = torch.logsumexp(s, dim=-1)
    else:
        extra = sink.to(device=s.device, dtype=s.dtype)[None, :, None, None].expand(*s.shape[:3], 1)
        lse = torch.logsumexp(torch.cat((s, extra), dim=-1), dim=-1)
    p = _probs(s, lse)
    out = torch.matmul(p.to(dtype), _heads(v, q.shape[2], dtype))
    return out.transpose(1, 2), lse


def backward(q, k, v, out, lse, dout, dlse, scale, causal, window, softcap, dtype):
    """dq, dk, dv for loss gradients dout (on out) and dlse (on lse, may be None), from the given out and lse."""
    b, sq, h, d = q.shape
    hkv = k.shape[2]
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    vis = visible_mask(sq, k.shape[1], causal, window, q.device)
    s, t = _scores(q, k, scale, softcap, vis, dtype)
    p = _probs(s, lse.to(acc))
    do = dout.to(dtype).transpose(1, 2)
    dv = torch.matmul(p.to(dtype).transpose(-1, -2), do).to(acc)
    dp = torch.matmul(do, _heads(v, h, dtype).transpose(-1, -2)).to(acc)
    dsum = (dout.to(acc) * out.to(acc)).sum(-1).transpose(1, 2)
    if dlse is not None:
        dsum = dsum - dlse.to(acc).masked_fill(torch.isinf(lse), 0.0)
    ds = p * (dp - dsum[..., None])
    if t is not None:
        ds = ds * (1 - t * t)
    dq = torch.matmul(ds.to(dtype), _heads(k, h, dtype)).to(acc) * scale
    dk = torch.matmul(ds.to(dtype).transpose(-1, -2), _heads(q, h, dtype)).to(acc) * scale

    def fold(x):  # (B, H, Sk, D) -> (B, Sk, Hkv, D), summing the query heads that share a kv head
        return x.reshape(b, hkv, h // hkv, x.shape[2], x.shape[3]).sum(2).transpose(1, 2)

    # Gradients come back in the input dtype, as from any PyTorch attention backward.
    return tuple(g.to(q.dtype) for g in (dq.transpose(1, 2), fold(dk), fold(dv)))


def dsink(out, lse, dout, dlse, sink, magnitude=False):
    """The sink's gradient: -sum over rows of exp(sink_h - lse) (rowsum(dout * out) - dlse), per head, in the
    precision of lse (float64 for the reference); rows of lse = -inf add nothing. magnitude: also the same sum over
    absolute values of every product (the scale of its rounding errors)."""
    acc = lse.dtype
    prod = dout.to(acc) * out.to(acc)
    d = prod.sum(-1).transpose(1, 2)  # (B, H, Sq)
    mag = prod.abs().sum(-1).transpose(1, 2)
    if dlse is not None:
        d = d - dlse.to(acc)
        mag = mag + dlse.to(acc).abs()
    w = torch.exp(sink.to(device=lse.device, dtype=acc)[None, :, None] - lse).masked_fill(torch.isinf(lse), 0.0)
    grad = -(w * d).sum(dim=(0, 2))
    return (grad, (w * mag).sum(dim=(0, 2))) if magnitude else grad


def check_dsink(ours, out, lse, dout, dlse, sink, varlen):
    """dsink is one sum per head over every query row: its error against the float64 reference is mostly the
    rounding of out (checked above), one random draw each for ours and torch's, so the 2x rule on it fails by chance
    (a ratio of two such draws exceeds 2 about a third of the time). Checked instead: dsink is the gradient of the
    out and lse we returned, i.e. the float64 sum over them, to float32 accumulation (1e-5 of the sum of the
    magnitudes of its products)."""
    args = [out, lse, dout, dlse]
    if varlen:  # (total, H, D) and (H, total): one batch of the packed rows
        args = [None if t is None else t[None] for t in args]
    want, mag = dsink(*(None if t is None else t.detach().double() for t in args), sink.detach().double(),
                      magnitude=True)
    err = (ours.double() - want).abs()
    worst = int((err - 1e-5 * mag).argmax())
    assert err[worst] <= 1e-5 * mag[worst] + 1e-6, (f"dsink: {ours[worst].item():.6e} against {want[worst].item():.6e} "
                                                    f"from our out and lse (sum of magnitudes {mag[worst].item():.3e})")


def ulp(x, dtype):
    """The spacing of dtype's numbers at |x| (its normal range; subnormals get the smallest normal's spacing)."""
    fi = torch.finfo(dtype)
    mag = x.abs().double().clamp(min=fi.tiny)
    return torch.exp2(torch.floor(torch.log2(mag))) * fi.eps


def check(ours, ref, base, atol, what, ulps=0):
    """|ours - ref| <= 2 |base - ref| + atol over the finite elements of ref; the same non-finite values (-inf rows);
    no NaN. ref and base may live on another device than ours. ulps > 0 also allows that many units in the last
    place of ours's dtype at each element: a value that lands on the other side of a rounding boundary than the
    baseline's did (one rounding of float32 noise) is not an error of the method."""
    ours = ours.detach()
    ref, base = (t.detach().to(ours.device) for t in (ref, base))
    finite = torch.isfinite(ref)
    assert not torch.isnan(ours).any(), f"{what}: NaN (or an unwritten element)"
    assert torch.equal(torch.isfinite(ours), finite), f"{what}: non-finite pattern differs"
    assert torch.equal(ours[~finite].double(), ref[~finite].double()), f"{what}: non-finite values differ"
    if not finite.any():
        return
    diff = (ours.double() - ref.double()).abs()[finite]
    berr = (base.double() - ref.double()).abs()[finite].max().item()
    slack = ulps * ulp(ref[finite], ours.dtype) if ulps else 0.0
    excess = diff - (2 * berr + atol + slack)
    worst = int(excess.argmax())
    assert excess[worst] <= 0, (f"{what}: error {diff[worst].item():.3e} > 2 x torch {berr:.3e} + {atol}"
                                + (f" + {ulps} ulp ({float(slack[worst]):.1e})" if ulps else ""))
