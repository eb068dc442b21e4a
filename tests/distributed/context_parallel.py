"""Context parallelism over flashcute: PyTorch's context_parallel shards one causal attention layer's sequence over
the GPUs of a torchrun job (NCCL, round-robin load balancing), with flashcute serving SDPA's flash backend through
flashcute.torch. Checks out and dq, dk, dv against a float64 reference (the 2x same-dtype error rule, on a sequence
short enough for that reference), then times forward + backward on a long sequence: flashcute through the provider,
and SDPA's cuDNN backend without it, each on one GPU and on all of them.

    torchrun --nproc_per_node=2 tests/distributed/context_parallel.py              # 64k tokens
    torchrun --nproc_per_node=1 tests/distributed/context_parallel.py --seqlen 16k # one GPU: the code path only

Exits non-zero when a check fails. Needs CUDA and NCCL; GPU-free runs have nothing to do here.
"""
import argparse
import contextlib
import os
import sys

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor.experimental import context_parallel  # noqa: E402
from torch.distributed.tensor.experimental._attention import context_parallel_unshard  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import flashcute.torch as provider  # noqa: E402

BACKENDS = {"flashcute": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def tokens(text):
    text = str(text).lower()
    return int(text[:-1]) * 1024 if text.endswith("k") else int(text)


def inputs(seqlen, heads, head_dim, dtype):
    """q, k, v, dout (1, H, S, D), the same on every rank."""
    g = torch.Generator(device="cuda").manual_seed(seqlen)
    return [torch.randn(1, heads, seqlen, head_dim, device="cuda", dtype=dtype, generator=g) for _ in range(4)]


def attention(backend, q, k, v, dout, mesh=None):
    """out, dq, dk, dv of causal SDPA on one backend; sharded over mesh's ranks when mesh is given."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    dout = dout.clone()
    with sdpa_kernel(BACKENDS[backend]), (provider.enabled() if backend == "flashcute" else contextlib.nullcontext()):
        if mesh is None:
            out = F.scaled_dot_product_attention(*leaves, is_causal=True)
            out.backward(dout)
            return [out.detach()] + [t.grad for t in leaves]
        # The shards replace the buffers' storage in place, which PyTorch refuses for tensors that require grad:
        # they become leaves inside the context.
        buffers = [t.detach().clone() for t in (q, k, v)] + [dout]
        with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2] * 4, no_restore_buffers=set(buffers)):
            leaves = [t.requires_grad_() for t in buffers[:3]]
            out = F.scaled_dot_product_attention(*leaves, is_causal=True)
            out.backward(buffers[3])
        return list(context_parallel_unshard(mesh, [out.detach()] + [t.grad for t in leaves], [2] * 4))


def reference(q, k, v, dout):
    """float64 causal attention and its gradients (plain PyTorch math)."""
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    s = leaves[0] @ leaves[1].transpose(-1, -2) / q.shape[-1] ** 0.5
    s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    out = s.softmax(-1) @ leaves[2]
    out.backward(dout.double())
    return [out.detach()] + [t.grad for t in leaves]


def plain(q, k, v, dout):
    """The same in q's dtype: the error budget (DESIGN.md's rule)."""
    with sdpa_kernel(SDPBackend.MATH):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*leaves, is_causal=True)
        out.backward(dout)
    return [out.detach()] + [t.grad for t in leaves]


def check(mesh, args, dtype):
    q, k, v, dout = inputs(tokens(args.check_seqlen), args.heads, args.head_dim, dtype)
    ref, base = reference(q, k, v, dout), plain(q, k, v, dout)
    got = attention("flashcute", q, k, v, dout, mesh)
    ok = True
    for name, g, r, b in zip(("out", "dq", "dk", "dv"), got, ref, base):
        err, budget = (g.double() - r).abs().max().item(), (b.double() - r).abs().max().item()
        good = err <= 2 * budget + 1e-3 * r.abs().max().item()
        ok &= good
        say(f"check {name}: max error {err:.3e}, plain PyTorch {budget:.3e} -> {'ok' if good else 'FAILED'}")
    return ok


def timed(fn, reps):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    t = torch.tensor(sorted(times)[len(times) // 2], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank's median
    return t.item()


def say(text):
    if dist.get_rank() == 0:
        print(text, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqlen", default="64k", help="timed sequence length")
    ap.add_argument("--check-seqlen", default="4k", help="sequence checked against the float64 reference")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()

    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    world = dist.get_world_size()
    mesh = init_device_mesh("cuda", (world,))
    dtype = torch.bfloat16
    ok = check(mesh, args, dtype)

    seqlen = tokens(args.seqlen)
    q, k, v, dout = inputs(seqlen, args.heads, args.head_dim, dtype)
    say(f"causal attention, 1 x {args.heads} heads x {seqlen} tokens x hd{args.head_dim}, bf16, forward + backward, "
        f"{world} GPU(s), median of {args.reps}")
    for backend in BACKENDS:
        one = timed(lambda: attention(backend, q, k, v, dout), args.reps)  # every rank alone
        many = timed(lambda: attention(backend, q, k, v, dout, mesh), args.reps)
        say(f"{backend:>9}: 1 GPU {one:8.2f} ms ({seqlen / one * 1e3:10.0f} tokens/s), {world} GPU(s) {many:8.2f} ms "
            f"({seqlen / many * 1e3:10.0f} tokens/s), scaling {one / many:.2f}x")
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
