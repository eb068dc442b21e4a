"""Decode benchmark (issue #17): a few query rows per sequence against a long KV cache, contiguous or paged,
flashcute's flash_attn_with_kvcache beside PyTorch SDPA (the backend torch picks, GQA through enable_gqa, on the
contiguous cache) in one process. Decode is bound by reading the cache, so the figure of merit is bandwidth: the K
and V bytes of every used cache row over the call's time, as a share of the device copy ceiling measured in the
same run (bytes read + written per second of a large device-to-device copy).

    python bench/decode.py                      # H = 32, Hkv = 8, hd128, bf16, the issue's grid
    python bench/decode.py --batch 1,8 --cache 4k,32k --page 0,64 --dry-run
    python bench/decode.py --prefill --batch 1 --cache 8k --page 0,64,256   # paged prefill against the forward

SDPA's row uses is_causal=False: with one query row that is the same attention; with four it attends to up to
three more keys than the bottom-right causal mask flashcute applies (a negligible difference in bytes).

Both are timed as serving stacks run decode, captured once in a CUDA graph and replayed (the bandwidth columns);
flashcute's eager time (one call from Python, its host work included) is shown beside it. FlashAttention-4 joins
where it imports (PYTHONPATH from ../shared/peers/fa4), on the same cache, contiguous or paged."""
import argparse
import contextlib
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _p in (os.path.join(ROOT, "python"), ROOT):
    if _p not in sys.path:
        sys.path.insert(0, _p)


def sizes(text):
    """'4k,128k,300' -> [4096, 131072, 300]."""
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        out.append(int(part[:-1]) * 1024 if part.endswith("k") else int(part))
    return out


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", default="1,8,64")
    ap.add_argument("--sq", default="1,4", help="query rows per sequence")
    ap.add_argument("--cache", default="4k,32k,128k", help="cache rows per sequence (all used)")
    ap.add_argument("--page", default="0,16,64,256", help="page sizes; 0: a contiguous cache")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--heads-kv", type=int, default=8)
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--max-gib", type=float, default=40.0, help="skip shapes whose cache exceeds this")
    ap.add_argument("--configs", default="",
                    help="comma list of kernel configs to time flashcute with (FLASHCUTE_CONFIG; empty: dispatch's "
                         "choice), e.g. ,sm90_fwd_bf16_hd128_m64n128w4 for the default and the decode candidate")
    ap.add_argument("--splits", default="0",
                    help="comma list of num_splits to time flashcute with (0: the library's choice), e.g. 0,8,16,33")
    ap.add_argument("--target-s", type=float, default=0.2)
    ap.add_argument("--prefill", action="store_true",
                    help="instead: sq = cache rows (causal prefill against the cache), each layout's time against "
                         "flash_attn_func on the same contiguous keys (the issue's 5%% bound for paged prefill)")
    ap.add_argument("--dry-run", action="store_true", help="print the grid and exit (no GPU needed)")
    return ap.parse_args(argv)


def grid(args):
    cases = []
    for b in sizes(args.batch):
        for n in sizes(args.cache):
            cache_bytes = 2 * b * n * args.heads_kv * args.hdim * 2  # K and V, 16-bit
            if cache_bytes > args.max_gib * 2**30:
                continue
            for sq in sizes(args.sq):
                for page in sizes(args.page):
                    if page and n % page:
                        continue
                    cases.append((b, sq, n, page, cache_bytes))
    return cases


@contextlib.contextmanager
def forced_config(name):
    """FLASHCUTE_CONFIG=name inside (nothing for an empty name)."""
    old = os.environ.get("FLASHCUTE_CONFIG")
    if name:
        os.environ["FLASHCUTE_CONFIG"] = name
    try:
        yield
    finally:
        if name:
            os.environ.pop("FLASHCUTE_CONFIG")
            if old is not None:
                os.environ["FLASHCUTE_CONFIG"] = old


def shuffled_pages(torch, kc, vc, page, gen):
    """The cache kc, vc (batch, rows, Hkv, D) as pages of `page` rows in shuffled order: (k pages, v pages, page
    table); page 0: the contiguous cache itself and no table."""
    if not page:
        return kc, vc, None
    b, n = kc.shape[:2]
    per = n // page
    perm = torch.randperm(b * per, device=kc.device, generator=gen)
    pages = []
    for c in (kc, vc):
        t = torch.empty(b * per, page, *c.shape[2:], device=c.device, dtype=c.dtype)
        t[perm] = c.reshape(b * per, page, *c.shape[2:])
        pages.append(t)
    return pages[0], pages[1], perm.view(b, per).to(torch.int32)


def graphed(fn):
    """fn captured in a CUDA graph (after warm-up on a side stream, as torch.cuda.graphs asks); returns replay."""
    import torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def load_fa4():
    """FlashAttention-4's varlen entry (paged caches through page_table), or None where it does not import."""
    try:
        from flash_attn.cute.interface import flash_attn_varlen_func
    except Exception:  # not installed, or no build for this GPU
        return None
    return flash_attn_varlen_func


def fa4_ms(fa4, q, k, v, lengths, table, target_s):
    """FA4 on the same cache (its own split and GQA choices), graph-replayed; nan where it refuses the shape."""
    import torch
    from bench.timing import cuda_time
    if fa4 is None:
        return float("nan")
    try:
        replay = graphed(lambda: fa4(q, k, v, seqused_k=lengths, page_table=table, causal=True))
        return cuda_time(lambda i: replay(), target_s=target_s).median_ms
    except Exception as e:  # noqa: BLE001 (an unsupported shape or feature on this GPU)
        print(f"  fa4: {str(e).splitlines()[0][:100] if str(e) else type(e).__name__}")
        torch.cuda.synchronize()
        return float("nan")


def prefill(args, flashcute, torch, cuda_time):
    """Causal prefill of n rows against a cache of those n rows: flash_attn_with_kvcache (contiguous, then each page
    size) against flash_attn_func on the same keys, graph-replayed."""
    print(f"{'batch':>5} {'rows':>7} {'page':>5} | {'kvcache ms':>10} {'TFLOP/s':>8} | {'func ms':>8} | "
          f"{'kvcache/func':>12}")
    dt = torch.bfloat16
    for b in sizes(args.batch):
        for n in sizes(args.cache):
            gen = torch.Generator(device="cuda").manual_seed(0)
            q = torch.randn(b, n, args.heads, args.hdim, device="cuda", dtype=dt, generator=gen)
            kc, vc = (torch.randn(b, n, args.heads_kv, args.hdim, device="cuda", dtype=dt, generator=gen)
                      for _ in range(2))
            lengths = torch.full((b,), n, dtype=torch.int32, device="cuda")
            replay = graphed(lambda: flashcute.flash_attn_func(q, kc, vc, causal=True))
            f_ms = cuda_time(lambda i: replay(), target_s=args.target_s).median_ms
            flops = 4 * b * args.heads * n * n * args.hdim / 2
            for page in sizes(args.page):
                ck, cv, table = shuffled_pages(torch, kc, vc, page, gen)
                replay = graphed(lambda: flashcute.flash_attn_with_kvcache(q, ck, cv, cache_seqlens=lengths,
                                                                           page_table=table, causal=True))
                t = cuda_time(lambda i: replay(), target_s=args.target_s).median_ms
                print(f"{b:>5} {n:>7} {page or '-':>5} | {t:>10.3f} {flops / (t * 1e9):>8.1f} | {f_ms:>8.3f} | "
                      f"{t / f_ms:>12.3f}", flush=True)
                replay = None
            torch.cuda.empty_cache()
    return 0


def main(argv=None):
    args = parse(argv)
    cases = grid(args)
    if args.dry_run:
        print(f"{len(cases)} shapes (batch, sq, cache rows, page size; H {args.heads}/{args.heads_kv}, "
              f"hd{args.hdim}):")
        for c in cases:
            print("  ", c[:4])
        return 0
    import torch
    import torch.nn.functional as F
    import flashcute
    from bench.ceilings import copy_gbps
    from bench.timing import cuda_time

    if not torch.cuda.is_available():
        print("no CUDA GPU found; --dry-run shows the grid without one", file=sys.stderr)
        return 2
    if args.prefill:
        return prefill(args, flashcute, torch, cuda_time)
    copy = copy_gbps()
    print(f"{torch.cuda.get_device_name()}: copy ceiling {copy:.0f} GB/s (read + write); bf16, H {args.heads}/"
          f"{args.heads_kv}, hd{args.hdim}, every cache row used, causal")
    fa4 = load_fa4()
    print(f"{'batch':>5} {'sq':>3} {'cache':>7} {'page':>5} | {'eager ms':>8} | {'flashcute ms':>12} {'GB/s':>6} "
          f"{'%copy':>6} | {'sdpa ms':>8} {'GB/s':>6} {'%copy':>6} | {'fc/sdpa':>7}"
          + (f" | {'fa4 ms':>8} {'%copy':>6} {'fc/fa4':>6}" if fa4 else "") + "   (graph replays)")
    dt = torch.bfloat16
    groups = {}
    for b, sq, n, page, nbytes in cases:
        groups.setdefault((b, sq, n, nbytes), []).append(page)
    for (b, sq, n, nbytes), pages in groups.items():
        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(b, sq, args.heads, args.hdim, device="cuda", dtype=dt, generator=gen)
        kc, vc = (torch.randn(b, n, args.heads_kv, args.hdim, device="cuda", dtype=dt, generator=gen)
                  for _ in range(2))
        lengths = torch.full((b,), n, dtype=torch.int32, device="cuda")
        qt, kt, vt = q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)
        try:
            replay = graphed(lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True))
            s_ms = cuda_time(lambda i: replay(), target_s=args.target_s).median_ms
        except RuntimeError as e:  # out of memory, or no backend for the shape
            print(f"  sdpa: {str(e).splitlines()[0]}")
            s_ms = float("nan")
        for page in pages:
            ck, cv, table = shuffled_pages(torch, kc, vc, page, gen)
            f_ms = fa4_ms(fa4, q, ck, cv, lengths, table, args.target_s)
            for config, splits in ((c, int(n)) for c in args.configs.split(",") for n in args.splits.split(",")):
                call = (lambda: flashcute.flash_attn_with_kvcache(q, ck, cv, cache_seqlens=lengths, page_table=table,
                                                                  causal=True, num_splits=splits))
                # FLASHCUTE_CONFIG, read by the library at each call
                with forced_config(config):
                    eager = cuda_time(lambda i: call(), target_s=args.target_s).median_ms
                    replay = graphed(call)
                    t = cuda_time(lambda i: replay(), target_s=args.target_s)
                    replay = None
                fc_gbs, s_gbs = nbytes / (t.median_ms * 1e6), nbytes / (s_ms * 1e6)
                fa4_cols = (f" | {f_ms:>8.3f} {nbytes / (f_ms * 1e6) / copy:>6.0%} {f_ms / t.median_ms:>6.2f}"
                            if fa4 else "")
                print(f"{b:>5} {sq:>3} {n:>7} {page or '-':>5} | {eager:>8.3f} | {t.median_ms:>12.3f} "
                      f"{fc_gbs:>6.0f} {fc_gbs / copy:>6.0%} | {s_ms:>8.3f} {s_gbs:>6.0f} {s_gbs / copy:>6.0%} | "
                      f"{s_ms / t.median_ms:>7.2f}{fa4_cols}" + (f"  {config}" if config else "")
                      + (f"  splits {splits}" if splits else ""), flush=True)
            ck = cv = None  # freed before the next layout is built
            torch.cuda.empty_cache()
        q = kc = vc = qt = kt = vt = None
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
