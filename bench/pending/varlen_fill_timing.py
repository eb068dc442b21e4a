# Varlen forward / backward time of the library and Python found on the path (one side of an A/B).
import itertools, sys, torch, flashcute
from flashcute import flash_attn_varlen_func
def t(fn, n=40):
    for _ in range(5): fn()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for a, b in ev:
        a.record(); fn(); b.record()
    torch.cuda.synchronize()
    return sorted(a.elapsed_time(b) for a, b in ev)[n // 2]
torch.manual_seed(0)
mixed = [5000, 300, 2048, 1500, 3100, 777, 2200, 1459]
res = {}
for hd in (64, 128):
    h = 2048 // hd
    for causal in (False, True):
        for name, lens, tail in (("16x1k", [1024] * 16, 0), ("4x4k", [4096] * 4, 0), ("mixed", mixed, 0),
                                 ("16x1k+4k tail", [1024] * 16, 4096), ("64x128", [128] * 64, 0)):
            tot, mx = sum(lens) + tail, max(lens)
            q, k, v = (torch.randn(tot, h, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
            do = torch.randn(tot, h, hd, device="cuda", dtype=torch.bfloat16)
            cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device="cuda")
            call = lambda: flash_attn_varlen_func(q, k, v, cu, cu, max_seqlen_q=mx, max_seqlen_k=mx, causal=causal)
            out = call()[0]
            f = t(call)
            b = t(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True))
            print(f"hd{hd} causal={int(causal)} {name}: fwd {f:.4f} bwd {b:.4f}", flush=True)
