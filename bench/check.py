"""The float32 reference a result is checked against, and the error measure. torch is imported inside.

The reference is plain PyTorch math (scores, mask, softmax, autograd), computed in blocks of heads and query
rows so that a 16k × 16k score matrix never has to exist whole."""


def _visible(rows, sq, sk, causal, device):
    import torch
    i = torch.arange(rows.start, rows.stop, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    return j <= i + (sk - sq) if causal else None


def reference(q, k, v, causal=False, dout=None, scale=None, max_elems=2**26):
    """out (and dq, dk, dv when dout is given) in float32 for q (B, Sq, H, D), k/v (B, Sk, H, D/Dv).
    Rows with no visible key give out = 0 and no gradient. Returns (out, grads or None)."""
    import torch
    B, sq, H, D = q.shape
    sk, dv_dim = k.shape[1], v.shape[-1]
    scale = D ** -0.5 if scale is None else scale
    f32 = dict(dtype=torch.float32, device=q.device)
    out = torch.empty(B, sq, H, dv_dim, **f32)
    grads = None
    if dout is not None:
        grads = (torch.empty(B, sq, H, D, **f32), torch.zeros(B, sk, H, D, **f32), torch.zeros(B, sk, H, dv_dim, **f32))
    heads = max(1, min(H, max_elems // (sq * sk)))
    rows_per = max(1, min(sq, max_elems // (heads * sk)))
    with torch.enable_grad():
        for b in range(B):
            for h0 in range(0, H, heads):
                hs = slice(h0, min(H, h0 + heads))
                for r0 in range(0, sq, rows_per):
                    rows = slice(r0, min(sq, r0 + rows_per))
                    qc = q[b, rows, hs].transpose(0, 1).float().requires_grad_(dout is not None)  # (h, r, D)
                    kc = k[b, :, hs].transpose(0, 1).float().requires_grad_(dout is not None)     # (h, Sk, D)
                    vc = v[b, :, hs].transpose(0, 1).float().requires_grad_(dout is not None)     # (h, Sk, Dv)
                    s = torch.matmul(qc, kc.transpose(1, 2)) * scale
                    mask = _visible(rows, sq, sk, causal, q.device)
                    if mask is not None:
                        s = s.masked_fill(~mask, float("-inf"))
                    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
                    o = torch.matmul(p, vc)
                    out[b, rows, hs] = o.detach().transpose(0, 1)
                    if dout is not None:
                        do = dout[b, rows, hs].transpose(0, 1).float()
                        gq, gk, gv = torch.autograd.grad(o, (qc, kc, vc), do)
                        grads[0][b, rows, hs] = gq.transpose(0, 1)
                        grads[1][b, :, hs] += gk.transpose(0, 1)
                        grads[2][b, :, hs] += gv.transpose(0, 1)
    return out, grads


def rel_err(x, ref):
    """max|x - ref| / max|ref| (a NaN anywhere in x gives inf)."""
    import torch
    x = x.float()
    if not torch.isfinite(x).all():
        return float("inf")
    denom = ref.abs().max().item()
    return (x - ref).abs().max().item() / (denom if denom > 0 else 1.0)
