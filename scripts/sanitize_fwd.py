"""A few forward calls covering every head dim and the forward's features (causal, window, softcap, GQA, varlen with
empty sequences, sinks, Sq != Sk), small enough to run under compute-sanitizer:

  FLASHCUTE_FWD_GRID=2 compute-sanitizer --tool racecheck python3 scripts/sanitize_fwd.py

(FLASHCUTE_FWD_GRID=2: two persistent CTAs walk every tile, so the tile and K/V rings wrap many times.)"""
import torch

import flashcute


def main():
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    for hd in (64, 96, 128, 192, 256):
        q = torch.randn(2, 300, 4, hd, device=dev, dtype=dt)
        k = torch.randn(2, 200, 2, hd, device=dev, dtype=dt)
        v = torch.randn(2, 200, 2, hd, device=dev, dtype=dt)
        flashcute.flash_attn_func(q, k, v, causal=True)
        flashcute.flash_attn_func(q, k, v, window_size=(40, -7), softcap=5.0)
        lens_q, lens_k = [70, 0, 230], [1, 17, 182]
        cu_q = torch.tensor([0, 70, 70, 300], dtype=torch.int32, device=dev)
        cu_k = torch.tensor([0, 1, 18, 200], dtype=torch.int32, device=dev)
        flashcute.flash_attn_varlen_func(q.view(-1, 4, hd)[:300], k.view(-1, 2, hd)[:200], v.view(-1, 2, hd)[:200],
                                         cu_q, cu_k, causal=True, max_seqlen_q=max(lens_q),
                                         max_seqlen_k=max(lens_k), learnable_sink=torch.randn(4, device=dev))
    torch.cuda.synchronize()
    print("sanitize_fwd: done")


if __name__ == "__main__":
    main()
