# Varlen calls for compute-sanitizer: tails past the last sequence, seqused_q / seqused_k, GQA, strided out= buffers.
import itertools, torch, flashcute
from flashcute import flash_attn_varlen_func
torch.manual_seed(0)
for hd, used in ((64, False), (128, True), (256, True)):
    lens_q, lens_k = [5, 0, 130, 17], [7, 3, 150, 20]
    tq, tk = sum(lens_q) + 11, sum(lens_k) + 9
    q = torch.randn(tq, 4, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(tk, 2, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    cu_q = torch.tensor([0, *itertools.accumulate(lens_q)], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, *itertools.accumulate(lens_k)], dtype=torch.int32, device="cuda")
    kw = dict(max_seqlen_q=130, max_seqlen_k=150, causal=True)
    if used:
        kw.update(seqused_q=torch.tensor([3, 0, 100, 17], dtype=torch.int32, device="cuda"),
                  seqused_k=torch.tensor([7, 1, 150, 5], dtype=torch.int32, device="cuda"))
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, **kw)
    g = torch.autograd.grad((out, lse), (q, k, v), (torch.randn_like(out), torch.randn_like(lse)))
    big = torch.empty(tq, 4, 2 * hd, device="cuda", dtype=torch.bfloat16)[:, :, :hd]  # strided rows
    with torch.no_grad():
        flash_attn_varlen_func(q, k, v, cu_q, cu_k, out=big, **kw)
    torch.cuda.synchronize()
    assert torch.equal(big, out)
print("memv done")
