"""One flashcute forward + backward and one peer's (SDPA's FlashAttention-2 backend, or FlashAttention-4 with
--peer fa4) on the same inputs, twice, for a profiler to compare the kernels side by side. Not a benchmark
(bench/run.py is).

  ncu --clock-control none -k regex:"bwd_kernel|flash_bwd_dq" --launch-skip 2 -c 2 \\
      --metrics lts__t_requests_op_red.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum \\
      python3 bench/ncu_pair.py --hdim 128 --seqlen 8k --causal
  ncu --clock-control none -k regex:"fwd_kernel|Flash" --set full -o fwd_pair \\
      python3 bench/ncu_pair.py --hdim 128 --seqlen 16k --peer fa4 --fwd-only
"""
import argparse
import os
import sys

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python")]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--seqlen", default="8k", help="e.g. 512, 2k, 8k")
    ap.add_argument("--tokens", type=int, default=16384, help="batch = tokens // seqlen")
    ap.add_argument("--width", type=int, default=2048, help="nheads = width // hdim")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--peer", default="fa2", choices=("fa2", "fa4"),
                    help="fa4 needs flash_attn.cute importable (../shared/peers/fa4/README.md)")
    ap.add_argument("--fwd-only", action="store_true", help="forwards only")
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import flashcute

    s = int(args.seqlen[:-1]) * 1024 if args.seqlen.endswith("k") else int(args.seqlen)
    shape = (max(1, args.tokens // s), s, args.width // args.hdim, args.hdim)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
    def peer():
        if args.peer == "fa4":
            from flash_attn.cute.interface import flash_attn_func
            return flash_attn_func(q, k, v, causal=args.causal)[0]
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=args.causal)

    for _ in range(2):
        with torch.set_grad_enabled(not args.fwd_only):
            out, _ = flashcute.flash_attn_func(q, k, v, causal=args.causal)
            if not args.fwd_only:
                out.backward(torch.randn_like(out))
            ref = peer()
            if not args.fwd_only:
                ref.backward(torch.randn_like(ref))
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
