"""A few backward calls covering every head dim and the backward's features (causal, window, softcap, GQA, varlen
with empty sequences and rows past the last one, sinks, Sq != Sk, the deterministic mode, a loss on lse), small
enough to run under compute-sanitizer:

  compute-sanitizer --tool racecheck python3 scripts/sanitize_bwd.py [head dims, default 64,96,128,192,256]

A head dim DvE (e.g. 192v128) gives V its own head dim E."""
import sys

import torch

import flashcute


def backward(out, lse):
    (out.float().square().sum() + lse.float().masked_fill(lse.isinf(), 0).square().sum()).backward()


def main():
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    dims = sys.argv[1].split(",") if len(sys.argv) > 1 else ["64", "96", "128", "192", "256"]
    for text in dims:
        hd, _, dv = text.partition("v")
        hd, dv = int(hd), int(dv or hd)

        def leaf(*shape):
            return torch.randn(*shape, device=dev, dtype=dt).requires_grad_()
        q, k, v = leaf(2, 300, 4, hd), leaf(2, 200, 2, hd), leaf(2, 200, 2, dv)
        backward(*flashcute.flash_attn_func(q, k, v, causal=True))
        backward(*flashcute.flash_attn_func(q, k, v, window_size=(40, -7), softcap=5.0, deterministic=True))
        q1, k1, v1 = leaf(1, 113, 4, hd), leaf(1, 1013, 4, hd), leaf(1, 1013, 4, dv)
        backward(*flashcute.flash_attn_func(q1, k1, v1, causal=True, deterministic=True))
        cu_q = torch.tensor([0, 70, 70, 300], dtype=torch.int32, device=dev)
        cu_k = torch.tensor([0, 1, 18, 200], dtype=torch.int32, device=dev)
        qv, kv, vv = leaf(300, 4, hd), leaf(200, 2, hd), leaf(200, 2, dv)
        backward(*flashcute.flash_attn_varlen_func(qv, kv, vv, cu_q, cu_k, causal=True, max_seqlen_q=230,
                                                   max_seqlen_k=182, learnable_sink=torch.randn(4, device=dev)))
        # Rows past the last sequence (the Hopper kernels' TMA copies read into them), deterministic turns.
        cu_q, cu_k = (torch.tensor(c, dtype=torch.int32, device=dev) for c in ([0, 130, 250], [0, 64, 170]))
        backward(*flashcute.flash_attn_varlen_func(qv, kv, vv, cu_q, cu_k, max_seqlen_q=130, max_seqlen_k=106,
                                                   deterministic=True))
    torch.cuda.synchronize()
    print("sanitize_bwd: done")


if __name__ == "__main__":
    main()
