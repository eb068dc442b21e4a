"""The reference smoke test through flashcute.flash_attn_func, on the GPU if there is one, else on the CPU."""
import time

import torch

import flashcute

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
q, k, v = (torch.randn(1, 128, 2, 64, device=device, dtype=torch.float16, requires_grad=True) for _ in range(3))
start = time.perf_counter()
out, lse = flashcute.flash_attn_func(q, k, v, causal=True)
(out.float().square().mean() + 1e-3 * lse.float().square().mean()).backward()
if device == "cuda":
    torch.cuda.synchronize()
elapsed = time.perf_counter() - start

# Check against float64 attention computed by PyTorch (bottom-right causal, Sq == Sk here).
q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
s = torch.einsum("bqhd,bkhd->bhqk", q64, k64) / 8.0
s = s.masked_fill(torch.ones(128, 128, dtype=torch.bool, device=device).triu(1), float("-inf"))
lse64 = torch.logsumexp(s, dim=-1)
out64 = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v64)
(out64.square().mean() + 1e-3 * lse64.square().mean()).backward()
errs = {
    "out": (out.double() - out64).abs().max().item(),
    "lse": (lse.double() - lse64).abs().max().item(),
    "dq": (q.grad.double() - q64.grad).abs().max().item(),
    "dk": (k.grad.double() - k64.grad).abs().max().item(),
    "dv": (v.grad.double() - v64.grad).abs().max().item(),
}
where = "GPU " + torch.cuda.get_device_name() if device == "cuda" else "CPU (float64 reference path)"
print(f"smoke test on {where}: forward+backward {elapsed * 1e3:.1f} ms; max abs error vs float64: " +
      ", ".join(f"{k} {v:.2e}" for k, v in errs.items()))
bad = [k for k, v in errs.items() if not v < 5e-3]
if bad:
    raise SystemExit(f"smoke test FAILED: {bad}")
print("smoke test passed")
