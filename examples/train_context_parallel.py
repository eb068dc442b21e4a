"""Trains a small causal transformer for a few steps with its sequence sharded over the GPUs of a torchrun job:
PyTorch's context_parallel (round-robin load balancing, NCCL) runs the attention, and flashcute runs every attention
kernel through flashcute.torch (SDPA's flash backend). Each rank holds the whole model (replicated weights, their
gradients all-reduced) and 1/world of the sequence.

    torchrun --nproc_per_node=2 examples/train_context_parallel.py --seqlen 64k --steps 5

Prints the loss and tokens/s per step (rank 0).
"""
import argparse
import os
import sys
import time

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python")]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor.experimental import context_parallel  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import flashcute.torch  # noqa: E402


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):  # x (batch, seq, width)
        b, s, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, heads, s, head_dim): context_parallel's
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, w))
        return x + self.mlp(self.norm2(x))


class Model(nn.Module):
    def __init__(self, vocab, width, heads, layers):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def tokens_of(text):
    text = str(text).lower()
    return int(text[:-1]) * 1024 if text.endswith("k") else int(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqlen", default="64k")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=4096)
    args = ap.parse_args()

    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    world, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cuda", (world,))
    torch.manual_seed(0)  # the same weights and data on every rank
    model = Model(args.vocab, args.width, args.heads, args.layers).cuda().to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    seqlen = tokens_of(args.seqlen)
    data = torch.randint(0, args.vocab, (1, seqlen + 1), device="cuda")

    flashcute.torch.activate()
    for step in range(args.steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        inputs, labels = data[:, :-1].clone(), data[:, 1:].clone()
        # context_parallel shards inputs and labels along the sequence in place (round-robin chunks, which balance
        # the causal work) and every SDPA inside runs ring attention over the mesh.
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION), context_parallel(mesh, buffers=[inputs, labels],
                                                                        buffer_seq_dims=[1, 1]):
            logits = model(inputs)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
            loss.backward()
        for p in model.parameters():  # replicated weights: average the gradients of the shards
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dist.all_reduce(loss.detach(), op=dist.ReduceOp.AVG)
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        if rank == 0:
            print(f"step {step}: loss {loss.item():.4f}, {seqlen / elapsed:,.0f} tokens/s on {world} GPU(s)",
                  flush=True)
    flashcute.torch.deactivate()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
